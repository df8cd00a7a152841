// Graphile Worker 0.18: addJobs (its add_jobs SQL function) in bulk, addJob one
// by one, run() as the worker. Batched mode is the configuration of Graphile's
// own performance page (localQueue size 500, completeJobBatchDelay and
// failJobBatchDelay 0); per-job mode is its defaults. Pool size follows its
// advice: max(10, concurrency + 2). Its per-job info log lines are dropped
// (warnings and errors still print): logging is not what is measured.

import pg from "pg";
import { Logger, makeWorkerUtils, run, runMigrations, type Task } from "graphile-worker";
import { LEDGER_DDL, LEDGER_INSERT, LEDGER_TASK, NOOP_TASK, type BenchPayload, type System } from "./types.ts";

const LOCAL_QUEUE_SIZE = 500;

const quietLogger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`graphile-worker ${level}: ${message}`);
});

// Pools the bench owns: Graphile's own release() ends its pool without waiting,
// after removing its error handler, so dropping the database right afterwards
// could crash the process on a terminated idle connection.
function ownPool(url: string, max: number): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max });
  pool.on("error", () => {});
  pool.on("connect", (client) => client.on("error", () => {}));
  return pool;
}

function poolSize(concurrency: number): number {
  return Math.max(10, concurrency + 2);
}

function batching(mode: string) {
  return mode === "batched"
    ? { localQueue: { size: LOCAL_QUEUE_SIZE }, completeJobBatchDelay: 0, failJobBatchDelay: 0 }
    : {};
}

export const graphile: System = {
  name: "graphile",
  modes: ["batched", "perjob", "transactional"],
  tables: ["graphile_worker._private_jobs"],

  settings(mode, concurrency) {
    const common = `concurrentJobs ${concurrency}, maxPoolSize ${poolSize(concurrency)}`;
    if (mode === "batched") {
      return `${common}, localQueue.size ${LOCAL_QUEUE_SIZE}, completeJobBatchDelay 0, failJobBatchDelay 0`;
    }
    const ledger = mode === "transactional" ? "; handler inserts the ledger row with helpers.query (own transaction)" : "";
    return `${common}, defaults (no localQueue, completeJobBatchDelay -1)${ledger}`;
  },

  async setup(url) {
    const pool = ownPool(url, 2);
    try {
      await runMigrations({ pgPool: pool, logger: quietLogger });
      await pool.query(LEDGER_DDL);
    } finally {
      await pool.end();
    }
  },

  async producer(url, options) {
    const pool = ownPool(url, Math.max(2, options.connections));
    const utils = await makeWorkerUtils({ pgPool: pool, logger: quietLogger });
    return {
      async enqueueBulk(jobs) {
        await utils.addJobs(
          jobs.map((j) => ({ identifier: j.task, payload: j.payload, ...(j.key ? { jobKey: j.key } : {}) })),
        );
      },
      async enqueueOne(job) {
        await utils.addJob(job.task, job.payload, job.key ? { jobKey: job.key } : {});
      },
      async close() {
        await utils.release();
        await pool.end();
      },
    };
  },

  async remaining(db) {
    const { rows } = await db.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs");
    return (rows[0] as { n: number }).n;
  },

  async startWorker(spec) {
    const noop: Task = async (payload) => {
      spec.onJob(payload as BenchPayload);
    };
    const ledger: Task = async (payload, helpers) => {
      const p = payload as BenchPayload;
      spec.onJob(p);
      await helpers.query(LEDGER_INSERT, [`ledger:${p.i}`]);
    };
    const runner = await run({
      connectionString: spec.url,
      concurrency: spec.concurrency,
      maxPoolSize: poolSize(spec.concurrency),
      noHandleSignals: true,
      logger: quietLogger,
      taskList: { [NOOP_TASK]: noop, [LEDGER_TASK]: ledger },
      preset: { worker: batching(spec.mode) },
    });
    return { stop: () => runner.stop() };
  },
};
