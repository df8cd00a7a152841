// Admin reads of idemq.jobs (getJob, listJobs). These are the only SQL the
// client writes by hand rather than as a call of an idemq.* function: reading
// the documented jobs view for admin tools is allowed; writing never is.

import { CLIENT_DEFAULTS, type JobState } from "./contract.ts";
import { bad, integer, states, text, toJobId, type JobIdInput } from "./encode.ts";
import { runQuery, type Queryable } from "./sql-api.ts";

export interface Job {
  id: string;
  task: string;
  queue: string;
  payload: unknown;
  state: JobState;
  priority: number;
  runAt: Date | null;
  attempt: number;
  maxAttempts: number;
  idempotencyKey: string | null;
  lockedBy: string | null;
  leaseExpiresAt: Date | null;
  /** One entry per failed attempt (attempt, started_at, failed_at, worker, max_attempts, error class, message), and one per operator retry (class "Retried"); as SQL stores them. */
  errors: unknown[];
  result: unknown;
  createdAt: Date;
  finishedAt: Date | null;
  expiresAt: Date | null;
}

export interface ListJobsFilter {
  state?: JobState | readonly JobState[] | undefined;
  queue?: string | undefined;
  task?: string | undefined;
  /** Idempotency key. */
  key?: string | undefined;
  /** Default CLIENT_DEFAULTS.listLimit. */
  limit?: number | undefined;
}

const JOB_COLUMNS =
  "j.id, j.task, j.queue, j.payload, j.state, j.priority, j.run_at, j.attempt, j.max_attempts, " +
  "j.idempotency_key, j.locked_by, j.lease_expires_at, j.errors, j.result, j.created_at, j.finished_at, j.expires_at";

interface JobRow {
  id: string;
  task: string;
  queue: string;
  payload: unknown;
  state: JobState;
  priority: number;
  run_at: Date | null;
  attempt: number;
  max_attempts: number;
  idempotency_key: string | null;
  locked_by: string | null;
  lease_expires_at: Date | null;
  errors: unknown[] | null;
  result: unknown;
  created_at: Date;
  finished_at: Date | null;
  expires_at: Date | null;
}

function toJob(r: JobRow): Job {
  return {
    id: r.id,
    task: r.task,
    queue: r.queue,
    payload: r.payload,
    state: r.state,
    priority: r.priority,
    runAt: r.run_at,
    attempt: r.attempt,
    maxAttempts: r.max_attempts,
    idempotencyKey: r.idempotency_key,
    lockedBy: r.locked_by,
    leaseExpiresAt: r.lease_expires_at,
    errors: r.errors ?? [],
    result: r.result,
    createdAt: r.created_at,
    finishedAt: r.finished_at,
    expiresAt: r.expires_at,
  };
}

export async function getJob(db: Queryable, jobId: JobIdInput): Promise<Job | null> {
  const rows = await runQuery<JobRow>(db, `SELECT ${JOB_COLUMNS} FROM idemq.jobs j WHERE j.id = $1`, [toJobId(jobId)]);
  return rows[0] === undefined ? null : toJob(rows[0]);
}

/** The WHERE clause of listJobs and countJobs: an unset filter is a NULL parameter ($1..$4). */
const FILTER_WHERE = `($1::idemq.job_state[] IS NULL OR j.state = ANY ($1::idemq.job_state[]))
        AND ($2::text IS NULL OR j.queue = $2::text)
        AND ($3::text IS NULL OR j.task = $3::text)
        AND ($4::text IS NULL OR j.idempotency_key = $4::text)`;

function filterParameters(filter: ListJobsFilter): unknown[] {
  const stateList =
    filter.state === undefined ? undefined : states(typeof filter.state === "string" ? [filter.state] : filter.state);
  return [stateList ?? null, text(filter.queue, "queue") ?? null, text(filter.task, "task") ?? null, text(filter.key, "key") ?? null];
}

/** Newest first. One static statement: an unset filter is a NULL parameter. */
export async function listJobs(db: Queryable, filter: ListJobsFilter = {}): Promise<Job[]> {
  const parameters = filterParameters(filter);
  const limit = integer(filter.limit, "limit") ?? CLIENT_DEFAULTS.listLimit;
  if (limit < 1) throw bad(`limit must be at least 1, got ${limit}`);
  const rows = await runQuery<JobRow>(
    db,
    `SELECT ${JOB_COLUMNS} FROM idemq.jobs j
      WHERE ${FILTER_WHERE}
      ORDER BY j.id DESC
      LIMIT $5`,
    [...parameters, limit],
  );
  return rows.map(toJob);
}

/**
 * How many jobs match the filter (its limit is ignored), counting no further
 * than `atMost`: `exact` is false when there are more. The cap keeps it cheap
 * on a table of millions of finished jobs: it reads at most atMost + 1 rows,
 * unsorted.
 */
export async function countJobs(db: Queryable, filter: ListJobsFilter, atMost: number): Promise<{ count: number; exact: boolean }> {
  const cap = integer(atMost, "atMost")!;
  if (cap < 0) throw bad(`atMost must be at least 0, got ${cap}`);
  const rows = await runQuery<{ n: number }>(
    db,
    `SELECT count(*)::int AS n FROM (SELECT FROM idemq.jobs j WHERE ${FILTER_WHERE} LIMIT $5) s`,
    [...filterParameters(filter), cap + 1],
  );
  const n = rows[0]!.n;
  return n > cap ? { count: cap, exact: false } : { count: n, exact: true };
}
