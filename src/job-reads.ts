// Reads of jobs. getJob calls idemq.job(), which every idemq role may call (a
// producer learns what became of its job); listJobs and countJobs call
// find_jobs and count_jobs (the admin and viewer roles), whose filter is SQL's. jobLinks and
// keyEntry are admin reads of the tables beside idemq.jobs, the only SQL the
// client writes by hand rather than as a call of an idemq.* function:
// reading the tables for admin tools (CLI, dashboard) is allowed; writing
// never is.

import { CLIENT_DEFAULTS, JOB_FILTER_FIELDS, type JobState, type RunnableWait, type WaitingReason } from "./contract.ts";
import { bad, instant, integer, states, toJobId, type Instant, type JobIdInput } from "./encode.ts";
import {
  countJobs as countJobsCall,
  findJobs,
  job as jobCall,
  runQuery,
  type JobRow,
  type JobWaitingFor,
  type Queryable,
  type SqlJobFilter,
  type StepRow,
} from "./sql/index.ts";

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
  /** The latest attempt's progress, a percentage (0..100) its handler reported (ctx.progress); null when it reported none. Cleared by the next claim. */
  progress: number | null;
}

/**
 * Which jobs: every field set must match (AND). The rules of each field are
 * SQL's (sql/functions/search/_check_job_filter.sql), which refuses a bad
 * one with BadArgumentError (22023) naming the field.
 */
export interface JobFilter {
  ids?: readonly JobIdInput[] | undefined;
  state?: JobState | readonly JobState[] | undefined;
  queue?: string | undefined;
  task?: string | undefined;
  /** Idempotency key. */
  key?: string | undefined;
  concurrencyKey?: string | undefined;
  /** Text in the job's last error ("Class: message"), any case. */
  errorText?: string | undefined;
  /** Created at or after. */
  createdAfter?: Instant | undefined;
  /** Created before. */
  createdBefore?: Instant | undefined;
  finishedAfter?: Instant | undefined;
  finishedBefore?: Instant | undefined;
  /** JSON the payload must contain (`@>`); needs task, key or ids beside it. */
  payload?: Record<string, unknown> | undefined;
}

export interface ListJobsFilter extends JobFilter {
  /** Default CLIENT_DEFAULTS.listLimit. */
  limit?: number | undefined;
}

/** The filter as SQL takes it (JOB_FILTER_FIELDS names each field); unset fields are left out. */
export function sqlJobFilter(filter: JobFilter): SqlJobFilter {
  const out: Record<string, unknown> = {};
  for (const [field, sqlField] of Object.entries(JOB_FILTER_FIELDS) as [keyof JobFilter, string][]) {
    const value = filter[field];
    if (value === undefined) continue;
    if (field === "state") {
      const list = typeof value === "string" ? [value] : value;
      out[sqlField] = Array.isArray(list) ? states(list as JobState[]) : list;
    } else if (field === "ids") {
      out[sqlField] = Array.isArray(value) ? (value as JobIdInput[]).map((id) => toJobId(id, "ids")) : value;
    } else if (value instanceof Date) {
      out[sqlField] = instant(value, field);
    } else {
      out[sqlField] = value;
    }
  }
  return out;
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

export function toJob(r: JobRow): Job {
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
    progress: r.progress ?? null,
  };
}

/** What a job waits for, as `idemq jobs show` and the dashboard's job page say it. */
const WAITING_SENTENCES: Record<WaitingReason | RunnableWait, string> = {
  parents: "its parents (after)",
  concurrency_key: "a place of its concurrency key",
  children: "its children to finish (spawn, wait_for_children; or a batch's jobs)",
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

/**
 * One piece of a step's status phrase: words, the event the step waits for
 * or received (null for none), or the ledger's wake_at (a sleep's end, a
 * wait's timeout). Each view prints the event and the instant its own way.
 */
export type StepPhrasePart = string | { event: string | null; key: string | null } | { at: Date | null };

/** A step's status as `idemq jobs show` and the dashboard's job page word it. */
export function stepPhrase(step: StepRow): StepPhrasePart[] {
  const event = { event: step.event, key: step.eventKey };
  const at = { at: step.wakeAt };
  switch (step.status) {
    case "sleeping":
      return [step.over ? "slept until " : "sleeping until ", at];
    case "waiting":
      return ["waiting for ", event, ", times out ", at];
    case "received":
      return ["received ", event];
    case "timed_out":
      return ["timed out waiting for ", event, ", ", at];
    default:
      return [step.status];
  }
}

/** One job, through idemq.job() (any idemq role); null when there is no such job. */
export async function getJob(db: Queryable, jobId: JobIdInput): Promise<Job | null> {
  const row = await jobCall(db, jobId);
  return row === undefined ? null : toJob(row);
}

/** find_jobs' largest page: listJobs asks for pages of this size up to its limit. */
const FIND_PAGE = 1000;

/**
 * Newest first, through find_jobs (its filter, its plan); `beforeId` pages on
 * (jobs with a smaller id), so a page costs the same however deep it is.
 */
export async function listJobs(db: Queryable, filter: ListJobsFilter & { beforeId?: JobIdInput | undefined } = {}): Promise<Job[]> {
  const sqlFilter = sqlJobFilter(filter);
  const limit = integer(filter.limit, "limit") ?? CLIENT_DEFAULTS.listLimit;
  if (limit < 1) throw bad(`limit must be at least 1, got ${limit}`);
  let before = filter.beforeId === undefined ? undefined : toJobId(filter.beforeId, "beforeId");
  const jobs: Job[] = [];
  while (jobs.length < limit) {
    const pageSize = Math.min(FIND_PAGE, limit - jobs.length);
    const rows = await findJobs(db, sqlFilter, { beforeId: before, pageSize });
    jobs.push(...rows.map(toJob));
    if (rows.length < pageSize) break;
    before = rows.at(-1)!.job_id;
  }
  return jobs;
}

/**
 * How many jobs match the filter (its limit is ignored), counting no further
 * than `atMost` (count_jobs): `exact` is false when there are more.
 */
export async function countJobs(db: Queryable, filter: JobFilter, atMost: number): Promise<{ count: number; exact: boolean }> {
  const cap = integer(atMost, "atMost")!;
  const { jobs, exact } = await countJobsCall(db, sqlJobFilter(filter), { atMost: cap });
  return { count: jobs, exact };
}

/**
 * `read`'s rows, or null when the login's role may not call the function it
 * reads through (42501): steps() is the worker's and admin's, not the
 * producer's or the viewer's, and a view of a job says so rather than fail.
 */
export async function unlessRefused<T>(read: Promise<T>): Promise<T | null> {
  try {
    return await read;
  } catch (error) {
    if ((error as { code?: unknown }).code === "42501") return null;
    throw error;
  }
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
    // (id, id) is the gate of a job parked by wait_for_children, not a link.
    `SELECT 'parent' AS side, j.id, j.task, j.state FROM idemq.job_dependencies d JOIN idemq.jobs j ON j.id = d.parent_id
       WHERE d.child_id = $1 AND d.parent_id <> d.child_id
     UNION ALL
     SELECT 'child', j.id, j.task, j.state FROM idemq.job_dependencies d JOIN idemq.jobs j ON j.id = d.child_id
       WHERE d.parent_id = $1 AND d.parent_id <> d.child_id
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

export interface JobInHand {
  id: string;
  task: string;
  workerId: string;
  /** When this attempt was claimed: its running time is now less this. */
  lockedAt: Date;
  leaseExpiresAt: Date;
}

/**
 * The jobs each of these workers holds now (processing, locked_by its id),
 * oldest claim first: the dashboard's workers page. Reads only processing
 * rows, a small set however large the table.
 */
export async function jobsInHand(db: Queryable, workerIds: readonly string[]): Promise<JobInHand[]> {
  if (workerIds.length === 0) return [];
  const rows = await runQuery<{ id: string; task: string; locked_by: string; locked_at: Date; lease_expires_at: Date }>(
    db,
    `SELECT j.id, j.task, j.locked_by, j.locked_at, j.lease_expires_at FROM idemq.jobs j
     WHERE j.state = 'processing' AND j.locked_by = ANY ($1::text[]) ORDER BY j.locked_at, j.id`,
    [workerIds],
  );
  return rows.map((r) => ({ id: r.id, task: r.task, workerId: r.locked_by, lockedAt: r.locked_at, leaseExpiresAt: r.lease_expires_at }));
}
