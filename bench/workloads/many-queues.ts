// process.many-queues (issue 15): does a busy queue slow the workers of the
// other queues? One idemq worker (batched, concurrency 10) limited to its own
// queue of ctx.sizes.process jobs, with 49 other queues: in idemq:crowded one
// of them holds ctx.sizes.otherBacklog runnable jobs and the other 48 ten
// each; in idemq:alone they are empty. Same task (no-op) everywhere, so only
// the queue filter keeps the backlog out of the worker's claims. The task
// filter gets the same test in idemq:crowded-task: the backlog is in the
// worker's own queue, of a task the worker does not have.
//
// After each run, with the worker's queue drained (and the backlog still
// there in idemq:crowded), the bench times ctx.sizes.claimProbes claims of
// 10 on an empty queue, as the worker makes them (queues and tasks given),
// and as many filtered by a task no job has (queues NULL): the median ms of
// each is reported. A claim has to read none of the backlog for either.
//
// Idemq only: Graphile Worker's named queues run their jobs one at a time
// (a queue is a serialisation lock, not a worker filter), and its workers
// cannot be limited to some queues; pg-boss's workers are per queue (one
// partition each), so a busy queue does not reach another queue's fetch by
// design. Neither gives the same-worker comparison this row makes.

import { performance } from "node:perf_hooks";
import * as sql from "../../dist/sql/index.js"; // the compiled package, as bench/systems/idemq.ts
import { median } from "../measure.ts";
import { NOOP_TASK } from "../systems/types.ts";
import { variant, type Context, type FreshDatabase, type Metrics, type Workload } from "./common.ts";
import { runProcessing } from "./process.ts";

const CONCURRENCY = 10;
const WORKER_QUEUE = "mq-worker";
const BUSY_QUEUE = "mq-busy";
const QUIET_QUEUES = Array.from({ length: 48 }, (_, i) => `mq-quiet-${i + 1}`);
const EMPTY_QUEUE = "mq-empty";
const OTHER_TASK = "mq-other-task";
// enqueue_many's default jobs_per_call is 50,000.
const CHUNK = 20_000;

async function enqueueInto(db: FreshDatabase, queue: string, count: number, task = NOOP_TASK): Promise<void> {
  for (let start = 0; start < count; start += CHUNK) {
    const n = Math.min(CHUNK, count - start);
    await sql.enqueueMany(db.client, Array.from({ length: n }, (_, k) => ({ task, queue, payload: { i: start + k } })));
  }
}

type Crowding = "alone" | "crowded" | "crowded-task";

async function seed(ctx: Context, db: FreshDatabase, crowding: Crowding): Promise<void> {
  if (crowding === "crowded") {
    await enqueueInto(db, BUSY_QUEUE, ctx.sizes.otherBacklog);
    for (const queue of QUIET_QUEUES) await enqueueInto(db, queue, 10);
  } else if (crowding === "crowded-task") {
    await enqueueInto(db, WORKER_QUEUE, ctx.sizes.otherBacklog, OTHER_TASK);
  }
  await enqueueInto(db, WORKER_QUEUE, ctx.sizes.process);
}

/** Median ms of `probes` calls of `claim` (which must find nothing). */
async function timeClaims(probes: number, claim: () => Promise<unknown[]>): Promise<number> {
  const ms: number[] = [];
  for (let i = 0; i < probes; i++) {
    const t0 = performance.now();
    const got = await claim();
    ms.push(performance.now() - t0);
    if (got.length > 0) throw new Error(`a claim on an empty queue returned ${got.length} jobs`);
  }
  return median(ms);
}

async function claimLatency(ctx: Context, db: FreshDatabase): Promise<Metrics> {
  const probes = ctx.sizes.claimProbes;
  const workerId = "bench-probe";
  return {
    claim_empty_queue_ms: await timeClaims(probes, () =>
      sql.claim(db.client, { workerId, queues: [EMPTY_QUEUE], tasks: [NOOP_TASK], batchSize: 10 }),
    ),
    claim_other_task_ms: await timeClaims(probes, () => sql.claim(db.client, { workerId, tasks: ["mq-no-such-task"], batchSize: 10 })),
  };
}

export const manyQueuesWorkload: Workload = {
  id: "process.many-queues",
  concurrency: CONCURRENCY,
  title: "a worker limited to its queue, 49 other queues empty or one of them busy, or a backlog of another task in its own queue, batched, concurrency 10",
  variants: [
    variant("idemq", "batched", "idemq:alone"),
    variant("idemq", "batched", "idemq:crowded"),
    variant("idemq", "batched", "idemq:crowded-task"),
  ],
  subject: "idemq:crowded",
  primary: "jobs_per_s",
  higherIsBetter: true,
  run(ctx, v, round) {
    const crowding = v.label.slice("idemq:".length) as Crowding;
    return runProcessing(ctx, v, round, {
      concurrency: CONCURRENCY,
      task: NOOP_TASK,
      queues: [WORKER_QUEUE],
      seed: (db) => seed(ctx, db, crowding),
      after: (db) => claimLatency(ctx, db),
    });
  },
};
