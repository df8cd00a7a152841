// A bulk action on every job a filter matches (retry, cancel, delete, run
// now), batch after batch: each batch is one call of the SQL function
// (retry_jobs, cancel_jobs, delete_jobs, run_jobs_now), so its own short
// transaction on a pool, walking down from the newest match (next_before_id)
// until none is left. The per-job rules are the SQL functions'.

import type { BulkAction } from "./contract.ts";
import { sqlJobFilter, type JobFilter } from "./job-reads.ts";
import { cancelJobs, deleteJobs, retryJobs, runJobsNow, type BulkBatch, type Queryable, type SqlJobFilter } from "./sql/index.ts";

const BATCH_CALLS = { retry: retryJobs, cancel: cancelJobs, delete: deleteJobs, run_now: runJobsNow } as const satisfies Record<
  BulkAction,
  unknown
>;

export interface BulkProgress {
  /** Jobs changed so far. */
  touched: number;
  /** Jobs matched but left as they were (moved on, held by another transaction, or a retry's key held by another job). */
  skipped: number;
  batches: number;
}

export interface BulkOptions {
  /** Jobs per batch (1..10,000; SQL's default 1000). */
  maxJobs?: number | undefined;
  /** Called after each batch with the totals so far. */
  onBatch?: ((progress: BulkProgress) => void) | undefined;
  /** Asked before each batch after the first: true stops (the batches done stay done). */
  stop?: (() => boolean) | undefined;
  /** Go on from here (a previous run's `nextBeforeId`, after it was stopped); default: from the newest match. */
  beforeId?: string | undefined;
}

/**
 * Runs `action` on every job `filter` matches, in batches; `interrupted` when
 * `stop` ended it early, and then `nextBeforeId` is where a later run goes on.
 */
export async function runBulkAction(
  db: Queryable,
  action: BulkAction,
  filter: JobFilter,
  opts: BulkOptions = {},
): Promise<BulkProgress & { interrupted: boolean; nextBeforeId: string | null }> {
  return runBulkBatches(db, action, sqlJobFilter(filter), opts);
}

/** runBulkAction with the filter as SQL takes it (the dashboard's search sends its fields unchanged, for SQL to judge). */
export async function runBulkBatches(
  db: Queryable,
  action: BulkAction,
  sqlFilter: SqlJobFilter,
  opts: BulkOptions = {},
): Promise<BulkProgress & { interrupted: boolean; nextBeforeId: string | null }> {
  const call = BATCH_CALLS[action];
  const progress: BulkProgress = { touched: 0, skipped: 0, batches: 0 };
  let before: string | null = opts.beforeId ?? null;
  for (;;) {
    const batch: BulkBatch = await call(db, sqlFilter, { beforeId: before, maxJobs: opts.maxJobs });
    progress.touched += batch.touched;
    progress.skipped += batch.skipped;
    progress.batches += 1;
    opts.onBatch?.({ ...progress });
    if (!batch.more) return { ...progress, interrupted: false, nextBeforeId: null };
    if (opts.stop?.() === true) return { ...progress, interrupted: true, nextBeforeId: batch.nextBeforeId };
    before = batch.nextBeforeId;
  }
}
