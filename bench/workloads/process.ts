// Processing workloads: jobs enqueued in bulk beforehand, then one worker
// process (bench/worker-child.ts) at a given concurrency works them off.
// Each run also gives WAL bytes, machine CPU and attributed CPU (worker +
// its PostgreSQL backends) per job, the worker's peak RSS and dead tuples.

import pg from "pg";
import { spawnWorker } from "../child.ts";
import { checkpoint, deadTuples } from "../db.ts";
import { closeWalWindow, openWalWindow } from "../measure.ts";
import { SYSTEMS } from "../systems/index.ts";
import { LEDGER_TASK, NOOP_TASK, type BenchJob } from "../systems/types.ts";
import {
  idemqDefaults,
  variant,
  withFreshDatabase,
  type Context,
  type FreshDatabase,
  type Measured,
  type Metrics,
  type Variant,
  type Workload,
} from "./common.ts";

const ENQUEUE_CHUNK = 20_000;

export interface ProcessOptions {
  concurrency: number;
  task: string;
  /** Database to clone instead of the system's empty template (scale rows). */
  template?: string;
  /** Another session holds a transaction (and so the xmin horizon) open for the whole run. */
  holdXmin?: boolean;
  /** Enqueues the run's jobs (ctx.sizes.process of them for the worker) instead of the system's producer. */
  seed?: (db: FreshDatabase) => Promise<void>;
  /** The worker claims from these queues only; the run ends when they are empty. */
  queues?: string[];
  /** Measured on the run's database once the worker is done; merged into the metrics. */
  after?: (db: FreshDatabase) => Promise<Metrics>;
  /** Jobs of the run, the handler calls that end it (default ctx.sizes.process); a `seed` must enqueue that many. */
  jobs?: number;
  /** Units of work per job (process.steps: a step or a no-op job), for units_per_s; absent: no units_per_s. */
  unitsPerJob?: number;
}

export async function runProcessing(ctx: Context, v: Variant, round: number, options: ProcessOptions): Promise<Measured> {
  const system = SYSTEMS[v.system];
  const count = options.jobs ?? ctx.sizes.process;
  if (options.queues && !system.queueFilter) throw new Error(`${v.system}: its worker cannot be limited to some queues`);
  const run = async (db: FreshDatabase): Promise<Measured> => {
    if (options.seed) {
      await options.seed(db);
    } else {
      const producer = await system.producer(db.url, { connections: 1 });
      try {
        for (let start = 0; start < count; start += ENQUEUE_CHUNK) {
          const chunk: BenchJob[] = [];
          for (let i = start; i < Math.min(count, start + ENQUEUE_CHUNK); i++) {
            chunk.push({ task: options.task, payload: { i } });
          }
          await producer.enqueueBulk(chunk);
        }
      } finally {
        await producer.close();
      }
    }
    if (v.setupSql !== undefined) await db.client.query(v.setupSql);
    // As autovacuum would have by now (this machine's server runs with it off).
    await db.client.query("ANALYZE");

    const holder = options.holdXmin ? new pg.Client({ connectionString: db.url }) : null;
    if (holder) {
      holder.on("error", () => {});
      await holder.connect();
      await holder.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
      await holder.query("SELECT txid_current()");
    }
    try {
      if (ctx.checkpoints) await checkpoint(db.client);
      const walWindow = await openWalWindow(db.client);
      const child = spawnWorker(
        {
          system: v.system,
          mode: v.mode,
          concurrency: options.concurrency,
          url: db.url,
          expect: count,
          kind: "throughput",
          notify: false,
          defaults: v.defaults ?? false,
          ...(options.queues ? { queues: options.queues } : {}),
        },
        ctx.timeoutMs,
      );
      let result;
      try {
        result = await child.done;
      } finally {
        child.kill();
        await child.exited;
      }
      const wal = await closeWalWindow(db.client, walWindow);
      const dead = await deadTuples(db.client, system.tables);
      const extra = options.after ? await options.after(db) : {};
      return {
        metrics: {
          jobs_per_s: count / result.seconds,
          ...(options.unitsPerJob === undefined ? {} : { units_per_s: (count * options.unitsPerJob) / result.seconds }),
          wal_bytes_per_job: wal.bytes / count,
          wal_attributed: wal.attributed ? 1 : 0,
          cpu_us_per_job: (result.machineCpuSeconds * 1e6) / count,
          worker_cpu_us_per_job: (result.workerCpuSeconds * 1e6) / count,
          backend_cpu_us_per_job: result.backendCpuSeconds === null ? null : (result.backendCpuSeconds * 1e6) / count,
          rss_mb: result.maxRssKb / 1024,
          statements_per_job: result.statements / count,
          dead_tuples: dead,
          ...extra,
        },
      };
    } finally {
      if (holder) {
        await holder.query("ROLLBACK").catch(() => {});
        await holder.end().catch(() => {});
      }
    }
  };
  return withFreshDatabase(ctx, v.system, round, run, options.template ?? ctx.template(v.system));
}

export const THROUGHPUT_VARIANTS: Variant[] = [
  variant("idemq", "batched"),
  idemqDefaults("batched", "idemq:defaults"),
  variant("graphile", "batched"),
  variant("graphile", "perjob"),
  variant("pgboss", "batched"),
  variant("pgboss", "perjob"),
  variant("raw", "batched"),
  variant("raw", "perjob"),
];

/**
 * idemq with retention 0 for succeeded jobs: complete_many deletes each row
 * in the completing statement (the key ledger keeps the outcome), instead of
 * the default 7 days' UPDATE to succeeded.
 */
export const RETENTION_ZERO_VARIANT: Variant = {
  ...variant("idemq", "batched", "idemq:retention0"),
  setupSql: "SELECT idemq.set_retention(state => 'succeeded', keep => '0 seconds')",
};

function throughput(concurrency: number, extra: Variant[] = []): Workload {
  return {
    id: `process.c${concurrency}`,
    title: `processing, no-op handlers, one worker process, concurrency ${concurrency}`,
    concurrency,
    variants: [...THROUGHPUT_VARIANTS, ...extra],
    primary: "jobs_per_s",
    higherIsBetter: true,
    run: (ctx, v, round) => runProcessing(ctx, v, round, { concurrency, task: NOOP_TASK }),
  };
}

const transactional: Workload = {
  id: "process.transactional.c10",
  title: "transactional tasks (a ledger insert per job), concurrency 10",
  concurrency: 10,
  subject: "idemq:transactional",
  variants: [
    variant("idemq", "transactional", "idemq:transactional"),
    idemqDefaults("transactional", "idemq:transactional:defaults"),
    variant("graphile", "transactional", "graphile:perjob"),
    variant("pgboss", "transactional", "pgboss:transactional"),
    variant("raw", "transactional", "raw:one-tx-per-job"),
  ],
  primary: "jobs_per_s",
  higherIsBetter: true,
  run: (ctx, v, round) => runProcessing(ctx, v, round, { concurrency: 10, task: LEDGER_TASK }),
};

export const processWorkloads: Workload[] = [throughput(10, [RETENTION_ZERO_VARIANT]), throughput(50, [RETENTION_ZERO_VARIANT]), transactional];
