// Search: find_jobs (a page of the jobs a filter matches) and count_jobs (how
// many, capped). The filter is SQL's (sql/functions/search/_check_job_filter.sql
// says what it may hold, and refuses anything else with 22023): it is sent as
// JSON, unchanged, so its rules live once, in SQL.

import { BULK_ACTIONS, type BulkAction } from "../contract.ts";
import { integer, jsonb, oneOf, toJobId, type JobIdInput } from "../encode.ts";
import { call, type Queryable } from "./call.ts";
import type { JobRow } from "./reads.ts";

/**
 * A job filter as SQL takes it: { ids, state, task, queue, key,
 * concurrency_key, error, created_after, created_before, finished_after,
 * finished_before, payload } (docs/sql-api.md, "Job filters").
 */
export type SqlJobFilter = Readonly<Record<string, unknown>>;

/** One page of the jobs `filter` matches, newest first; the next page is below the last row's job_id. */
export function findJobs(
  db: Queryable,
  filter: SqlJobFilter,
  opts: { beforeId?: JobIdInput | undefined; pageSize?: number | undefined } = {},
): Promise<JobRow[]> {
  return call<"find_jobs", JobRow>(db, "find_jobs", {
    filter: jsonb(filter, "filter"),
    before_id: opts.beforeId === undefined ? undefined : toJobId(opts.beforeId, "beforeId"),
    page_size: integer(opts.pageSize, "pageSize"),
  });
}

/** How many jobs `filter` matches (those `action` would take, with one), counted up to `atMost` (SQL default 10,000). */
export async function countJobs(
  db: Queryable,
  filter: SqlJobFilter,
  opts: { action?: BulkAction | undefined; atMost?: number | undefined } = {},
): Promise<{ jobs: number; exact: boolean }> {
  const rows = await call<"count_jobs", { jobs: number; exact: boolean }>(db, "count_jobs", {
    filter: jsonb(filter, "filter"),
    action: oneOf(opts.action, BULK_ACTIONS, "action"),
    at_most: integer(opts.atMost, "atMost"),
  });
  return rows[0]!;
}
