// Scale rows (--scale):
// - retained: claim-and-complete throughput (batched, concurrency 10) with
//   `scaleFinished` finished jobs and `scaleKeys` idempotency keys retained,
//   against an empty table in the same round. The finished jobs are made
//   through idemq's own functions once per run, in a seeded template.
// - held xmin: the same processing while another session of the database
//   holds a transaction open for the whole run, so no dead tuple can be
//   pruned or vacuumed: the pathology of SKIP LOCKED queues. Dead tuples are
//   counted at the end of the run (pgstattuple when installed).

import { NOOP_TASK } from "../systems/types.ts";
import { variant, type Workload } from "./common.ts";
import { runProcessing } from "./process.ts";

const CONCURRENCY = 10;

export const retainedWorkload: Workload = {
  id: "scale.retained",
  concurrency: CONCURRENCY,
  title: "finished jobs and keys retained vs an empty table, batched, concurrency 10",
  variants: [variant("idemq", "batched", "idemq:empty"), variant("idemq", "batched", "idemq:retained")],
  subject: "idemq:retained",
  primary: "jobs_per_s",
  higherIsBetter: true,
  async run(ctx, v, round) {
    const template = v.label === "idemq:retained" ? await ctx.scaleTemplate("idemq") : undefined;
    return runProcessing(ctx, v, round, { concurrency: CONCURRENCY, task: NOOP_TASK, ...(template ? { template } : {}) });
  },
};

export const heldXminWorkload: Workload = {
  id: "scale.held-xmin",
  concurrency: CONCURRENCY,
  title: "a transaction held open for the whole run, batched, concurrency 10",
  variants: [
    variant("idemq", "batched", "idemq:clean"),
    variant("idemq", "batched", "idemq:held"),
    variant("graphile", "batched", "graphile:held"),
    variant("pgboss", "batched", "pgboss:held"),
    variant("raw", "batched", "raw:held"),
  ],
  subject: "idemq:held",
  primary: "jobs_per_s",
  higherIsBetter: true,
  run(ctx, v, round) {
    return runProcessing(ctx, v, round, { concurrency: CONCURRENCY, task: NOOP_TASK, holdXmin: v.label.endsWith(":held") });
  },
};

export const scaleWorkloads: Workload[] = [retainedWorkload, heldXminWorkload];
