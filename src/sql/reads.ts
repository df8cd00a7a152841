// Reads: one job (job), the counts (stats) and the dashboard's overview.

import type { Duration, JobState, StatsMetric, WaitingReason } from "../contract.ts";
import { integer, interval, toJobId, type JobIdInput } from "../encode.ts";
import { call, type Queryable } from "./call.ts";

/** A job as idemq.job() returns it (the columns of idemq.job_row). */
export interface JobRow {
  job_id: string;
  task: string;
  queue: string;
  /** null unless the session's login may read idemq.jobs (idemq_admin): see sql/functions/reads/job.sql. */
  payload: unknown;
  state: JobState;
  priority: number;
  run_at: Date | null;
  attempt: number;
  uncounted: number;
  max_attempts: number;
  idempotency_key: string | null;
  locked_by: string | null;
  locked_at: Date | null;
  lease_expires_at: Date | null;
  errors: unknown[] | null;
  result: unknown;
  created_at: Date;
  finished_at: Date | null;
  expires_at: Date | null;
  /** enqueue's concurrency_key (flow control), null without one. */
  concurrency_key: string | null;
  /**
   * Why the job is not running: an awaiting job's "parents" or
   * "concurrency_key"; a runnable job's "paused", "held", "concurrency" or
   * "rate" (its queue or task holds it back), null when none does (it waits
   * for a worker); null in other states.
   */
  waiting_for: JobWaitingFor | null;
  /** The latest attempt's progress (0..100) as its handler last reported it (progress()); null for none. Absent before 0.2.0. */
  progress?: number | null;
}

/** Why a job is not running (idemq.job()'s waiting_for: idemq.waiting_reason, WAITING_REASONS). */
export type JobWaitingFor = WaitingReason;

/** One job's state and outcome (idemq.job(), which every idemq role may call); undefined when there is no such job. */
export async function job(db: Queryable, jobId: JobIdInput): Promise<JobRow | undefined> {
  const rows = await call<"job", JobRow>(db, "job", { job_id: toJobId(jobId) });
  return rows[0];
}

export interface StatsRow {
  queue: string | null;
  task: string | null;
  metric: StatsMetric;
  value: number;
  /**
   * On the rows enqueued and oldest_runnable_seconds: why that queue and
   * task's runnable jobs are not running ("paused", "held", "concurrency",
   * "rate"), null when nothing holds them back (they wait for a worker).
   * Null on every other row.
   */
  waitingFor: WaitingReason | null;
}

export interface OverviewRow {
  queue: string | null;
  task: string | null;
  /** An active state, lease_expired, oldest_runnable_seconds, <terminal state>_recent, a terminal state (the totals: queue and task null) or an event. */
  metric: string;
  value: number;
  /** False for a total over exact_up_to: value is then an estimate (at least exact_up_to + 1). */
  exact: boolean;
}

/** overview(): the dashboard's read, fast with millions of finished jobs (see sql/functions/reads/overview.sql). */
export async function overview(
  db: Queryable,
  opts: { recent?: Duration | undefined; exactUpTo?: number | undefined } = {},
): Promise<OverviewRow[]> {
  const rows = await call<"overview", { queue: string | null; task: string | null; metric: string; value: string; exact: boolean }>(
    db,
    "overview",
    { recent: interval(opts.recent), exact_up_to: integer(opts.exactUpTo, "exactUpTo") },
  );
  return rows.map((r) => ({ queue: r.queue, task: r.task, metric: r.metric, value: Number(r.value), exact: r.exact }));
}

export async function stats(db: Queryable): Promise<StatsRow[]> {
  const rows = await call<
    "stats",
    { queue: string | null; task: string | null; metric: StatsMetric; value: string; waiting_for?: WaitingReason | null }
  >(db, "stats", {});
  // Counts, not ids: a number is exact far beyond any realistic count. A
  // database before 0.2.0 has no waiting_for.
  return rows.map((r) => ({ queue: r.queue, task: r.task, metric: r.metric, value: Number(r.value), waitingFor: r.waiting_for ?? null }));
}

/** roll_up(): recompute the dashboard's history for the minutes since the last call (sql/functions/reads/roll_up.sql); the rows written or deleted. */
export async function rollUp(db: Queryable): Promise<number> {
  const rows = await call<"roll_up", { r: number }>(db, "roll_up", {});
  return rows[0]!.r;
}

export interface HistoryRow {
  minute: Date;
  started: number;
  succeeded: number;
  failed: number;
  retried: number;
  /** Sampled once a minute by roll_up(); null in a minute without a sample. */
  waiting: number | null;
  oldestWaitingSeconds: number | null;
  runP50Ms: number | null;
  runP95Ms: number | null;
  waitP50Ms: number | null;
  waitP95Ms: number | null;
}

/** history(): per minute of the last `since` (at most a day), for a queue, a task or all (sql/functions/reads/history.sql). */
export async function history(
  db: Queryable,
  opts: { since?: Duration | undefined; queue?: string | null | undefined; task?: string | null | undefined } = {},
): Promise<HistoryRow[]> {
  type Row = Record<
    "minute" | "started" | "succeeded" | "failed" | "retried" | "waiting" | "oldest_waiting_seconds" | "run_p50_ms" | "run_p95_ms" | "wait_p50_ms" | "wait_p95_ms",
    string | Date | null
  >;
  const rows = await call<"history", Row>(db, "history", {
    since: interval(opts.since),
    queue: opts.queue,
    task: opts.task,
  });
  const n = (v: string | Date | null | undefined): number | null => (v == null ? null : Number(v));
  return rows.map((r) => ({
    minute: r.minute as Date,
    started: Number(r.started),
    succeeded: Number(r.succeeded),
    failed: Number(r.failed),
    retried: Number(r.retried),
    waiting: n(r.waiting),
    oldestWaitingSeconds: n(r.oldest_waiting_seconds),
    runP50Ms: n(r.run_p50_ms),
    runP95Ms: n(r.run_p95_ms),
    waitP50Ms: n(r.wait_p50_ms),
    waitP95Ms: n(r.wait_p95_ms),
  }));
}
