// pg-boss 12: insert() in bulk, send() one by one, work() as the worker.
//
// pg-boss polls: after a fetch its workers sleep pollingIntervalSeconds
// (default 2, minimum 0.5) unless a burst trigger says more work is waiting.
// Both modes therefore get the fastest polling pg-boss allows:
// - batched: localConcurrency = concurrency, batchSize 100, burstWhenBatchFull
//   (fetch again at once while batches come back full);
// - perjob: batchSize 1 (its default), localConcurrency = concurrency,
//   burstWhenReadyExceeds 1 (its minimum) with the queue statistics refreshed
//   every second (the minimum; supervise, monitor and queue cache), and
//   pollingIntervalSeconds 0.5 (the minimum). Burst mode starts once the
//   statistics show the backlog, 1-2 s into a run;
// - transactional: perjob plus transactional: true (handler and completion in
//   one transaction), the closest pg-boss has to idemq's transactional tasks.
// Latency runs turn on LISTEN/NOTIFY (useListenNotify + the queue's notify).
// Keyed enqueues go to a queue with policy "exclusive", where singletonKey
// dedupes a queued or active job (a "standard" queue ignores the key).

import { PgBoss, type WorkOptions } from "pg-boss";
import { LEDGER_DDL, LEDGER_INSERT, LEDGER_TASK, NOOP_TASK, type BenchPayload, type Mode, type System } from "./types.ts";

const BATCH = 100;
/** The queue statistics burstWhenReadyExceeds reads, refreshed as often as pg-boss allows (default 60 s). */
const STATS_EVERY_SECOND = { superviseIntervalSeconds: 1, monitorIntervalSeconds: 1, queueCacheIntervalSeconds: 1 };
const KEYED_QUEUE = `${NOOP_TASK}_keyed`;

function poolSize(mode: Mode, concurrency: number): number {
  // A transactional worker pins one connection per handler; pg-boss warns unless max exceeds that.
  return mode === "transactional" ? 2 * concurrency + 2 : concurrency + 2;
}

function workOptions(mode: Mode, concurrency: number): WorkOptions {
  if (mode === "batched") return { localConcurrency: concurrency, batchSize: BATCH, burstWhenBatchFull: true };
  return {
    localConcurrency: concurrency,
    batchSize: 1,
    pollingIntervalSeconds: 0.5,
    burstWhenReadyExceeds: 1,
    ...(mode === "transactional" ? { transactional: true } : {}),
  };
}

function describe(options: object): string {
  return Object.entries(options)
    .map(([k, v]) => `${k} ${String(v)}`)
    .join(", ");
}

export const pgboss: System = {
  name: "pgboss",
  modes: ["batched", "perjob", "transactional"],
  tables: ["pgboss.job"],

  settings(mode, concurrency) {
    const stats = mode === "batched" ? "" : `, ${describe(STATS_EVERY_SECOND)}`;
    return `max ${poolSize(mode, concurrency)}, ${describe(workOptions(mode, concurrency))}${stats}`;
  },

  async setup(url) {
    const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false });
    boss.on("error", (err) => console.error("pg-boss setup:", err));
    await boss.start();
    await boss.createQueue(NOOP_TASK);
    await boss.createQueue(LEDGER_TASK);
    await boss.createQueue(KEYED_QUEUE, { policy: "exclusive" });
    await boss.getDb().executeSql(LEDGER_DDL);
    await boss.stop({ graceful: false, close: true });
  },

  async producer(url, options) {
    const boss = new PgBoss({
      connectionString: url,
      max: options.connections,
      supervise: false,
      schedule: false,
      registerInstance: false,
    });
    boss.on("error", (err) => console.error("pg-boss producer:", err));
    await boss.start();
    if (options.notify) await boss.updateQueue(NOOP_TASK, { notify: true });
    const queueOf = (task: string, key?: string) => (key ? KEYED_QUEUE : task);
    return {
      async enqueueBulk(jobs) {
        const first = jobs[0];
        if (!first) return;
        await boss.insert(
          queueOf(first.task, first.key),
          jobs.map((j) => ({ data: j.payload, ...(j.key ? { singletonKey: j.key } : {}) })),
        );
      },
      async enqueueOne(job) {
        await boss.send(queueOf(job.task, job.key), job.payload, job.key ? { singletonKey: job.key } : {});
      },
      close: () => boss.stop({ graceful: false, close: true }),
    };
  },

  async remaining(db) {
    const { rows } = await db.query(
      "SELECT count(*)::int AS n FROM pgboss.job WHERE state IN ('created', 'retry', 'active')",
    );
    return (rows[0] as { n: number }).n;
  },

  async startWorker(spec) {
    const boss = new PgBoss({
      connectionString: spec.url,
      max: poolSize(spec.mode, spec.concurrency),
      useListenNotify: spec.notify,
      ...(spec.mode === "batched" ? {} : STATS_EVERY_SECOND),
    });
    boss.on("error", (err) => console.error("pg-boss worker:", err));
    // Each kind of warning once: the backlog warning repeats every second while the bench's backlog drains.
    const warned = new Set<string>();
    boss.on("warning", (w) => {
      const kind = w.message.replace(/\d+/g, "#");
      if (!warned.has(kind)) console.error("pg-boss warning:", w.message);
      warned.add(kind);
    });
    await boss.start();
    // Only the queue this mode uses gets workers: idle pollers on another queue would cost CPU.
    if (spec.mode === "transactional") {
      const options = { ...workOptions(spec.mode, spec.concurrency), transactional: true } as const;
      await boss.work<BenchPayload, unknown, typeof options>(LEDGER_TASK, options, async (jobs, tx) => {
        for (const job of jobs) {
          spec.onJob(job.data);
          await tx.executeSql(LEDGER_INSERT, [`ledger:${job.data.i}`]);
        }
      });
    } else {
      await boss.work<BenchPayload>(NOOP_TASK, workOptions(spec.mode, spec.concurrency), async (jobs) => {
        for (const job of jobs) spec.onJob(job.data);
      });
    }
    return { stop: () => boss.stop({ graceful: false, close: true }) };
  },
};
