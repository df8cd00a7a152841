// idemq: migrated with migrate.ts, enqueued through src/sql/ (enqueueMany
// in bulk, enqueue one by one), processed by the worker (createWorker) with
// its default settings: only the concurrency is set, and signal handling is
// left to the bench. Imported from dist/, the compiled package users run (the
// peers run their compiled JavaScript too); through tsx, src/ carried
// esbuild's __name wrappers, 0.7-2.9% of the worker's CPU (bench/FINDINGS.md).
// bench/launch.mjs builds dist/ before every run, so it is never stale.

import pg from "pg";
import { createWorker } from "../../dist/index.js";
import { migrate } from "../../dist/migrate.js";
import * as sql from "../../dist/sql/index.js";
import {
  EXTERNAL_STEPS_TASK,
  LEDGER_DDL,
  LEDGER_INSERT,
  LEDGER_TASK,
  NOOP_TASK,
  STEPS_PER_JOB,
  STEPS_TASK,
  type BenchPayload,
  type System,
} from "./types.ts";

/**
 * The tuned variant's fixed prefetch (claimed jobs buffered locally): 490, so
 * that concurrency + prefetch is 500 at C=10, the counterpart of Graphile's
 * localQueue.size 500. BENCH_IDEMQ_PREFETCH overrides it (a diagnostic knob).
 * The defaults variant (`idemq:defaults`) sets no prefetch: its window adapts.
 */
function tunedPrefetch(): number {
  const value = process.env.BENCH_IDEMQ_PREFETCH;
  return value ? Number(value) : 490;
}

/**
 * What the handlers of the durable-step tasks do, for the settings line of
 * the variants that run them (process.steps): the handlers are below, in
 * startWorker.
 */
const STEP_TASK_SETTINGS: Record<string, string> = {
  [STEPS_TASK]: `task of ${STEPS_PER_JOB} transactional ctx.step calls with no-op fns (each: BEGIN, fn, step_record, COMMIT on a pool connection)`,
  [EXTERNAL_STEPS_TASK]:
    `task of ${STEPS_PER_JOB} external ctx.step calls ({ external: true }) with no-op fns (each: effect_claim, fn(key), effect_done, ` +
    `step_record, three single-statement transactions on the pool)`,
};

export const idemq: System = {
  name: "idemq",
  // One worker: the same run answers the "fastest settings" and "per-job default" rows.
  modes: ["batched", "transactional"],
  tables: ["idemq.jobs", "idemq.keys", "idemq.processed"],

  settings(mode, concurrency, defaults, task) {
    const tasks =
      task !== undefined && STEP_TASK_SETTINGS[task] !== undefined
        ? STEP_TASK_SETTINGS[task]
        : mode === "transactional"
          ? `task { transactional: true, guardKey: p => "ledger:" + p.i } (guard + ledger insert + complete in one transaction)`
          : "no-op task";
    if (defaults) return `createWorker({ concurrency: ${concurrency} }) defaults otherwise (adaptive prefetch), ${tasks}`;
    const knob = process.env.BENCH_IDEMQ_PREFETCH ? " (BENCH_IDEMQ_PREFETCH)" : "";
    return `createWorker({ concurrency: ${concurrency}, prefetch: ${tunedPrefetch()}${knob} }) defaults otherwise, ${tasks}`;
  },

  async setup(url) {
    await migrate({ connectionString: url });
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    await client.query(LEDGER_DDL);
    await client.end();
  },

  async producer(url, options) {
    const pool = new pg.Pool({ connectionString: url, max: options.connections });
    pool.on("error", () => {});
    return {
      async enqueueBulk(jobs) {
        await sql.enqueueMany(
          pool,
          jobs.map((j) => ({ task: j.task, payload: j.payload, ...(j.key ? { idempotencyKey: j.key } : {}) })),
        );
      },
      async enqueueOne(job) {
        await sql.enqueue(pool, job.task, job.payload, job.key ? { idempotencyKey: job.key } : {});
      },
      close: () => pool.end(),
    };
  },

  // Counted through the partial indexes (jobs_runnable_by_task_queue,
  // jobs_leases): with the scale row's 1,000,000 finished jobs, "state IN
  // (every active state)" was a parallel sequential scan (~125 ms on three
  // processes), polled every 2 ms until the last completions landed, inside
  // the measured window. The bench enqueues no continuations, so no job is
  // ever `awaiting`.
  // With queues (process.many-queues), by (task, queue) through
  // jobs_runnable_by_task_queue, whose columns are the keys of the names
  // (_name_key; the names are compared on the rows): the other queues'
  // backlog is not counted, nor read (every job of that row is a no-op job).
  async remaining(db, queues) {
    const { rows } = queues
      ? await db.query(
          `SELECT ((SELECT count(*) FROM idemq.jobs
                     WHERE state IN ('enqueued', 'scheduled')
                       AND idemq._name_key(task) = idemq._name_key($2) AND task = $2
                       AND idemq._name_key(queue) = ANY (ARRAY(SELECT idemq._name_key(q) FROM unnest($1::text[]) q))
                       AND queue = ANY ($1::text[]))
                 + (SELECT count(*) FROM idemq.jobs WHERE state = 'processing' AND queue = ANY ($1::text[])))::int AS n`,
          [queues, NOOP_TASK],
        )
      : await db.query(
          `SELECT ((SELECT count(*) FROM idemq.jobs WHERE state IN ('enqueued', 'scheduled'))
                 + (SELECT count(*) FROM idemq.jobs WHERE state = 'processing'))::int AS n`,
        );
    return (rows[0] as { n: number }).n;
  },
  queueFilter: true,

  async startWorker(spec) {
    const worker = createWorker({
      connectionString: spec.url,
      concurrency: spec.concurrency,
      handleSignals: false,
      ...(spec.defaults ? {} : { prefetch: tunedPrefetch() }),
      ...(spec.queues ? { queues: spec.queues } : {}),
      tasks: {
        [NOOP_TASK]: async (payload: BenchPayload) => spec.onJob(payload),
        // Each step: BEGIN, the no-op fn, step_record, COMMIT on a pool
        // connection of its own (the ledger read once, at the first step).
        [STEPS_TASK]: async (payload: BenchPayload, ctx) => {
          spec.onJob(payload); // first, as every handler: the window opens at the first call
          for (let k = 1; k <= STEPS_PER_JOB; k++) await ctx.step(`s${k}`, () => k);
        },
        // Each step: effect_claim, the no-op fn (the outside call it stands
        // for), effect_done, step_record, each a transaction of its own: the
        // claim must be committed before the outside call is made.
        [EXTERNAL_STEPS_TASK]: async (payload: BenchPayload, ctx) => {
          spec.onJob(payload);
          for (let k = 1; k <= STEPS_PER_JOB; k++) await ctx.step(`s${k}`, () => k, { external: true });
        },
        [LEDGER_TASK]: {
          transactional: true,
          guardKey: (payload: BenchPayload) => `ledger:${payload.i}`,
          run: async (payload: BenchPayload, ctx) => {
            spec.onJob(payload);
            await ctx.tx.query(LEDGER_INSERT, [`ledger:${payload.i}`]);
          },
        },
      },
    });
    worker.on("worker:error", (event) => console.error("idemq worker:error", event));
    await worker.start();
    return { stop: () => worker.stop() };
  },

  /** Finished jobs made through the public functions (not by writing rows), so a schema change cannot break it. */
  async seedFinished(db, jobs, keys) {
    const chunk = 10_000;
    for (let done = 0; done < jobs; done += chunk) {
      const batch = Array.from({ length: Math.min(chunk, jobs - done) }, (_, k) => {
        const i = done + k;
        return { task: NOOP_TASK, payload: { i }, ...(i < keys ? { idempotencyKey: `seed-${i}` } : {}) };
      });
      await sql.enqueueMany(db, batch);
    }
    for (;;) {
      const claimed = await sql.claim(db, { workerId: "bench-seed", batchSize: 1000 });
      if (claimed.length === 0) break;
      await sql.completeMany(db, claimed.map((j) => ({ jobId: j.id, attempt: j.attempt, leaseToken: j.leaseToken })));
    }
  },
};
