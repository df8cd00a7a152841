// Reads of jobs. getJob calls idemq.job(), which every idemq role may call (a
// producer learns what became of its job). listJobs, countJobs, jobLinks and
// keyEntry are admin reads of idemq.jobs and the tables beside it, the only
// SQL the client writes by hand rather than as a call of an idemq.* function:
// reading the tables for admin tools (CLI, dashboard) is allowed; writing
// never is.

import { CLIENT_DEFAULTS, type JobState, type RunnableWait, type WaitingReason } from "./contract.ts";
import { bad, integer, states, text, toJobId, type JobIdInput } from "./encode.ts";
import { job as jobCall, runQuery, type JobRow, type JobWaitingFor, type Queryable } from "./sql/index.ts";

export interface Job {
  id: string;
  task: string;
  queue: string;
  /**
   * The job's payload, or null when the connection's login may not read
   * idemq.jobs (a producer or worker; idemq_admin may): getJob reads through
   * idemq.job(), which shows nobody a payload they could not SELECT.
   */
  payload: unknown;
  state: JobState;
  priority: number;
  runAt: Date | null;
  /** Claims so far (the fencing token): snoozes, hand-backs and attempts before an operator's retry included. */
  attempt: number;
  /** The job's own limit (enqueue's max_attempts). */
  maxAttempts: number;
  /** The attempts that count against the limit: `attempt` less the claims that do not (snoozes, hand-backs, those before a retry). */
  countedAttempts: number;
  /**
   * The limit the attempts count against: the lowest max_attempts fail()
   * recorded in the error history (a worker's task may allow fewer than the
   * job's), else maxAttempts. A task's limit is known only once an attempt
   * failed. `countedAttempts`/`attemptLimit` is the one attempt count every
   * view shows (the CLI's and the dashboard's).
   */
  attemptLimit: number;
  idempotencyKey: string | null;
  lockedBy: string | null;
  /** When the latest attempt was claimed (kept after it finished, for the job's timeline). */
  lockedAt: Date | null;
  leaseExpiresAt: Date | null;
  /** One entry per failed attempt (attempt, started_at, failed_at, worker, max_attempts, error class, message), and one per operator retry (class "Retried"); as SQL stores them. */
  errors: unknown[];
  result: unknown;
  createdAt: Date;
  finishedAt: Date | null;
  expiresAt: Date | null;
  /** The job's concurrency key (flow control), null without one. */
  concurrencyKey: string | null;
  /**
   * Why the job is not running. An awaiting job: "parents" (a parent in
   * `after` has not succeeded) or "concurrency_key" (K jobs of its key are
   * admitted). A runnable job (enqueued, or scheduled and due): "paused",
   * "held" (its queue or task is held: a 429's Retry-After), "concurrency"
   * (its queue's or task's slots are all held) or "rate" (no start left in
   * the period); null when none holds: it waits for a worker. Null in every
   * other state.
   */
  waitingFor: JobWaitingFor | null;
}

export interface ListJobsFilter {
  state?: JobState | readonly JobState[] | undefined;
  queue?: string | undefined;
  task?: string | undefined;
  /** Idempotency key. */
  key?: string | undefined;
  /** Text anywhere in the job's error history (case-insensitive). */
  errorText?: string | undefined;
  /** Default CLIENT_DEFAULTS.listLimit. */
  limit?: number | undefined;
}


/** The lowest max_attempts fail() recorded (it records the limit each failed attempt counted against), else the job's. */
function attemptLimit(errors: readonly unknown[], maxAttempts: number): number {
  let limit = maxAttempts;
  for (const entry of errors as { max_attempts?: unknown }[]) {
    const recorded = Number(entry?.max_attempts);
    if (entry?.max_attempts != null && Number.isInteger(recorded) && recorded >= 1 && recorded < limit) limit = recorded;
  }
  return limit;
}

function toJob(r: JobRow): Job {
  const errors = r.errors ?? [];
  return {
    id: r.job_id,
    task: r.task,
    queue: r.queue,
    payload: r.payload,
    state: r.state,
    priority: r.priority,
    runAt: r.run_at,
    attempt: r.attempt,
    maxAttempts: r.max_attempts,
    countedAttempts: r.attempt - r.uncounted,
    attemptLimit: attemptLimit(errors, r.max_attempts),
    idempotencyKey: r.idempotency_key,
    lockedBy: r.locked_by,
    lockedAt: r.locked_at,
    leaseExpiresAt: r.lease_expires_at,
    errors,
    result: r.result,
    createdAt: r.created_at,
    finishedAt: r.finished_at,
    expiresAt: r.expires_at,
    concurrencyKey: r.concurrency_key ?? null,
    waitingFor: r.waiting_for ?? null,
  };
}

/** What a job waits for, as `idemq jobs show` and the dashboard's job page say it. */
const WAITING_SENTENCES: Record<WaitingReason | RunnableWait, string> = {
  parents: "its parents (after)",
  concurrency_key: "a place of its concurrency key",
  paused: "its queue or task to be resumed (paused)",
  held: "its queue's or task's hold to end (hold(): an API's Retry-After)",
  concurrency: "a free slot: its queue's or task's concurrency limit has every slot held",
  rate: "its queue's or task's rate: no start left in this period",
  worker: "a worker (no pause, hold or limit of its queue or task holds it back)",
};

/**
 * Why the job is not running, for display: job()'s waiting_for, or "worker"
 * for a runnable job (claim()'s predicate, by this machine's clock) that
 * nothing holds back (waiting_for null); null when it waits for nothing (its
 * run_at, a lease, or it has finished). The reasons themselves are the
 * database's.
 */
export function waitingFor(job: Job, now = Date.now()): WaitingReason | RunnableWait | null {
  if (job.waitingFor !== null) return job.waitingFor;
  if (job.state !== "enqueued" && job.state !== "scheduled") return null;
  if (job.runAt !== null && job.runAt.getTime() > now) return null;
  return job.expiresAt === null || job.expiresAt.getTime() > now ? "worker" : null;
}

/** waitingFor() in words ("a free slot: ..."), or null. */
export function waitingSentence(job: Job, now = Date.now()): string | null {
  const waiting = waitingFor(job, now);
  return waiting === null ? null : (WAITING_SENTENCES[waiting] ?? waiting);
}

/**
 * The attempt count as every view words it: "2 of 10", "3 of 3 (the task's
 * limit; the job's own is 10)", "1 of 10 (3 claims; 2 not counted: ...)".
 */
export function attemptsText(job: Job): string {
  const notes: string[] = [];
  if (job.attemptLimit < job.maxAttempts) notes.push(`the task's limit; the job's own is ${job.maxAttempts}`);
  if (job.countedAttempts !== job.attempt) {
    const claims = `${job.attempt} claim${job.attempt === 1 ? "" : "s"}`;
    notes.push(`${claims}; ${job.attempt - job.countedAttempts} not counted: snoozes, hand-backs, attempts before a retry`);
  }
  return `${job.countedAttempts} of ${job.attemptLimit}${notes.length === 0 ? "" : ` (${notes.join("; ")})`}`;
}

/** One job, through idemq.job() (any idemq role); null when there is no such job. */
export async function getJob(db: Queryable, jobId: JobIdInput): Promise<Job | null> {
  const row = await jobCall(db, jobId);
  return row === undefined ? null : toJob(row);
}

/**
 * The WHERE clause of listJobs and countJobs: an unset filter is a NULL
 * parameter ($1..$5). pg plans an unnamed statement with its parameters'
 * values, so an unset filter's `IS NULL` folds away; the error filter names
 * `errors <> '[]'` so the plan can use the partial index jobs_with_errors,
 * and finished states imply `finished_at IS NOT NULL` (a CHECK says so; the
 * planner cannot see it) so a count of failed jobs reads jobs_by_finish:
 * 20 ms instead of a 376 ms scan at 1,000,000 finished jobs.
 */
const FILTER_WHERE = `($1::idemq.job_state[] IS NULL OR j.state = ANY ($1::idemq.job_state[]))
        AND ($2::text IS NULL OR j.queue = $2::text)
        AND ($3::text IS NULL OR j.task = $3::text)
        AND ($4::text IS NULL OR j.idempotency_key = $4::text)
        AND ($5::text IS NULL OR (j.errors <> '[]'::jsonb AND strpos(lower(j.errors::text), lower($5::text)) > 0))
        AND (NOT coalesce($1::idemq.job_state[] <@ idemq.terminal_states(), false) OR j.finished_at IS NOT NULL)`;

function filterParameters(filter: ListJobsFilter): unknown[] {
  const stateList =
    filter.state === undefined ? undefined : states(typeof filter.state === "string" ? [filter.state] : filter.state);
  return [
    stateList ?? null,
    text(filter.queue, "queue") ?? null,
    text(filter.task, "task") ?? null,
    text(filter.key, "key") ?? null,
    text(filter.errorText, "errorText") ?? null,
  ];
}

/**
 * Newest first; `beforeId` pages on (jobs with a smaller id), so a page costs
 * the same however deep it is. One static statement: an unset filter is a
 * NULL parameter. Each row is idemq.job()'s, in the statement's snapshot, so
 * waiting_for is decided once, in SQL (a runnable job's costs a call of
 * limits()).
 */
export async function listJobs(db: Queryable, filter: ListJobsFilter & { beforeId?: JobIdInput | undefined } = {}): Promise<Job[]> {
  const parameters = filterParameters(filter);
  const limit = integer(filter.limit, "limit") ?? CLIENT_DEFAULTS.listLimit;
  if (limit < 1) throw bad(`limit must be at least 1, got ${limit}`);
  const before = filter.beforeId === undefined ? null : toJobId(filter.beforeId, "beforeId");
  const rows = await runQuery<JobRow>(
    db,
    `SELECT r.* FROM (
       SELECT j.id FROM idemq.jobs j
        WHERE ${FILTER_WHERE}
          AND ($7::bigint IS NULL OR j.id < $7::bigint)
        ORDER BY j.id DESC
        LIMIT $6) page
     CROSS JOIN LATERAL idemq.job(page.id) r
     ORDER BY page.id DESC`,
    [...parameters, limit, before],
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
    `SELECT count(*)::int AS n FROM (SELECT FROM idemq.jobs j WHERE ${FILTER_WHERE} LIMIT $6) s`,
    [...filterParameters(filter), cap + 1],
  );
  const n = rows[0]!.n;
  return n > cap ? { count: cap, exact: false } : { count: n, exact: true };
}

export interface LinkedJob {
  id: string;
  task: string;
  state: JobState;
}

/**
 * The jobs this one waits on (parents) and those waiting on it (children).
 * A dependency is deleted when its parent succeeds, so only pending ones show.
 */
export async function jobLinks(db: Queryable, jobId: JobIdInput): Promise<{ parents: LinkedJob[]; children: LinkedJob[] }> {
  const id = toJobId(jobId);
  const rows = await runQuery<LinkedJob & { side: "parent" | "child" }>(
    db,
    `SELECT 'parent' AS side, j.id, j.task, j.state FROM idemq.job_dependencies d JOIN idemq.jobs j ON j.id = d.parent_id WHERE d.child_id = $1
     UNION ALL
     SELECT 'child', j.id, j.task, j.state FROM idemq.job_dependencies d JOIN idemq.jobs j ON j.id = d.child_id WHERE d.parent_id = $1
     ORDER BY 1, 2`,
    [id],
  );
  const linked = (side: string) => rows.filter((r) => r.side === side).map(({ id, task, state }) => ({ id, task, state }));
  return { parents: linked("parent"), children: linked("child") };
}

export interface KeyEntry {
  key: string;
  /** The latest job that used the key (enqueue's duplicate policy is judged against it). */
  jobId: string;
  /** Null while that job is active. */
  finishedState: JobState | null;
  finishedAt: Date | null;
  createdAt: Date;
}

/** The idempotency-key ledger's entry for `key` (kept after its job is purged, until prune_keys). */
export async function keyEntry(db: Queryable, key: string): Promise<KeyEntry | null> {
  const rows = await runQuery<{ key: string; job_id: string; finished_state: JobState | null; finished_at: Date | null; created_at: Date }>(
    db,
    "SELECT k.key, k.job_id, k.finished_state, k.finished_at, k.created_at FROM idemq.keys k WHERE k.key = $1",
    [key],
  );
  const r = rows[0];
  return r === undefined
    ? null
    : { key: r.key, jobId: r.job_id, finishedState: r.finished_state, finishedAt: r.finished_at, createdAt: r.created_at };
}
