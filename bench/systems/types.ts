// The interface every system under test implements: idemq, its peers and the
// raw-SQL baseline. The parent process enqueues through a Producer; a worker
// child process (bench/worker-child.ts) runs startWorker.

import type pg from "pg";

export type SystemName = "idemq" | "graphile" | "pgboss" | "raw";

/**
 * How a worker processes jobs.
 * - batched: the system's fastest settings (batch fetch, batched completion).
 * - perjob: the system's per-job defaults (one fetch and one completion per job).
 * - transactional: each job's handler inserts a ledger row; idemq runs a
 *   transactional task (guard + ledger insert + complete in one transaction),
 *   the peers their per-job modes, the raw baseline one transaction per job.
 */
export type Mode = "batched" | "perjob" | "transactional";

/** Task names every worker registers. */
export const NOOP_TASK = "noop";
export const LEDGER_TASK = "ledger";
/** idemq only (process.steps): a handler of STEPS_PER_JOB transactional ctx.step calls whose fns do nothing. */
export const STEPS_TASK = "steps";
/** idemq only (process.steps): a handler of STEPS_PER_JOB external ctx.step calls ({ external: true }) whose fns do nothing. */
export const EXTERNAL_STEPS_TASK = "steps-external";
export const STEPS_PER_JOB = 10;

/** Ledger table written by transactional handlers (created in every bench database). */
export const LEDGER_DDL = "CREATE TABLE IF NOT EXISTS bench_ledger (k text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())";
export const LEDGER_INSERT = "INSERT INTO bench_ledger (k) VALUES ($1)";

export interface BenchPayload {
  /** Sequence number of the job in its workload. */
  i: number;
  /** Enqueue time (sharedClockMs, bench/measure.ts) for latency runs. */
  t?: number;
}

export interface BenchJob {
  task: string;
  payload: BenchPayload;
  /** Idempotency key (idemq), job key (Graphile), singleton key (pg-boss), unique key (raw). */
  key?: string;
}

export interface ProducerOptions {
  /** Pool size. */
  connections: number;
  /** Jobs carry keys (pg-boss needs a queue whose policy enforces them). */
  keyed?: boolean;
  /** Wake idle workers on enqueue (latency runs), where the system makes that optional. */
  notify?: boolean;
}

export interface Producer {
  /** All jobs in one call. */
  enqueueBulk(jobs: readonly BenchJob[]): Promise<void>;
  /** One job, in its own transaction. Called concurrently up to `connections` times. */
  enqueueOne(job: BenchJob): Promise<void>;
  close(): Promise<void>;
}

export interface WorkerSpec {
  url: string;
  concurrency: number;
  mode: Mode;
  /** Latency runs: wake on enqueue where the system makes that optional. */
  notify: boolean;
  /** idemq: its default settings (no prefetch) instead of the tuned ones; other systems have one setting per mode. */
  defaults?: boolean;
  /** Called once per handler invocation, before the handler returns. */
  onJob(payload: BenchPayload): void;
  /** Claim from these queues only (systems with `queueFilter`). */
  queues?: string[];
}

export interface RunningWorker {
  stop(): Promise<void>;
}

export interface System {
  name: SystemName;
  /** Processing modes the system has (idemq's worker has one mode for both throughput rows). */
  modes: readonly Mode[];
  /**
   * The settings a worker runs with, for the report and README. `task`: the
   * task the jobs of the run are (idemq's process.steps variants); absent,
   * the mode's.
   */
  settings(mode: Mode, concurrency: number, defaults?: boolean, task?: string): string;
  /** Installs the system's schema (and the ledger table) into an empty database. */
  setup(url: string): Promise<void>;
  producer(url: string, options: ProducerOptions): Promise<Producer>;
  /** Jobs not finished yet (enqueued, scheduled, running); only those of `queues` when given (systems with `queueFilter`). */
  remaining(db: pg.ClientBase, queues?: string[]): Promise<number>;
  /** Its worker can be limited to some queues (WorkerSpec.queues). */
  queueFilter?: boolean;
  /** The system's job tables, for dead-tuple counts. */
  tables: readonly string[];
  startWorker(spec: WorkerSpec): Promise<RunningWorker>;
  /** Scale rows: fills the tables with finished jobs and retained keys. */
  seedFinished?(db: pg.ClientBase, jobs: number, keys: number): Promise<void>;
}
