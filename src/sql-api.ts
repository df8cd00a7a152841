// The one module through which the TypeScript runtime calls idemq's SQL.
// Functions are called with the parameters given from the first one on by
// position and the rest by name (buildCall), and options left undefined are
// left out of the call, so each default lives once, in SQL. The argument list
// follows the function's declared parameter order (SQL_FUNCTIONS), never the
// caller's key order, so the same set of options always gives the same
// statement text. Ids are bigint in SQL and exact strings here.
// One exported function per SQL function, so the module is a little over
// 400 lines: splitting it would scatter the call shapes it exists to gather.

import pg from "pg";
import { randomUUID } from "node:crypto";
import {
  toBackoffJson,
  toPgInterval,
  type Backoff,
  type Duration,
  type DuplicatePolicy,
  type EffectStatus,
  type EnqueueOutcome,
  type JobState,
  type ScheduleMisfire,
  type ScheduleOverlap,
  type StatsMetric,
  SCHEDULE_MISFIRES,
  SCHEDULE_OVERLAPS,
} from "./contract.ts";
import { fromPgError } from "./errors.ts";
import {
  bad,
  instant,
  integer,
  interval,
  jsonb,
  oneOf,
  optionalJobIds,
  policy,
  requiredText,
  states,
  text,
  toJobId,
  type Instant,
  type JobIdInput,
} from "./encode.ts";

export type { Instant, JobIdInput } from "./encode.ts";

/** Anything with pg's promise `query`: a pg.Pool, pg.PoolClient or pg.Client. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<pg.QueryResult>;
}

/** Parameters of each public SQL function, in declaration order (docs/design.md, "SQL API"). */
export const SQL_FUNCTIONS = {
  enqueue: [
    "task",
    "payload",
    "queue",
    "run_at",
    "priority",
    "max_attempts",
    "idempotency_key",
    "duplicate_policy",
    "backoff",
    "expires_at",
    "after",
    "key_retention",
    "traceparent",
  ],
  enqueue_many: ["jobs"],
  job: ["job_id"],
  claim: ["worker_id", "queues", "batch_size", "lease", "tasks", "token"],
  complete: ["job_id", "attempt", "result", "lease_token"],
  complete_many: ["job_ids", "attempts", "lease_tokens"],
  fail: ["job_id", "attempt", "error", "retryable", "retry_at", "backoff", "max_attempts", "counted", "lease_token"],
  heartbeat: ["job_ids", "attempts", "lease", "lease_tokens"],
  snooze: ["job_id", "attempt", "run_at", "lease_token"],
  rescue: [],
  guard: ["key", "task"],
  effect_claim: ["key", "owner", "stale_after", "job_id", "attempt", "lease_token"],
  effect_done: ["key", "owner", "result"],
  effect_release: ["key", "owner"],
  cancel: ["job_id"],
  retry: ["job_id"],
  reschedule: ["job_id", "run_at"],
  purge: ["older_than", "states", "batch_size"],
  prune_keys: ["older_than"],
  apply_retention: ["batch_size"],
  set_retention: ["state", "keep", "queue", "task"],
  stats: [],
  overview: ["recent", "exact_up_to"],
  retry_horizon: ["backoff", "counted_attempts", "max_attempts"],
  wait_for_jobs: ["queues"],
  stop_waiting: ["queues"],
  schedule: [
    "name",
    "cron",
    "task",
    "payload",
    "queue",
    "timezone",
    "overlap",
    "misfire",
    "misfire_grace",
    "priority",
    "max_attempts",
  ],
  unschedule: ["name"],
  schedules: [],
  schedule_next: ["cron", "timezone", "after", "count"],
  tick: [],
  worker_seen: ["worker_id", "queues", "tasks"],
  worker_stopped: ["worker_id"],
  workers: [],
  unserved_jobs: ["seen_within"],
  schema_version: [],
  set_limit: ["queue", "task", "concurrency", "rate", "per", "per_key"],
  clear_limit: ["queue", "task"],
  pause: ["queue", "task"],
  resume: ["queue", "task"],
  limits: [],
} as const satisfies Record<string, readonly string[]>;

export type SqlFunction = keyof typeof SQL_FUNCTIONS;
type ParamOf<F extends SqlFunction> = (typeof SQL_FUNCTIONS)[F][number];

/** An argument computed in SQL from a parameter, e.g. now() + an interval. */
class SqlExpression {
  constructor(
    readonly value: unknown,
    readonly sql: (placeholder: string) => string,
  ) {}
}

type Arg = unknown;
type Args<F extends SqlFunction> = Partial<Record<ParamOf<F>, Arg>>;

/**
 * Builds `SELECT * FROM idemq.fn($1, $2, name => $3, ...) AS r`: the
 * parameters given from the first on without a gap are passed by position,
 * the rest by name. Undefined arguments are left out (SQL's default
 * applies); null is passed as SQL NULL. A function returning a scalar
 * yields one column named `r`.
 * Why positional where it can: PostgreSQL parses every call anew, and a
 * call in named notation costs the server more to resolve: `SELECT * FROM
 * idemq.enqueue(task => 'noop', payload => '{}')` took 869k instructions a
 * call against 851k for `enqueue('noop', '{}')` (callgrind, PostgreSQL 15,
 * each call its own transaction, before migration 0029; bench/FINDINGS.md).
 * Positional arguments bind by declaration order, which a contract test
 * holds equal to SQL_FUNCTIONS.
 */
export function buildCall<F extends SqlFunction>(
  fn: F,
  args: Args<F>,
  suffix = "",
): { text: string; values: unknown[] } {
  const passed: string[] = [];
  const values: unknown[] = [];
  let positional = true;
  for (const name of SQL_FUNCTIONS[fn] as readonly ParamOf<F>[]) {
    const arg = args[name];
    if (arg === undefined) {
      positional = false;
      continue;
    }
    values.push(arg instanceof SqlExpression ? arg.value : arg);
    const placeholder = `$${values.length}`;
    const value = arg instanceof SqlExpression ? arg.sql(placeholder) : placeholder;
    passed.push(positional ? value : `${name} => ${value}`);
  }
  return { text: `SELECT * FROM idemq.${fn}(${passed.join(", ")}) AS r${suffix}`, values };
}

/** Runs one statement, mapping SQL errors to idemq's classes. */
export async function runQuery<R extends pg.QueryResultRow>(
  db: Queryable,
  sql: string,
  values: unknown[],
  types?: pg.CustomTypesConfig,
): Promise<R[]> {
  try {
    if (types === undefined) return (await db.query(sql, values)).rows as R[];
    // Only idemq's own calls pass types, always on a pg.Pool or client.
    return (await (db as unknown as pg.ClientBase).query({ text: sql, values, types })).rows as R[];
  } catch (err) {
    throw fromPgError(err, databaseOf(db));
  }
}

/**
 * The database a pool or client is set up for, read from its settings (no
 * query: after an error the caller's transaction may be aborted), for error
 * messages; undefined when they do not say.
 */
function databaseOf(db: Queryable): string | undefined {
  const { database, options } = db as { database?: unknown; options?: { database?: unknown; connectionString?: unknown } };
  // pg.Client and pg.PoolClient resolve their settings (URL, PGDATABASE) into `database`.
  if (typeof database === "string" && database !== "") return database;
  if (typeof options?.database === "string" && options.database !== "") return options.database;
  if (typeof options?.connectionString === "string") {
    try {
      const name = decodeURIComponent(new URL(options.connectionString).pathname.slice(1));
      if (name !== "") return name;
    } catch {
      // not a URL (e.g. "host=... dbname=..."): leave the name out
    }
  }
  return undefined;
}

function call<F extends SqlFunction, R extends pg.QueryResultRow>(
  db: Queryable,
  fn: F,
  args: Args<F>,
  suffix = "",
  types?: pg.CustomTypesConfig,
): Promise<R[]> {
  const { text, values } = buildCall(fn, args, suffix);
  return runQuery<R>(db, text, values, types);
}

const JSONB_OID = 3802;
const TIMESTAMPTZ_OID = 1184;
const asText = (text: string): string => text;

/**
 * claim()'s type parsers: jsonb parsed as pg does, noting the size of each
 * value's text, in bytes of UTF-8, in `sizes` (in the order the values
 * arrive: row by row), so a claim learns its payloads' sizes without
 * serializing them again; timestamptz left as text, since no caller reads
 * the lease's end from a claim (pg's date parsing was 4% of the worker's CPU).
 */
function claimTypes(sizes: number[]): pg.CustomTypesConfig {
  return {
    getTypeParser: ((oid: number, format?: "text" | "binary") => {
      if (oid === TIMESTAMPTZ_OID && format !== "binary") return asText;
      if (oid !== JSONB_OID || format === "binary") return pg.types.getTypeParser(oid, format);
      return (text: string) => {
        sizes.push(Buffer.byteLength(text));
        return JSON.parse(text) as unknown;
      };
    }) as pg.CustomTypesConfig["getTypeParser"],
  };
}

/**
 * One simple-protocol round trip for `before; SELECT * FROM idemq.fn(...) AS r; after`,
 * the arguments inlined as escaped literals (strings, numbers or JSON text;
 * the function's parameter types resolve them). Returns the call's rows. A
 * transactional job uses it to send BEGIN with guard() and complete() with
 * COMMIT: two round trips fewer per job. An error stops the string there.
 */
async function callInline<F extends SqlFunction, R extends pg.QueryResultRow>(
  client: pg.ClientBase,
  fn: F,
  args: Args<F>,
  around: { before?: string; after?: string },
): Promise<R[]> {
  const named: string[] = [];
  for (const name of SQL_FUNCTIONS[fn] as readonly ParamOf<F>[]) {
    const arg = args[name];
    if (arg === undefined) continue;
    if (arg instanceof SqlExpression) throw new TypeError(`callInline: ${fn}(${name}) cannot be inlined`);
    named.push(`${name} => ${arg === null ? "NULL" : client.escapeLiteral(typeof arg === "string" ? arg : JSON.stringify(arg))}`);
  }
  const statements = [around.before, `SELECT * FROM idemq.${fn}(${named.join(", ")}) AS r`, around.after];
  const text = statements.filter((t) => t !== undefined).join("; ");
  let results: pg.QueryResult<R> | pg.QueryResult<R>[];
  try {
    results = (await client.query(text)) as unknown as pg.QueryResult<R> | pg.QueryResult<R>[];
  } catch (err) {
    throw fromPgError(err, databaseOf(client));
  }
  const all = Array.isArray(results) ? results : [results];
  // The function's result comes before the statements of `after`, whatever `before` holds.
  return all[all.length - 1 - (around.after === undefined ? 0 : around.after.split(";").length)]!.rows;
}

async function scalar<F extends SqlFunction, T>(db: Queryable, fn: F, args: Args<F>): Promise<T> {
  const rows = await call<F, { r: T }>(db, fn, args);
  return rows[0]!.r;
}

// ------------------------------------------------------------- enqueue

export interface EnqueueOptions {
  queue?: string | undefined;
  /** When the job becomes runnable; exclusive with `delay`. */
  runAt?: Instant | undefined;
  /** Runnable after this long, measured by the database clock; exclusive with `runAt`. */
  delay?: Duration | undefined;
  /** Higher runs first. */
  priority?: number | undefined;
  maxAttempts?: number | undefined;
  idempotencyKey?: string | undefined;
  duplicatePolicy?: DuplicatePolicy | undefined;
  backoff?: Backoff | undefined;
  expiresAt?: Instant | undefined;
  /** Parent jobs: this job waits in `awaiting` until they finish. */
  after?: readonly JobIdInput[] | undefined;
  /**
   * With a key: how long the key stays held after its job finished (SQL default 14 days);
   * prune_keys never releases it sooner, whatever its own olderThan.
   */
  keyRetention?: Duration | undefined;
  /**
   * The W3C traceparent to store on the job (the worker's attempt spans
   * continue its trace). With tracing on (@opentelemetry/api installed, the
   * Client's default) the enqueue span's own is stored, a child of this one
   * when given, else of the active context; leave it out.
   */
  traceparent?: string | undefined;
}

export interface EnqueueResult {
  jobId: string;
  deduplicated: boolean;
}

export async function enqueue(
  db: Queryable,
  task: string,
  payload?: unknown,
  opts: EnqueueOptions = {},
): Promise<EnqueueResult> {
  const { jobId, deduplicated } = await enqueueTraced(db, task, payload, opts);
  return { jobId, deduplicated };
}

/** enqueue(), with the trace context stored on the job returned (a duplicate's: the existing job's). */
export async function enqueueTraced(
  db: Queryable,
  task: string,
  payload?: unknown,
  opts: EnqueueOptions = {},
): Promise<EnqueueResult & { jobTraceparent: string | null }> {
  if (opts.runAt !== undefined && opts.delay !== undefined) throw bad("give either runAt or delay, not both");
  const delay = interval(opts.delay);
  const rows = await call<"enqueue", { job_id: string; deduplicated: boolean; job_traceparent: string | null }>(db, "enqueue", {
    task: requiredText(task, "task"),
    payload: jsonb(payload, "payload"),
    queue: text(opts.queue, "queue"),
    // The database clock, not this process's, so app/DB clock skew cannot shift the delay.
    run_at:
      delay === undefined
        ? instant(opts.runAt, "runAt")
        : new SqlExpression(delay, (p) => `statement_timestamp() + ${p}::interval`),
    priority: integer(opts.priority, "priority"),
    max_attempts: integer(opts.maxAttempts, "maxAttempts"),
    idempotency_key: text(opts.idempotencyKey, "idempotencyKey"),
    duplicate_policy: policy(opts.duplicatePolicy),
    backoff: opts.backoff === undefined ? undefined : JSON.stringify(toBackoffJson(opts.backoff)),
    expires_at: instant(opts.expiresAt, "expiresAt"),
    after: optionalJobIds(opts.after, "after"),
    key_retention: interval(opts.keyRetention),
    traceparent: text(opts.traceparent, "traceparent"),
  });
  const row = rows[0]!;
  return { jobId: row.job_id, deduplicated: row.deduplicated, jobTraceparent: row.job_traceparent };
}

/**
 * Payload type by task name, e.g. `{ credit: { orderId: number } }`. The
 * untyped default: any task name, any payload.
 */
export type PayloadMap = Record<string, unknown>;

/** `payload` as a job's field: optional only when the payload type admits undefined (as `unknown` does). */
export type PayloadField<P> = undefined extends P ? { payload?: P } : { payload: P };

/**
 * One job of a bulk enqueue. No `delay` here: `enqueue_many` takes run_at
 * only. With a payload map, a union over its tasks: each element's payload
 * is checked against its own task.
 */
export type EnqueueManyJob<Payloads extends object = PayloadMap> = {
  [K in keyof Payloads & string]: Omit<EnqueueOptions, "delay"> & { task: K } & PayloadField<Payloads[K]>;
}[keyof Payloads & string];

export interface EnqueueManyResult {
  /** Position of the job in the input array, as `enqueue_many` numbers it. */
  ordinal: number;
  /** The created or existing job; null when SQL reports none (e.g. a rejection). */
  jobId: string | null;
  outcome: EnqueueOutcome;
}

export async function enqueueMany(db: Queryable, jobs: readonly EnqueueManyJob[]): Promise<EnqueueManyResult[]> {
  if (!Array.isArray(jobs)) throw bad("jobs must be an array");
  // Ids go into the JSON as exact numbers (not strings, not rounded floats):
  // marked as strings for JSON.stringify, unquoted afterwards.
  const marker = `idemq-id-${randomUUID()}:`;
  const elements = jobs.map((job, i) => {
    const what = `jobs[${i}]`;
    if (job === null || typeof job !== "object") throw bad(`${what} must be an object`);
    if ("delay" in job) throw bad(`${what}.delay is not supported in bulk; give runAt`);
    const el: Record<string, unknown> = {
      task: requiredText(job.task, `${what}.task`),
      payload: job.payload,
      queue: text(job.queue, `${what}.queue`),
      run_at: instant(job.runAt, `${what}.runAt`),
      priority: integer(job.priority, `${what}.priority`),
      max_attempts: integer(job.maxAttempts, `${what}.maxAttempts`),
      idempotency_key: text(job.idempotencyKey, `${what}.idempotencyKey`),
      duplicate_policy: policy(job.duplicatePolicy),
      backoff: job.backoff === undefined ? undefined : toBackoffJson(job.backoff),
      expires_at: instant(job.expiresAt, `${what}.expiresAt`),
      after: optionalJobIds(job.after, `${what}.after`)?.map((id) => marker + id),
      key_retention: interval(job.keyRetention),
      traceparent: text(job.traceparent, `${what}.traceparent`),
    };
    return el; // undefined fields vanish in JSON.stringify, so SQL defaults apply
  });
  const json = jsonb(elements, "jobs")!.replace(new RegExp(`"${marker}(-?\\d+)"`, "g"), "$1");
  const rows = await call<"enqueue_many", { ordinal: number; job_id: string | null; outcome: EnqueueOutcome }>(
    db,
    "enqueue_many",
    { jobs: json },
    " ORDER BY r.ordinal",
  );
  return rows.map((r) => ({ ordinal: r.ordinal, jobId: r.job_id, outcome: r.outcome }));
}

// ---------------------------------------------------------------- read

/** A job as idemq.job() returns it (the columns of idemq.job_row). */
export interface JobRow {
  job_id: string;
  task: string;
  queue: string;
  /** null unless the session's login may read idemq.jobs (idemq_admin): see sql/functions/job.sql. */
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
}

/** One job's state and outcome (idemq.job(), which every idemq role may call); undefined when there is no such job. */
export async function job(db: Queryable, jobId: JobIdInput): Promise<JobRow | undefined> {
  const rows = await call<"job", JobRow>(db, "job", { job_id: toJobId(jobId) });
  return rows[0];
}

// ---------------------------------------------------------------- work

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
  return rows.map((r, i) => ({
    payloadBytes: sizes[i]!,
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
  }));
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
}

function attemptArrays(jobs: readonly JobAttempt[]): { job_ids: string[]; attempts: number[]; lease_tokens: (string | null)[] } {
  if (!Array.isArray(jobs)) throw bad("jobs must be an array of { jobId, attempt, leaseToken }");
  return {
    job_ids: jobs.map((j) => toJobId(j.jobId)),
    attempts: jobs.map((j) => integer(j.attempt, "attempt")!),
    lease_tokens: jobs.map((j) => leaseToken(j.leaseToken)),
  };
}

/** A lease token as SQL takes it: claim()'s uuid text, or null (an attempt claimed before 0.2.0). */
function leaseToken(token: string | null): string | null {
  if (token !== null && typeof token !== "string") throw bad("leaseToken must be the lease_token claim() returned (a uuid string) or null");
  return token;
}

export async function complete(
  db: Queryable,
  jobId: JobIdInput,
  attempt: number,
  token: string | null,
  result?: unknown,
): Promise<void> {
  await call(db, "complete", {
    job_id: toJobId(jobId),
    attempt: integer(attempt, "attempt"),
    result: jsonb(result, "result"),
    lease_token: leaseToken(token),
  });
}

/** complete() and COMMIT in one round trip, on the connection whose transaction holds the job's writes. */
export async function completeAndCommit(
  client: pg.ClientBase,
  jobId: JobIdInput,
  attempt: number,
  token: string | null,
  result?: unknown,
): Promise<void> {
  await callInline(
    client,
    "complete",
    { job_id: toJobId(jobId), attempt: integer(attempt, "attempt"), result: jsonb(result, "result"), lease_token: leaseToken(token) },
    { after: "COMMIT" },
  );
}

/** Completes the attempts that still hold their jobs; returns the ids completed. */
export async function completeMany(db: Queryable, jobs: readonly JobAttempt[]): Promise<string[]> {
  const rows = await call<"complete_many", { r: string }>(db, "complete_many", attemptArrays(jobs));
  return rows.map((row) => row.r);
}

/**
 * completeMany() for the worker's batches, whose ids are claim()'s (digit
 * strings), attempts integers and lease tokens claim()'s uuids: sent as
 * array literals, unchecked, since checking and pg's array escaping cost
 * more per job than the rest of the call (none of the three needs quoting).
 */
export async function completeClaimed(db: Queryable, jobs: readonly { readonly job: ClaimedJob }[]): Promise<string[]> {
  let ids = "";
  let attempts = "";
  let tokens = "";
  for (const { job } of jobs) {
    ids += ids === "" ? job.id : `,${job.id}`;
    attempts += attempts === "" ? String(job.attempt) : `,${job.attempt}`;
    tokens += tokens === "" ? job.leaseToken : `,${job.leaseToken}`;
  }
  const rows = await call<"complete_many", { r: string }>(db, "complete_many", {
    job_ids: `{${ids}}`,
    attempts: `{${attempts}}`,
    lease_tokens: `{${tokens}}`,
  });
  return rows.map((row) => row.r);
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
  const rows = await call<"heartbeat", { r: string }>(db, "heartbeat", {
    ...attemptArrays(jobs),
    lease: interval(opts.lease),
  });
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

function runAtArg(when: { runAt?: Instant | undefined; delay?: Duration | undefined }, what: string): unknown {
  if ((when.runAt === undefined) === (when.delay === undefined)) {
    throw bad(`${what} needs exactly one of runAt or delay`);
  }
  if (when.runAt !== undefined) return instant(when.runAt, "runAt");
  return new SqlExpression(toPgInterval(when.delay!), (p) => `statement_timestamp() + ${p}::interval`);
}

// ------------------------------------------------------------ schedules

/** The fields of a schedule besides its task and payload (typed together in ScheduleDefinition). */
interface ScheduleFields {
  /** Names the schedule (upsert by name) and each slot's idempotency key, schedule:<name>:<slot>. */
  name: string;
  /** 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first), or @hourly, @daily, ..., @every <interval>. */
  cron: string;
  queue?: string | undefined;
  /** An IANA time zone (slots are local times there); SQL default UTC. */
  timezone?: string | undefined;
  /** While the latest job is active: skip (SQL default), allow, or queue_one. */
  overlap?: ScheduleOverlap | undefined;
  /** Slots missed while tick() was not called: once (SQL default), skip, or all. */
  misfire?: ScheduleMisfire | undefined;
  /** How late a slot may run and still be on time; SQL default 1 minute. */
  misfireGrace?: Duration | undefined;
  priority?: number | undefined;
  maxAttempts?: number | undefined;
}

/**
 * A recurring schedule as schedule() takes it: every option left undefined
 * takes schedule()'s SQL default. With a payload map, a union over its tasks
 * (each payload checked against its task), as EnqueueManyJob.
 */
export type ScheduleDefinition<Payloads extends object = PayloadMap> = {
  [K in keyof Payloads & string]: ScheduleFields & { task: K } & PayloadField<Payloads[K]>;
}[keyof Payloads & string];

/**
 * Each ScheduleDefinition field's schedule() parameter, in declaration order:
 * the one list of them (test/contract holds the values equal to schedule()'s
 * parameters, and the compiler holds the keys equal to the fields).
 */
export const SCHEDULE_PARAMETERS = {
  name: "name",
  cron: "cron",
  task: "task",
  payload: "payload",
  queue: "queue",
  timezone: "timezone",
  overlap: "overlap",
  misfire: "misfire",
  misfireGrace: "misfire_grace",
  priority: "priority",
  maxAttempts: "max_attempts",
} as const satisfies { [K in keyof (ScheduleFields & { task: string; payload?: unknown })]-?: ParamOf<"schedule"> };

/** A schedule's row, as idemq.schedules() lists it. */
export interface Schedule {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  queue: string;
  payload: unknown;
  priority: number;
  maxAttempts: number;
  overlap: ScheduleOverlap;
  misfire: ScheduleMisfire;
  /** PostgreSQL's interval text, e.g. "00:01:00". */
  misfireGrace: string;
  /** The first slot not yet handled (due when in the past: the next tick() enqueues it). */
  nextAt: Date;
  lastSlotAt: Date | null;
  lastJobId: string | null;
  /** The latest job's state; null before its first job, or once that job was purged. */
  lastJobState: JobState | null;
  /** Slots the overlap policy dropped. */
  skipped: number;
  createdAt: Date;
  updatedAt: Date;
  /**
   * Why the latest tick() could not enqueue this schedule's job ("<message>
   * (SQLSTATE <code>)", e.g. a payload over a lowered payload_bytes); null
   * once a tick enqueued it. The schedule stays due until then; the others fire.
   */
  lastError: string | null;
  /** When that tick ran; null with lastError. */
  lastErrorAt: Date | null;
}

/** The arguments of schedule(), checked: an unknown field is refused (a misspelt option must not be dropped silently). */
function scheduleArgs(definition: ScheduleDefinition): Args<"schedule"> {
  if (definition === null || typeof definition !== "object" || Array.isArray(definition)) {
    throw bad("a schedule must be an object { name, cron, task, ... }");
  }
  const what = typeof definition.name === "string" ? `schedule ${JSON.stringify(definition.name)}` : "schedule";
  const unknown = Object.keys(definition).find((key) => !Object.hasOwn(SCHEDULE_PARAMETERS, key));
  if (unknown !== undefined) {
    throw bad(`${what}: unknown option ${JSON.stringify(unknown)}`, `the options are ${Object.keys(SCHEDULE_PARAMETERS).join(", ")}`);
  }
  return {
    name: requiredText(definition.name, `${what}: name`),
    cron: requiredText(definition.cron, `${what}: cron`),
    task: requiredText(definition.task, `${what}: task`),
    payload: jsonb(definition.payload, `${what}: payload`),
    queue: text(definition.queue, `${what}: queue`),
    timezone: text(definition.timezone, `${what}: timezone`),
    overlap: oneOf(definition.overlap, SCHEDULE_OVERLAPS, `${what}: overlap`),
    misfire: oneOf(definition.misfire, SCHEDULE_MISFIRES, `${what}: misfire`),
    misfire_grace: interval(definition.misfireGrace),
    priority: integer(definition.priority, `${what}: priority`),
    max_attempts: integer(definition.maxAttempts, `${what}: maxAttempts`),
  };
}

/** Checks a schedule's fields as schedule() will be called with them (no database): throws a BadArgumentError naming the field. */
export function checkSchedule(definition: ScheduleDefinition): void {
  scheduleArgs(definition);
}

/** Creates or replaces (by name) a recurring schedule; returns its next slot. */
export async function schedule(db: Queryable, definition: ScheduleDefinition): Promise<Date> {
  return scalar(db, "schedule", scheduleArgs(definition));
}

/** Removes a schedule; false when there was none of that name. Jobs it enqueued stay. */
export async function unschedule(db: Queryable, name: string): Promise<boolean> {
  return scalar(db, "unschedule", { name: requiredText(name, "name") });
}

const INTERVAL_OID = 1186;

/** pg's parsers, but an interval stays PostgreSQL's text ("00:01:00") rather than an object. */
const INTERVAL_AS_TEXT: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === INTERVAL_OID && format !== "binary" ? (value: string) => value : pg.types.getTypeParser(oid, format)) as pg.CustomTypesConfig["getTypeParser"],
};

interface ScheduleRow {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  queue: string;
  payload: unknown;
  priority: number;
  max_attempts: number;
  overlap: ScheduleOverlap;
  misfire: ScheduleMisfire;
  misfire_grace: string;
  next_at: Date;
  last_slot_at: Date | null;
  last_job_id: string | null;
  last_job_state: JobState | null;
  skipped: string;
  created_at: Date;
  updated_at: Date;
  last_error: string | null;
  last_error_at: Date | null;
}

/** Every schedule, by name. */
export async function schedules(db: Queryable): Promise<Schedule[]> {
  const rows = await call<"schedules", ScheduleRow>(db, "schedules", {}, "", INTERVAL_AS_TEXT);
  return rows.map((r) => ({
    name: r.name,
    cron: r.cron,
    timezone: r.timezone,
    task: r.task,
    queue: r.queue,
    payload: r.payload,
    priority: r.priority,
    maxAttempts: r.max_attempts,
    overlap: r.overlap,
    misfire: r.misfire,
    misfireGrace: r.misfire_grace,
    nextAt: r.next_at,
    lastSlotAt: r.last_slot_at,
    lastJobId: r.last_job_id,
    lastJobState: r.last_job_state,
    // A count, not an id: a number is exact far beyond any realistic count.
    skipped: Number(r.skipped),
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    lastError: r.last_error,
    lastErrorAt: r.last_error_at,
  }));
}

export interface ScheduleNextOptions {
  cron: string;
  /** SQL default UTC. */
  timezone?: string | undefined;
  /** Slots strictly after this instant; SQL default now(). */
  after?: Instant | undefined;
  /** 1 to 1000; SQL default 1. */
  count?: number | undefined;
}

/** The next slots of a cron expression (schedule_next), to check it before scheduling it; validated as schedule() validates. */
export async function scheduleNext(db: Queryable, opts: ScheduleNextOptions): Promise<Date[]> {
  const rows = await call<"schedule_next", { r: Date }>(db, "schedule_next", {
    cron: requiredText(opts?.cron, "cron"),
    timezone: text(opts.timezone, "timezone"),
    after: instant(opts.after, "after"),
    count: integer(opts.count, "count"),
  });
  return rows.map((row) => row.r);
}

/** Enqueues every due schedule slot once; returns the number of jobs created. */
export function tick(db: Queryable): Promise<number> {
  return scalar(db, "tick", {});
}

/** Returns the number of jobs rescued from expired leases or expired. */
export function rescue(db: Queryable): Promise<number> {
  return scalar(db, "rescue", {});
}

// -------------------------------------------------------- effects once

/** true: go ahead (in this transaction); false: another delivery already committed this effect. */
/** BEGIN and guard() in one round trip: opens the transaction a transactional job runs in. */
/** `begin` opens the transaction (BEGIN, perhaps followed by SET LOCAL statements). */
export async function beginWithGuard(client: pg.ClientBase, key: string, task?: string, begin = "BEGIN"): Promise<boolean> {
  const rows = await callInline<"guard", { r: boolean }>(
    client,
    "guard",
    { key: requiredText(key, "key"), task: text(task, "task") },
    { before: begin },
  );
  return rows[0]!.r;
}

export function guard(db: Queryable, key: string, task?: string): Promise<boolean> {
  return scalar(db, "guard", { key: requiredText(key, "key"), task: text(task, "task") });
}

export interface EffectClaimResult {
  status: EffectStatus;
  /** What the effect returned, when status is `done`. */
  result: unknown;
}

export async function effectClaim(
  db: Queryable,
  key: string,
  owner: string,
  opts: {
    staleAfter?: Duration | undefined;
    /** The job attempt the claim is made for: a claim left by an earlier attempt of it is reclaimed at once. */
    attemptOf?: JobAttempt | undefined;
  } = {},
): Promise<EffectClaimResult> {
  const rows = await call<"effect_claim", { status: EffectStatus; result: unknown }>(db, "effect_claim", {
    key: requiredText(key, "key"),
    owner: requiredText(owner, "owner"),
    stale_after: interval(opts.staleAfter),
    job_id: opts.attemptOf === undefined ? undefined : toJobId(opts.attemptOf.jobId),
    attempt: opts.attemptOf === undefined ? undefined : integer(opts.attemptOf.attempt, "attempt"),
    lease_token: opts.attemptOf === undefined ? undefined : leaseToken(opts.attemptOf.leaseToken),
  });
  const row = rows[0]!;
  return { status: row.status, result: row.result };
}

export async function effectDone(db: Queryable, key: string, owner: string, result?: unknown): Promise<void> {
  await call(db, "effect_done", {
    key: requiredText(key, "key"),
    owner: requiredText(owner, "owner"),
    result: jsonb(result, "result") ?? null,
  });
}

export async function effectRelease(db: Queryable, key: string, owner: string): Promise<void> {
  await call(db, "effect_release", { key: requiredText(key, "key"), owner: requiredText(owner, "owner") });
}

// ------------------------------------------------------------- operate

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

// ---------------------------------------------------------- flow control

/** One queue or one task (exactly one: SQL refuses both or neither with 22023). */
export interface LimitScope {
  queue?: string | undefined;
  task?: string | undefined;
}

export interface LimitSettings {
  /** At most this many jobs of the scope processing at once (1..10000). */
  concurrency?: number | undefined;
  /** At most `rate` starts (claims, retries included) per `per` (at least a second); give both. */
  rate?: number | undefined;
  per?: Duration | undefined;
  /** Stored for concurrency keys (a later release): at most this many running per key. */
  perKey?: number | undefined;
}

/** Sets a queue's or a task's limits (set_limit); fields left undefined keep their value. */
export async function setLimit(db: Queryable, opts: LimitScope & LimitSettings): Promise<void> {
  await call(db, "set_limit", {
    queue: text(opts.queue, "queue"),
    task: text(opts.task, "task"),
    concurrency: integer(opts.concurrency, "concurrency"),
    rate: integer(opts.rate, "rate"),
    per: interval(opts.per),
    per_key: integer(opts.perKey, "perKey"),
  });
}

/** Removes a queue's or a task's limits (clear_limit); a pause stays. True when it had one. */
export function clearLimit(db: Queryable, opts: LimitScope): Promise<boolean> {
  return scalar(db, "clear_limit", { queue: text(opts.queue, "queue"), task: text(opts.task, "task") });
}

/** Pauses a queue or a task: claims hand out none of its jobs until resume. True when it was not paused. */
export function pause(db: Queryable, opts: LimitScope): Promise<boolean> {
  return scalar(db, "pause", { queue: text(opts.queue, "queue"), task: text(opts.task, "task") });
}

/** Ends a pause. True when the scope was paused. */
export function resume(db: Queryable, opts: LimitScope): Promise<boolean> {
  return scalar(db, "resume", { queue: text(opts.queue, "queue"), task: text(opts.task, "task") });
}

export interface LimitRow {
  queue: string | null;
  task: string | null;
  concurrency: number | null;
  rate: number | null;
  /** The period of `rate`, as PostgreSQL prints an interval (e.g. "00:01:00"). */
  per: string | null;
  perKey: number | null;
  paused: boolean;
  /** Slots held now (jobs processing under the concurrency limit); null without one. */
  running: number | null;
  /** Starts within the last `per`; null without a rate limit. */
  started: number | null;
  updatedAt: Date;
}

/** Every queue and task with a limit or a pause, and its use now (limits()). */
export async function limits(db: Queryable): Promise<LimitRow[]> {
  const rows = await call<
    "limits",
    {
      queue: string | null;
      task: string | null;
      concurrency: number | null;
      rate: number | null;
      per: string | null;
      per_key: number | null;
      paused: boolean;
      running: number | null;
      started: number | null;
      updated_at: Date;
    }
  >(db, "limits", {}, "", INTERVAL_AS_TEXT);
  return rows.map((r) => ({
    queue: r.queue,
    task: r.task,
    concurrency: r.concurrency,
    rate: r.rate,
    per: r.per,
    perKey: r.per_key,
    paused: r.paused,
    running: r.running,
    started: r.started,
    updatedAt: r.updated_at,
  }));
}

/** Releases idempotency keys whose latest job finished more than `olderThan` ago; returns the count. */
export function pruneKeys(db: Queryable, opts: { olderThan?: Duration | undefined } = {}): Promise<number> {
  return scalar(db, "prune_keys", { older_than: interval(opts.olderThan) });
}

// -------------------------------------------------------- worker presence

export interface WorkerPresence {
  workerId: string;
  /** undefined: every queue. */
  queues?: readonly string[] | undefined;
  /** undefined: any task. */
  tasks?: readonly string[] | undefined;
}

/** Registers or refreshes a worker's row in idemq.workers (worker_seen). */
export async function workerSeen(db: Queryable, presence: WorkerPresence): Promise<void> {
  await call(db, "worker_seen", {
    worker_id: requiredText(presence.workerId, "workerId"),
    queues: presence.queues === undefined ? undefined : [...presence.queues],
    tasks: presence.tasks === undefined ? undefined : [...presence.tasks],
  });
}

/** Removes a cleanly stopped worker's row; true when it had one. */
export function workerStopped(db: Queryable, workerId: string): Promise<boolean> {
  return scalar(db, "worker_stopped", { worker_id: requiredText(workerId, "workerId") });
}

export interface WorkerRow {
  workerId: string;
  /** null: every queue. */
  queues: string[] | null;
  /** null: any task. */
  tasks: string[] | null;
  startedAt: Date;
  lastSeenAt: Date;
}

/** The workers registered with worker_seen(), most recently seen first (stale ones included). */
export async function workers(db: Queryable): Promise<WorkerRow[]> {
  const rows = await call<"workers", { worker_id: string; queues: string[] | null; tasks: string[] | null; started_at: Date; last_seen_at: Date }>(
    db,
    "workers",
    {},
  );
  return rows.map((r) => ({ workerId: r.worker_id, queues: r.queues, tasks: r.tasks, startedAt: r.started_at, lastSeenAt: r.last_seen_at }));
}

export interface UnservedJobs {
  queue: string;
  task: string;
  jobs: number;
  oldestRunnableSeconds: number;
  /** When the latest (stale) worker that would claim them was seen; null: none ever registered with this queue and task. */
  lastSeenAt: Date | null;
}

/** Runnable jobs per queue and task that no worker seen within `seenWithin` claims (unserved_jobs). */
export async function unservedJobs(db: Queryable, seenWithin: Duration): Promise<UnservedJobs[]> {
  const rows = await call<"unserved_jobs", { queue: string; task: string; jobs: string; oldest_runnable_seconds: string; last_seen_at: Date | null }>(
    db,
    "unserved_jobs",
    { seen_within: interval(seenWithin) },
  );
  // Counts and ages, not ids: a number is exact far beyond any realistic value.
  return rows.map((r) => ({
    queue: r.queue,
    task: r.task,
    jobs: Number(r.jobs),
    oldestRunnableSeconds: Number(r.oldest_runnable_seconds),
    lastSeenAt: r.last_seen_at,
  }));
}

export interface StatsRow {
  queue: string | null;
  task: string | null;
  metric: StatsMetric;
  value: number;
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

/** overview(): the dashboard's read, fast with millions of finished jobs (see sql/functions/overview.sql). */
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
  const rows = await call<"stats", { queue: string | null; task: string | null; metric: StatsMetric; value: string }>(
    db,
    "stats",
    {},
  );
  // Counts, not ids: a number is exact far beyond any realistic count.
  return rows.map((r) => ({ queue: r.queue, task: r.task, metric: r.metric, value: Number(r.value) }));
}

