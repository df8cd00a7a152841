// Flow control's cost in processing (issue 26, item 9): the process.c10 run
// of idemq with no limit, and with a global concurrency limit that never
// binds (1000 on the task, beside a worker of concurrency 10), in one run so
// their ratio is read on one machine state. bench/FINDINGS.md, "Flow control:
// what a limited claim costs", says what the limited claim pays and why.
import { NOOP_TASK } from "../systems/types.ts";
import { variant, type Variant, type Workload } from "./common.ts";
import { runProcessing } from "./process.ts";

export const LIMIT_NONBINDING_VARIANT: Variant = {
  ...variant("idemq", "batched", "idemq:limit1000"),
  setupSql: `SELECT idemq.set_limit(task => '${NOOP_TASK}', concurrency => 1000)`,
};

export const flowWorkloads: Workload[] = [
  {
    id: "process.limit-nonbinding",
    title: "processing, no-op handlers, concurrency 10: no limit vs a non-binding concurrency limit (1000)",
    concurrency: 10,
    variants: [variant("idemq", "batched"), LIMIT_NONBINDING_VARIANT],
    primary: "jobs_per_s",
    higherIsBetter: true,
    run: (ctx, v, round) => runProcessing(ctx, v, round, { concurrency: 10, task: NOOP_TASK }),
  },
];
