// An operator's calls on jobs and their upkeep: cancel, retry, reschedule,
// purge, retention (apply_retention, set_retention), prune_keys and rescue;
// and the bulk actions on the jobs a filter matches, one batch a call.

import type { Duration, JobState } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import { bad, instant, integer, interval, jsonb, states, text, toJobId, type Instant, type JobIdInput } from "../encode.ts";
import { call, scalar, type Queryable } from "./call.ts";
import type { SqlJobFilter } from "./search.ts";

export function cancel(db: Queryable, jobId: JobIdInput): Promise<JobState> {
  return scalar(db, "cancel", { job_id: toJobId(jobId) });
}

export function retry(db: Queryable, jobId: JobIdInput): Promise<JobState> {
  return scalar(db, "retry", { job_id: toJobId(jobId) });
}

export function reschedule(db: Queryable, jobId: JobIdInput, runAt: Instant): Promise<JobState> {
  return scalar(db, "reschedule", { job_id: toJobId(jobId), run_at: instant(runAt, "runAt") ?? null });
}

/**
 * Deletes finished jobs older than `olderThan` (by default in terminal states);
 * returns the count. With `batchSize`, at most that many, oldest first: call
 * again while a batch comes back full.
 */
export function purge(
  db: Queryable,
  opts: { olderThan: Duration; states?: readonly JobState[]; batchSize?: number | undefined },
): Promise<number> {
  if (opts?.olderThan === undefined) throw bad("purge needs olderThan", 'e.g. { olderThan: "7 days" }');
  return scalar(db, "purge", {
    older_than: toPgInterval(opts.olderThan),
    states: states(opts.states),
    batch_size: integer(opts.batchSize, "batchSize"),
  });
}

/** Deletes at most `batchSize` finished jobs past their retention (SQL default 1000); returns the count. */
export function applyRetention(db: Queryable, opts: { batchSize?: number | undefined } = {}): Promise<number> {
  return scalar(db, "apply_retention", {
    batch_size: integer(opts.batchSize, "batchSize"),
  });
}

/**
 * Sets how long finished jobs in `state` are kept: the default, or an
 * override for one queue or one task (`keep: null` removes an override).
 */
export async function setRetention(
  db: Queryable,
  opts: { state: JobState; keep: Duration | null; queue?: string | undefined; task?: string | undefined },
): Promise<void> {
  await call(db, "set_retention", {
    state: opts.state,
    keep: opts.keep === null ? null : toPgInterval(opts.keep),
    queue: text(opts.queue, "queue"),
    task: text(opts.task, "task"),
  });
}

/** Releases idempotency keys whose latest job finished more than `olderThan` ago; returns the count. */
export function pruneKeys(db: Queryable, opts: { olderThan?: Duration | undefined } = {}): Promise<number> {
  return scalar(db, "prune_keys", { older_than: interval(opts.olderThan) });
}

/** Returns the number of jobs rescued from expired leases or expired. */
export function rescue(db: Queryable): Promise<number> {
  return scalar(db, "rescue", {});
}

/** One batch of a bulk action (retry_jobs, cancel_jobs, delete_jobs, run_jobs_now). */
export interface BulkBatch {
  /** Jobs this batch changed. */
  touched: number;
  /** Jobs of the batch left as they were: moved on since they matched, held by another transaction, or (retry) their key held by another active job. */
  skipped: number;
  /** More jobs match below this batch: call again with beforeId = nextBeforeId. */
  more: boolean;
  nextBeforeId: string | null;
}

type BatchOptions = { beforeId?: JobIdInput | null | undefined; maxJobs?: number | undefined };

async function bulkBatch(
  db: Queryable,
  fn: "retry_jobs" | "cancel_jobs" | "delete_jobs" | "run_jobs_now",
  filter: SqlJobFilter,
  opts: BatchOptions,
): Promise<BulkBatch> {
  const rows = await call<typeof fn, { touched: number; skipped: number; more: boolean; next_before_id: string | null }>(db, fn, {
    filter: jsonb(filter, "filter"),
    before_id: opts.beforeId == null ? undefined : toJobId(opts.beforeId, "beforeId"),
    max_jobs: integer(opts.maxJobs, "maxJobs"),
  });
  const r = rows[0]!;
  return { touched: r.touched, skipped: r.skipped, more: r.more, nextBeforeId: r.next_before_id };
}

/** retry() of one batch of the failed, cancelled or expired jobs `filter` matches (SQL default 1000). */
export function retryJobs(db: Queryable, filter: SqlJobFilter, opts: BatchOptions = {}): Promise<BulkBatch> {
  return bulkBatch(db, "retry_jobs", filter, opts);
}

/** cancel() of one batch of the active jobs `filter` matches. */
export function cancelJobs(db: Queryable, filter: SqlJobFilter, opts: BatchOptions = {}): Promise<BulkBatch> {
  return bulkBatch(db, "cancel_jobs", filter, opts);
}

/** Deletes one batch of the finished jobs `filter` matches (keys stay until prune_keys). */
export function deleteJobs(db: Queryable, filter: SqlJobFilter, opts: BatchOptions = {}): Promise<BulkBatch> {
  return bulkBatch(db, "delete_jobs", filter, opts);
}

/** reschedule(job, now()) of one batch of the scheduled jobs `filter` matches. */
export function runJobsNow(db: Queryable, filter: SqlJobFilter, opts: BatchOptions = {}): Promise<BulkBatch> {
  return bulkBatch(db, "run_jobs_now", filter, opts);
}
