// An operator's calls on jobs and their upkeep: cancel, retry, reschedule,
// purge, retention (apply_retention, set_retention), prune_keys and rescue.

import type { Duration, JobState } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import { bad, instant, integer, interval, states, text, toJobId, type Instant, type JobIdInput } from "../encode.ts";
import { call, scalar, type Queryable } from "./call.ts";

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
