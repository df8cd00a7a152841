// Flow control's cost in processing (issue 26, item 9): the process.c10 run
// of idemq with no limit, and with a global concurrency limit that never
// binds (1000 on the task, beside a worker of concurrency 10), in one run so
// their ratio is read on one machine state. bench/FINDINGS.md, "Flow control:
// what a limited claim costs", says what the limited claim pays and why.
import { performance } from "node:perf_hooks";
import * as sql from "../../dist/sql/index.js"; // the compiled package, as bench/systems/idemq.ts
import { median } from "../measure.ts";
import { NOOP_TASK } from "../systems/types.ts";
import { variant, type Context, type FreshDatabase, type Metrics, type Variant, type Workload } from "./common.ts";
import { runProcessing } from "./process.ts";

// process.keys: concurrency keys (issue 26, items 3 and 9). ctx.sizes.process
// no-op jobs, in idemq:nokeys without a key, in idemq:keys in keys of
// JOBS_PER_KEY jobs each (K = 1: a key's jobs run one after another), and in
// idemq:keys-beside-busy the same keyed jobs while ctx.sizes.otherBacklog
// jobs of one busy key wait behind its one admitted job, which a holder
// keeps processing (claimed with a long lease, never completed), so nothing
// of the backlog can run. After each run the bench times ctx.sizes.claimProbes
// claims of 10 of the task in any queue, as a worker makes them, which must
// find nothing: the backlog waits outside claim()'s index.
const JOBS_PER_KEY = 20;
const KEYS_QUEUE = "keys-work";
const BUSY_QUEUE = "keys-busy";
// enqueue_many's default jobs_per_call is 50,000.
const CHUNK = 20_000;

async function enqueueKeyed(db: FreshDatabase, queue: string, count: number, key: (i: number) => string | undefined): Promise<void> {
  for (let start = 0; start < count; start += CHUNK) {
    const n = Math.min(CHUNK, count - start);
    await sql.enqueueMany(
      db.client,
      Array.from({ length: n }, (_, k) => ({ task: NOOP_TASK, queue, payload: { i: start + k }, concurrencyKey: key(start + k) })),
    );
  }
}

type Keying = "nokeys" | "keys" | "keys-beside-busy";

async function seedKeys(ctx: Context, db: FreshDatabase, keying: Keying): Promise<void> {
  if (keying === "keys-beside-busy") {
    await enqueueKeyed(db, BUSY_QUEUE, ctx.sizes.otherBacklog, () => "busy");
    const held = await sql.claim(db.client, { workerId: "bench-holder", queues: [BUSY_QUEUE], tasks: [NOOP_TASK], batchSize: 10, lease: "1 day" });
    if (held.length !== 1) throw new Error(`the busy key admitted ${held.length} jobs, not 1`);
  }
  // Job i of key floor(i / JOBS_PER_KEY): each key's jobs enqueued in its order.
  await enqueueKeyed(db, KEYS_QUEUE, ctx.sizes.process, (i) => (keying === "nokeys" ? undefined : `k${Math.floor(i / JOBS_PER_KEY)}`));
}

async function emptyClaimMs(ctx: Context, db: FreshDatabase): Promise<Metrics> {
  const ms: number[] = [];
  for (let i = 0; i < ctx.sizes.claimProbes; i++) {
    const t0 = performance.now();
    const got = await sql.claim(db.client, { workerId: "bench-probe", tasks: [NOOP_TASK], batchSize: 10 });
    ms.push(performance.now() - t0);
    if (got.length > 0) throw new Error(`a claim beside the waiting backlog returned ${got.length} jobs`);
  }
  return { claim_empty_ms: median(ms) };
}

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
  {
    id: "process.keys",
    title: `processing, no-op handlers, concurrency 10: no keys, keys of ${JOBS_PER_KEY} jobs (K = 1), and those keys beside one key whose backlog waits`,
    concurrency: 10,
    variants: [variant("idemq", "batched", "idemq:nokeys"), variant("idemq", "batched", "idemq:keys"), variant("idemq", "batched", "idemq:keys-beside-busy")],
    subject: "idemq:keys",
    primary: "jobs_per_s",
    higherIsBetter: true,
    run(ctx, v, round) {
      const keying = v.label.slice("idemq:".length) as Keying;
      return runProcessing(ctx, v, round, {
        concurrency: 10,
        task: NOOP_TASK,
        queues: [KEYS_QUEUE],
        seed: (db) => seedKeys(ctx, db, keying),
        after: (db) => emptyClaimMs(ctx, db),
      });
    },
  },
];
