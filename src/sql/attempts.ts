// One attempt's calls, from claim() to its end: complete (one, many, or with
// COMMIT in one round trip), fail, snooze, and heartbeat while it runs; and
// the wait marker (wait_for_jobs, stop_waiting) a listening worker claims by.
// Every call after claim() presents the attempt's fencing token (JobAttempt).

import pg from "pg";
import type { Backoff, Duration } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import {
  bad,
  instant,
  integer,
  interval,
  jsonb,
  leaseToken,
  requiredText,
  toBackoffJson,
  toJobId,
  type Instant,
  type JobIdInput,
} from "../encode.ts";
import { call, callInline, fromNow, scalar, type Queryable } from "./call.ts";

export interface ClaimOptions {
  workerId: string;
  queues?: readonly string[] | undefined;
  batchSize?: number;
  lease?: Duration;
  /** Only jobs of these tasks (default: any task). */
  tasks?: readonly string[];
}

export interface ClaimedJob {
  id: string;
  task: string;
  queue: string;
  payload: unknown;
  attempt: number;
  maxAttempts: number;
  idempotencyKey: string | null;
  /** The previous attempt lost its lease: its effect may have happened. */
  reclaimed: boolean;
  /** The W3C traceparent the enqueue stored (null without one): the attempt span's parent. */
  traceparent: string | null;
  /** The size of the payload as it arrived: bytes of UTF-8 of its JSON text (the worker's prefetch budget counts these). */
  payloadBytes: number;
  /**
   * This claim's lease token (a uuid), which complete, fail, snooze and
   * heartbeat of this attempt must present: no other worker can guess it.
   * Never logged, never stored elsewhere: it is what fences the attempt.
   */
  leaseToken: string;
  /** The job's time limit per attempt (enqueue's timeout) in ms; null without one. */
  timeoutMs: number | null;
  /**
   * The job's concurrency key (enqueue's concurrencyKey); null without one,
   * and from a server before 0.2.0's column. A completion of jobs none of
   * which has one frees no key, so it can hand over nothing.
   */
  concurrencyKey: string | null;
}

/** The fencing token of one attempt: the job, the attempt and the lease token claim() returned with it. */
export interface JobAttempt {
  jobId: JobIdInput;
  attempt: number;
  /** null only for an attempt claimed before 0.2.0 (claim() gave none). */
  leaseToken: string | null;
}

export async function claim(db: Queryable, opts: ClaimOptions): Promise<ClaimedJob[]> {
  if (opts.queues !== undefined && (!Array.isArray(opts.queues) || opts.queues.some((q) => typeof q !== "string"))) {
    throw bad("queues must be an array of queue names");
  }
  if (opts.tasks !== undefined && (!Array.isArray(opts.tasks) || opts.tasks.some((t) => typeof t !== "string"))) {
    throw bad("tasks must be an array of task names");
  }
  // payload is the one jsonb column of idemq.claimed_job: sizes[i] is row i's.
  const sizes: number[] = [];
  const rows = await call<"claim", ClaimedJobRow>(
    db,
    "claim",
    {
      worker_id: requiredText(opts.workerId, "workerId"),
      queues: opts.queues === undefined ? undefined : [...opts.queues],
      batch_size: integer(opts.batchSize, "batchSize"),
      lease: interval(opts.lease),
      tasks: opts.tasks === undefined ? undefined : [...opts.tasks],
      // Always a lease token: no other worker can finish, fail or extend these attempts by guessing them.
      token: true,
    },
    "",
    claimTypes(sizes),
  );
  if (sizes.length !== rows.length) throw new Error(`claim: ${rows.length} rows but ${sizes.length} payloads measured`);
  return rows.map((r, i) => claimedJob(r, sizes[i]!));
}

/** A row of claim()'s shape (claim, complete_and_take_next) as a ClaimedJob; `payloadBytes` measured by claimTypes. */
function claimedJob(r: ClaimedJobRow, payloadBytes: number): ClaimedJob {
  return {
    payloadBytes,
    id: r.job_id,
    task: r.task,
    queue: r.queue,
    payload: r.payload,
    attempt: r.attempt,
    maxAttempts: r.max_attempts,
    idempotencyKey: r.idempotency_key,
    reclaimed: r.reclaimed,
    traceparent: r.traceparent,
    leaseToken: r.lease_token,
    timeoutMs: r.timeout ?? null,
    concurrencyKey: r.concurrency_key ?? null,
  };
}

const INT8_OID = 20;
const JSONB_OID = 3802;
const TIMESTAMPTZ_OID = 1184;
const INTERVAL_OID = 1186;

/** An interval's text (PostgreSQL's default IntervalStyle) in ms; a month counts 30 days, as justify_interval does. */
function intervalMs(text: string): number {
  const i = pg.types.getTypeParser(INTERVAL_OID, "text")(text) as {
    years?: number; months?: number; days?: number; hours?: number; minutes?: number; seconds?: number; milliseconds?: number;
  };
  const days = (i.years ?? 0) * 360 + (i.months ?? 0) * 30 + (i.days ?? 0);
  return (((days * 24 + (i.hours ?? 0)) * 60 + (i.minutes ?? 0)) * 60 + (i.seconds ?? 0)) * 1000 + (i.milliseconds ?? 0);
}
const asText = (text: string): string => text;

/**
 * int8 kept as the text the server sent: a bigint's text is its digits, so
 * an id stays a string, exact, as pg's own parser keeps it, without that
 * parser's copy and regular expression per value (170 B per job of the
 * worker's allocations, bench/FINDINGS.md). Per query, on the calls whose ids
 * the worker matches with each other (claim, heartbeat, its complete_many),
 * so an application's setTypeParser for int8 (pg's parsers are global) can
 * neither reach them nor make heartbeat's ids differ from claim's.
 */
const INT8_AS_TEXT: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === INT8_OID && format !== "binary" ? asText : pg.types.getTypeParser(oid, format)) as pg.CustomTypesConfig["getTypeParser"],
};

/**
 * claim()'s type parsers: jsonb parsed as pg does, noting the size of each
 * value's text, in bytes of UTF-8, in `sizes` (in the order the values
 * arrive: row by row), so a claim learns its payloads' sizes without
 * serializing them again; timestamptz left as text, since no caller reads
 * the lease's end from a claim (pg's date parsing was 4% of the worker's CPU);
 * the one interval, timeout, in ms; int8 (id and job_id) as INT8_AS_TEXT.
 */
function claimTypes(sizes: number[]): pg.CustomTypesConfig {
  return {
    getTypeParser: ((oid: number, format?: "text" | "binary") => {
      if ((oid === TIMESTAMPTZ_OID || oid === INT8_OID) && format !== "binary") return asText;
      if (oid === INTERVAL_OID && format !== "binary") return intervalMs;
      if (oid !== JSONB_OID || format === "binary") return pg.types.getTypeParser(oid, format);
      return (text: string) => {
        sizes.push(Buffer.byteLength(text));
        return JSON.parse(text) as unknown;
      };
    }) as pg.CustomTypesConfig["getTypeParser"],
  };
}

/**
 * Declares the session of `client` waiting for jobs of `queues` (all when
 * undefined): enqueues into them NOTIFY idemq_jobs from now on. True once a
 * claim would see every job that became runnable without a NOTIFY; false, at
 * once, while such an enqueue is still open or another session holds one of
 * the keys (call again shortly; it never blocks). The marker lives as long
 * as the session, so `client` must be a connection held for good, not a pool.
 */
export async function waitForJobs(client: pg.ClientBase, queues?: readonly string[]): Promise<boolean> {
  return scalar<"wait_for_jobs", boolean>(client, "wait_for_jobs", { queues: queues === undefined ? undefined : [...queues] });
}

/** Ends waitForJobs(queues) for the session of `client`. */
export async function stopWaiting(client: pg.ClientBase, queues?: readonly string[]): Promise<void> {
  await call(client, "stop_waiting", { queues: queues === undefined ? undefined : [...queues] });
}

interface ClaimedJobRow {
  job_id: string;
  task: string;
  queue: string;
  payload: unknown;
  attempt: number;
  max_attempts: number;
  idempotency_key: string | null;
  /** Left as text (claimTypes), unread. */
  lease_expires_at: string;
  reclaimed: boolean;
  traceparent: string | null;
  lease_token: string;
  /** Parsed to ms (claimTypes); absent before 0.2.0's column. */
  timeout?: number | null;
  /** Absent before 0.2.0's column. */
  concurrency_key?: string | null;
}

function attemptArrays(jobs: readonly JobAttempt[]): { job_ids: string[]; attempts: number[]; lease_tokens: (string | null)[] } {
  if (!Array.isArray(jobs)) throw bad("jobs must be an array of { jobId, attempt, leaseToken }");
  return {
    job_ids: jobs.map((j) => toJobId(j.jobId)),
    attempts: jobs.map((j) => integer(j.attempt, "attempt")!),
    lease_tokens: jobs.map((j) => leaseToken(j.leaseToken)),
  };
}

/**
 * complete(); `resultJson` is the result's JSON text, already serialized
 * (the worker measures it against the limit first: it is not serialized twice).
 */
export async function complete(
  db: Queryable,
  jobId: JobIdInput,
  attempt: number,
  token: string | null,
  resultJson?: string,
): Promise<void> {
  await call(db, "complete", {
    job_id: toJobId(jobId),
    attempt: integer(attempt, "attempt"),
    result: resultJson,
    lease_token: leaseToken(token),
  });
}

/** complete() and COMMIT in one round trip, on the connection whose transaction holds the job's writes; `resultJson` as complete()'s. */
export async function completeAndCommit(
  client: pg.ClientBase,
  jobId: JobIdInput,
  attempt: number,
  token: string | null,
  resultJson?: string,
): Promise<void> {
  await callInline(
    client,
    "complete",
    { job_id: toJobId(jobId), attempt: integer(attempt, "attempt"), result: resultJson, lease_token: leaseToken(token) },
    { after: "COMMIT" },
  );
}

/** Completes the attempts that still hold their jobs; returns the ids completed. */
export async function completeMany(db: Queryable, jobs: readonly JobAttempt[]): Promise<string[]> {
  const rows = await call<"complete_many", { r: string }>(db, "complete_many", attemptArrays(jobs));
  return rows.map((row) => row.r);
}

/** completeMany() for the worker's batches (attemptLiterals). */
export async function completeClaimed(db: Queryable, jobs: readonly { readonly job: ClaimedJob }[]): Promise<string[]> {
  const rows = await call<"complete_many", { r: string }>(db, "complete_many", attemptLiterals(jobs), "", INT8_AS_TEXT);
  return rows.map((row) => row.r);
}

/** Where complete_and_take_next hands the freed keys' next jobs: claim()'s options but the batch size. */
export type TakeNextOptions = Omit<ClaimOptions, "batchSize">;

/**
 * completeClaimed(), and the next job of each concurrency key the completion
 * frees that this worker's next claim would take first, claimed for it in
 * the same statement (complete_and_take_next): the ids completed, and the
 * jobs handed over, to run as claimed ones.
 */
export async function completeAndTakeNext(
  db: Queryable,
  jobs: readonly { readonly job: ClaimedJob }[],
  opts: TakeNextOptions,
): Promise<{ completed: string[]; handed: ClaimedJob[] }> {
  const sizes: number[] = [];
  const rows = await call<"complete_and_take_next", ClaimedJobRow & { completed: string | null }>(
    db,
    "complete_and_take_next",
    {
      ...attemptLiterals(jobs),
      worker_id: opts.workerId,
      queues: opts.queues === undefined ? undefined : [...opts.queues],
      lease: interval(opts.lease),
      tasks: opts.tasks === undefined ? undefined : [...opts.tasks],
    },
    "",
    claimTypes(sizes),
  );
  const completed: string[] = [];
  const handed: ClaimedJob[] = [];
  // Completed rows come first and have no payload: sizes[k] is the k-th handed job's.
  for (const r of rows) {
    if (r.completed !== null) completed.push(r.completed);
    else handed.push(claimedJob(r, sizes[handed.length]!));
  }
  if (sizes.length !== handed.length) throw new Error(`complete_and_take_next: ${handed.length} jobs but ${sizes.length} payloads measured`);
  return { completed, handed };
}

/**
 * The worker's attempts as array literals, unchecked: ids are claim()'s
 * (digit strings), attempts integers and lease tokens claim()'s uuids, none
 * of which needs quoting; checking and pg's array escaping cost more per job
 * than the rest of the call.
 */
function attemptLiterals(jobs: readonly { readonly job: ClaimedJob }[]): { job_ids: string; attempts: string; lease_tokens: string } {
  let ids = "";
  let attempts = "";
  let tokens = "";
  for (const { job } of jobs) {
    ids += ids === "" ? job.id : `,${job.id}`;
    attempts += attempts === "" ? String(job.attempt) : `,${job.attempt}`;
    tokens += tokens === "" ? job.leaseToken : `,${job.leaseToken}`;
  }
  return { job_ids: `{${ids}}`, attempts: `{${attempts}}`, lease_tokens: `{${tokens}}` };
}

export interface FailOptions {
  /** false fails the job at once, whatever attempts remain. */
  retryable?: boolean;
  /** Overrides the backoff for the next attempt. */
  retryAt?: Instant;
  /** The backoff to use instead of the job's (delay by counted attempts, database clock). */
  backoff?: Backoff;
  /** A limit lower than the job's max_attempts (counted attempts: snoozes do not count). */
  maxAttempts?: number;
  /** false: record the error without spending the attempt, retry at once (a hand-back at shutdown). */
  counted?: boolean;
}

/** What fail() decided: the job's new state, and when its retry runs (null when it failed). */
export type FailOutcome =
  /** runAt: the run_at fail() stored for the retry, on the database clock. */
  | { state: "scheduled"; runAt: Date }
  | { state: "failed"; runAt: null };

/** Records a failed attempt; returns the job's new state and, for a retry, the run_at SQL chose. */
export async function fail(
  db: Queryable,
  jobId: JobIdInput,
  attempt: number,
  token: string | null,
  error: unknown,
  opts: FailOptions = {},
): Promise<FailOutcome> {
  const rows = await call<"fail", { state: FailOutcome["state"]; run_at: Date | null }>(db, "fail", {
    job_id: toJobId(jobId),
    attempt: integer(attempt, "attempt"),
    error: jsonb(error, "error") ?? null,
    retryable: opts.retryable,
    retry_at: instant(opts.retryAt, "retryAt"),
    backoff: opts.backoff === undefined ? undefined : JSON.stringify(toBackoffJson(opts.backoff)),
    max_attempts: opts.maxAttempts === undefined ? undefined : integer(opts.maxAttempts, "maxAttempts"),
    counted: opts.counted,
    lease_token: leaseToken(token),
  });
  const { state, run_at: runAt } = rows[0]!;
  return state === "failed" ? { state, runAt: null } : { state, runAt: runAt! };
}

/** Extends the leases still held; returns their job ids (a missing id was lost). */
export async function heartbeat(
  db: Queryable,
  jobs: readonly JobAttempt[],
  opts: { lease?: Duration } = {},
): Promise<string[]> {
  const rows = await call<"heartbeat", { r: string }>(db, "heartbeat", { ...attemptArrays(jobs), lease: interval(opts.lease) }, "", INT8_AS_TEXT);
  return rows.map((row) => row.r);
}

/** Back to `scheduled` without spending an attempt: give exactly one of runAt or delay. */
export async function snooze(
  db: Queryable,
  jobId: JobIdInput,
  attempt: number,
  token: string | null,
  when: { runAt: Instant; delay?: undefined } | { delay: Duration; runAt?: undefined },
): Promise<void> {
  await call(db, "snooze", {
    job_id: toJobId(jobId),
    attempt: integer(attempt, "attempt"),
    run_at: runAtArg(when, "snooze"),
    lease_token: leaseToken(token),
  });
}

/** Records a held attempt's progress, a percentage 0..100 (fenced like complete). */
export async function progress(db: Queryable, jobId: JobIdInput, attempt: number, value: number, token: string | null): Promise<void> {
  await call(db, "progress", {
    job_id: toJobId(jobId),
    attempt: integer(attempt, "attempt"),
    value: integer(value, "value"),
    lease_token: leaseToken(token),
  });
}

function runAtArg(when: { runAt?: Instant | undefined; delay?: Duration | undefined }, what: string): unknown {
  if ((when.runAt === undefined) === (when.delay === undefined)) {
    throw bad(`${what} needs exactly one of runAt or delay`);
  }
  if (when.runAt !== undefined) return instant(when.runAt, "runAt");
  return fromNow(toPgInterval(when.delay!));
}
