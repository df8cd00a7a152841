// Typed errors for what the SQL raises, plus PermanentError for handlers.
// fromPgError maps a pg DatabaseError through ERROR_CLASSES, the one table
// from SQLSTATE to class, refined by DETAIL_SUBCLASSES where one code has two
// meanings (IQ410); contract tests compare both with what the SQL raises.

import type { DuplicatePolicy, IdemqErrorCode, JobState } from "./contract.ts";

/** The fields of a PostgreSQL error that idemq errors carry. */
export interface SqlErrorFields {
  code?: string | undefined;
  detail?: string | undefined;
  hint?: string | undefined;
}

/**
 * The DETAIL fields (a JSON object) that the classes of these codes read: the
 * one list of them. Every RAISE of the code in sql/functions builds DETAIL
 * with jsonb_build_object naming each field (a contract test reads the
 * function bodies). IQ410's fields are DETAIL_SUBCLASSES' business.
 */
export const DETAIL_FIELDS = {
  IQ409: ["key", "existing_job_id", "existing_state"],
  IQ422: ["key", "existing_job_id"],
} as const satisfies Partial<Record<IdemqErrorCode, readonly string[]>>;

/** Base class of every error raised by idemq's SQL (or by its client-side argument checks). */
export class IdemqError extends Error {
  /** The code of an error built without one (a client-side check); XX000 is PostgreSQL's internal_error. */
  static readonly defaultCode: string = "XX000";

  /** SQLSTATE, e.g. "IQ409" or "22023". */
  readonly code: string;
  readonly detail: string | undefined;
  readonly hint: string | undefined;

  constructor(message: string, fields: SqlErrorFields = {}, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = fields.code ?? (new.target as typeof IdemqError).defaultCode;
    this.detail = fields.detail;
    this.hint = fields.hint;
  }
}

/** Bad input: SQLSTATE IQ400 or any of class 22, or a client-side check. */
export class BadArgumentError extends IdemqError {
  static override readonly defaultCode: string = "IQ400";
}

/** IQ404: no such job. */
export class JobNotFoundError extends IdemqError {
  static override readonly defaultCode: string = "IQ404";
}

/** IQ409: enqueue (or retry) rejected by the duplicate policy of the key. */
export class DuplicateJobError extends IdemqError {
  static override readonly defaultCode: string = "IQ409";
  readonly key: string;
  /** The job holding the key; a bigint kept exact as a string. */
  readonly existingJobId: string;
  readonly existingState: JobState;
  /** The policy that rejected; null when retry() found the key held by another active job. */
  readonly policy: DuplicatePolicy | null;

  constructor(message: string, fields: SqlErrorFields = {}, options?: ErrorOptions) {
    super(message, fields, options);
    const detail = parseDetail(fields.detail, DETAIL_FIELDS.IQ409);
    this.key = String(detail.key);
    this.existingJobId = existingJobId(fields.detail as string, detail.existing_job_id);
    this.existingState = detail.existing_state as JobState;
    this.policy = (detail.policy ?? null) as DuplicatePolicy | null;
  }
}

/**
 * IQ410: this attempt no longer holds its job — complete, fail or snooze by
 * a `(job_id, attempt, lease_token)` that was rescued, cancelled or taken over by a newer
 * attempt (DETAIL `job_id`, `attempt`, `current_state`; never the current
 * attempt, which would be the fencing token of whichever attempt holds it now).
 * A worker also aborts `ctx.signal` with one when a heartbeat finds the lease
 * gone. IQ410's other meaning, an effect claim lost, is its subclass
 * {@link EffectClaimLostError}, so catching LeaseLostError still catches
 * every IQ410.
 */
export class LeaseLostError extends IdemqError {
  static override readonly defaultCode: string = "IQ410";

  /**
   * The job's state when the database refused the call (DETAIL
   * `current_state`): `cancelled` when an operator cancelled the job while
   * this attempt ran. Undefined when the DETAIL names none (an effect claim
   * lost, or an error the worker made itself when a heartbeat found the lease
   * gone: heartbeat() says which leases it kept, not why the others went).
   */
  get currentState(): string | undefined {
    if (this.detail === undefined) return undefined;
    try {
      const state: unknown = (JSON.parse(this.detail) as { current_state?: unknown }).current_state;
      return typeof state === "string" ? state : undefined;
    } catch {
      return undefined;
    }
  }
}

/**
 * IQ410 from `effect_done` or `effect_release`: the claim on an effect key is
 * not this owner's (it went stale and another attempt reclaimed it, or it was
 * never claimed; DETAIL `key`, `owner`). The job's own lease may be intact:
 * thrown from `ctx.effect`, it fails the attempt like any error (the job is
 * retried), and it does not mean the job's lease was lost.
 *
 * A subclass of LeaseLostError because until it existed every IQ410 was a
 * LeaseLostError: code that catches LeaseLostError around `ctx.effect` keeps
 * working. Test for this class first where the two meanings differ.
 */
export class EffectClaimLostError extends LeaseLostError {
  /** The effect's key. */
  readonly key: string;
  /** The owner whose claim it no longer is (`job:<id>:<attempt>@<worker>#<digest of the lease token>` for a worker's ctx.effect). */
  readonly owner: string;

  constructor(message: string, fields: SqlErrorFields = {}, options?: ErrorOptions) {
    super(message, fields, options);
    const detail = parseDetail(fields.detail, ["key", "owner"]);
    this.key = String(detail.key);
    this.owner = String(detail.owner);
  }
}

/** IQ412: the job's state does not allow this operation. */
export class InvalidStateError extends IdemqError {
  static override readonly defaultCode: string = "IQ412";
}

/** IQ422: idempotency key reused for different work while its job is active. */
export class KeyReuseError extends IdemqError {
  static override readonly defaultCode: string = "IQ422";
  readonly key: string;
  readonly existingJobId: string;
  /** DETAIL as parsed JSON, for any fields beyond key and existing_job_id. */
  readonly details: Readonly<Record<string, unknown>>;

  constructor(message: string, fields: SqlErrorFields = {}, options?: ErrorOptions) {
    super(message, fields, options);
    const detail = parseDetail(fields.detail, DETAIL_FIELDS.IQ422);
    this.key = String(detail.key);
    this.existingJobId = existingJobId(fields.detail as string, detail.existing_job_id);
    this.details = detail;
  }
}

/**
 * The database has no idemq schema, or an older one that lacks a function,
 * table or type this version uses (PostgreSQL's 3F000, 42883, 42P01 or 42704
 * naming idemq, kept as the code and the cause). The fix is `idemq migrate`.
 */
export class SchemaMissingError extends IdemqError {
  static override readonly defaultCode: string = "3F000";
  /** The database's name, when the connection settings tell it. */
  readonly database: string | undefined;

  /** The database's and this package's versions, when the schema is there but older (set by the start-up check). */
  readonly versions: SchemaVersions | undefined;

  constructor(database: string | undefined, fields: SqlErrorFields = {}, options?: ErrorOptions, versions?: SchemaVersions) {
    super(schemaMissingMessage({ database }, versions), fields, options);
    this.database = database;
    this.versions = versions;
  }
}

/** A database's schema version and this package's (schema-check.ts compares them), as an older schema's message names them; databaseMigration is undefined before 0.2.0 (no schema_version()). */
export interface SchemaVersions {
  databaseMigration: string | undefined;
  packageVersion: string;
  packageMigration: string;
}

/**
 * The one sentence for a database without the idemq schema, shared by the
 * library's SchemaMissingError and the CLI's check of a given URL.
 */
export function schemaMissingMessage(target: { database?: string | undefined; where?: string | undefined }, versions?: SchemaVersions): string {
  const database = target.database === undefined ? "the database" : `database ${target.database}`;
  const at = target.where === undefined ? "" : ` at ${target.where}`;
  const fix = "run `idemq migrate --database-url <url>` (or `idemq migrate sql` for a script to apply with psql)";
  if (versions !== undefined) {
    const has = versions.databaseMigration === undefined ? "an idemq schema older than 0.2.0" : `idemq ${releaseOfMigration(versions.databaseMigration)} (migration ${versions.databaseMigration})`;
    return `${database}${at} has ${has}, older than this idemq ${versions.packageVersion} (migration ${versions.packageMigration}): ${fix}`;
  }
  return `${database}${at} has no idemq schema (or it is older than this version of idemq): ${fix}`;
}

/** The release in a migration's name (0002_release_0_2_0 is 0.2.0), else the name. */
export function releaseOfMigration(migration: string): string {
  const release = /^\d+_release_(\d+)_(\d+)_(\d+)$/.exec(migration);
  return release ? `${release[1]}.${release[2]}.${release[3]}` : `a development version (${migration})`;
}

/** What PostgreSQL reports when something of schema idemq is not there, by SQLSTATE. */
const MISSING_IN_SCHEMA: Readonly<Record<string, RegExp>> = {
  "3F000": /^schema "idemq" does not exist/, // invalid_schema_name
  "42883": /^function idemq\./, // undefined_function (absent, or without a parameter this version names)
  "42P01": /^relation "idemq\./, // undefined_table (the admin reads of idemq.jobs)
  "42704": /^type "idemq\./, // undefined_object (a cast to idemq.job_state)
};

/**
 * Thrown by a handler to fail the job at once, without retries (like a
 * Hangfire ExceptOn match). Not a database error, hence not an IdemqError.
 */
export class PermanentError extends Error {
  constructor(message?: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "PermanentError";
  }
}

/**
 * An attempt ran past its time limit (the task's `timeout`, or the job's
 * from enqueue): the worker aborts ctx.signal with it and fails the attempt
 * with it, which the retry policy then treats like any failure.
 */
export class TimeoutError extends Error {
  readonly jobId: string;
  readonly attempt: number;
  /** The limit, in ms. */
  readonly limitMs: number;

  constructor(jobId: string, task: string, attempt: number, limitMs: number) {
    super(`job ${jobId} (${task}, attempt ${attempt}) ran past its time limit of ${limitMs} ms; the attempt fails and is retried by the task's policy`);
    this.name = "TimeoutError";
    this.jobId = jobId;
    this.attempt = attempt;
    this.limitMs = limitMs;
  }
}

/**
 * Client.result(): the job did not finish within `timeout` (it may still:
 * wait again, or read it later with job_result). Not a database error.
 */
export class ResultTimeoutError extends Error {
  readonly jobId: string;
  readonly timeoutMs: number;
  /** The job's state when the wait gave up. */
  readonly state: JobState;

  constructor(jobId: string, timeoutMs: number, state: JobState) {
    super(`job ${jobId} did not finish within ${timeoutMs} ms (it is ${state}); result() gave up waiting, the job goes on`);
    this.name = "ResultTimeoutError";
    this.jobId = jobId;
    this.timeoutMs = timeoutMs;
    this.state = state;
  }
}

/**
 * Client.result(): the job finished without succeeding (failed, expired or
 * cancelled); `lastError` is its latest error entry (class, message, ...).
 */
export class JobNotSucceededError extends Error {
  readonly jobId: string;
  readonly state: Exclude<JobState, "succeeded">;
  readonly lastError: Record<string, unknown> | null;

  constructor(jobId: string, state: Exclude<JobState, "succeeded">, lastError: Record<string, unknown> | null) {
    const why = lastError === null ? "" : `: ${String(lastError["class"] ?? "Error")}: ${String(lastError["message"] ?? "")}`;
    super(`job ${jobId} ${state}${why}`);
    this.name = "JobNotSucceededError";
    this.jobId = jobId;
    this.state = state;
    this.lastError = lastError;
  }
}

/**
 * ctx.spawn(children, { failFast: true }): a child did not succeed. A
 * PermanentError: the parent fails at once (a retry would find the same
 * child, linked by its name, in the same state).
 */
export class ChildFailedError extends PermanentError {
  readonly parentJobId: string;
  readonly child: { name: string; jobId: string; state: JobState; lastError: Record<string, unknown> | null };

  constructor(parentJobId: string, child: ChildFailedError["child"]) {
    const why = child.lastError === null ? "" : ` (${String(child.lastError["class"] ?? "Error")}: ${String(child.lastError["message"] ?? "")})`;
    super(`child "${child.name}" (job ${child.jobId}) of job ${parentJobId} ${child.state}${why}`);
    this.name = "ChildFailedError";
    this.parentJobId = parentJobId;
    this.child = child;
  }
}

/**
 * What a RateLimitedError holds back: the job's queue (every task calling the
 * API), its task, or its concurrency key (one customer's API key: the job
 * must have been enqueued with a concurrencyKey).
 */
export type RateLimitScope = "queue" | "task" | "key";

/**
 * Thrown by a handler whose API answered 429 (or 503) with a Retry-After:
 * the worker holds back the job's queue (or, with `scope: "task"`, its task;
 * with `scope: "key"`, its concurrency key) from every claim of every worker
 * and SQL consumer until `retryAfterMs` from now by the database's clock,
 * and puts the job back to `scheduled` for then without spending an attempt
 * (SQL: idemq.hold). Scope "key" on a job without a concurrency key is
 * refused by the database (22023), and the worker fails the attempt with
 * that error. Not a database error, hence not an IdemqError.
 */
export class RateLimitedError extends Error {
  /** How long to hold the scope back, in milliseconds (0: snooze only, hold nothing). */
  readonly retryAfterMs: number;
  readonly scope: RateLimitScope;

  constructor(retryAfterMs: number, options: { scope?: RateLimitScope; message?: string; cause?: unknown } = {}) {
    if (typeof retryAfterMs !== "number" || !Number.isFinite(retryAfterMs) || retryAfterMs < 0) {
      throw new BadArgumentError(`RateLimitedError: retryAfterMs must be a finite number of milliseconds >= 0, not ${String(retryAfterMs)}`, {
        code: "22023",
        hint: "Pass the API's Retry-After in milliseconds (RateLimitedError.retryAfter reads the header).",
      });
    }
    const scope = options.scope ?? "queue";
    if (scope !== "queue" && scope !== "task" && scope !== "key") {
      throw new BadArgumentError(`RateLimitedError: scope must be "queue", "task" or "key", not ${JSON.stringify(scope)}`, {
        code: "22023",
        hint: "Hold the job's queue (every task sharing the API), its task, or its concurrency key (one customer's API key).",
      });
    }
    super(options.message ?? `rate limited: hold the ${scope} for ${Math.round(retryAfterMs)} ms`, { cause: options.cause });
    this.name = "RateLimitedError";
    this.retryAfterMs = Math.round(retryAfterMs);
    this.scope = scope;
  }

  /**
   * A Retry-After header's value in milliseconds from `now`: delay-seconds
   * ("120") or an HTTP-date; undefined when absent or unreadable.
   */
  static retryAfter(header: string | null | undefined, now: number = Date.now()): number | undefined {
    if (header === null || header === undefined) return undefined;
    const value = header.trim();
    if (/^\d+$/.test(value)) return Number(value) * 1000;
    const at = Date.parse(value);
    return Number.isNaN(at) ? undefined : Math.max(0, at - now);
  }
}

export type IdemqErrorClass = new (message: string, fields?: SqlErrorFields, options?: ErrorOptions) => IdemqError;

/** SQLSTATE -> class, one entry per idemq error code (exhaustive by type). */
export const ERROR_CLASSES = {
  IQ400: BadArgumentError,
  IQ404: JobNotFoundError,
  IQ409: DuplicateJobError,
  IQ410: LeaseLostError,
  IQ412: InvalidStateError,
  IQ422: KeyReuseError,
} as const satisfies Record<IdemqErrorCode, IdemqErrorClass>;

/**
 * Codes with two meanings, told apart by a field the SQL puts in DETAIL: the
 * subclass of ERROR_CLASSES[code] for a DETAIL that has that field. IQ410
 * names `owner` only for an effect claim (effect_done, effect_release) and
 * `job_id` for a job's lease (_raise_not_held); a contract test checks the
 * SQL against this table.
 */
export const DETAIL_SUBCLASSES: Readonly<Partial<Record<IdemqErrorCode, { field: string; cls: IdemqErrorClass }>>> = {
  IQ410: { field: "owner", cls: EffectClaimLostError },
};

/**
 * Fallbacks by SQLSTATE class (first two characters) when no exact code
 * matches: PostgreSQL's data exceptions are bad arguments; an IQ code the
 * table does not know yet still becomes an IdemqError.
 */
export const SQLSTATE_CLASS_FALLBACKS: Readonly<Record<string, IdemqErrorClass>> = {
  "22": BadArgumentError,
  IQ: IdemqError,
};

interface PgErrorLike {
  code: string;
  message: string;
  detail?: string | undefined;
  hint?: string | undefined;
}

function isPgErrorLike(err: unknown): err is PgErrorLike {
  if (typeof err !== "object" || err === null) return false;
  const e = err as { code?: unknown; message?: unknown };
  return typeof e.code === "string" && /^[0-9A-Z]{5}$/.test(e.code) && typeof e.message === "string";
}

/**
 * Maps a pg DatabaseError to its idemq class by SQLSTATE; returns anything
 * else (including SQL errors idemq does not own) unchanged. `database` names
 * the database in a SchemaMissingError.
 */
export function fromPgError(err: unknown, database?: string): unknown {
  if (err instanceof IdemqError || !isPgErrorLike(err)) return err;
  if (MISSING_IN_SCHEMA[err.code]?.test(err.message)) {
    return new SchemaMissingError(database, { code: err.code, detail: err.message }, { cause: err });
  }
  const fields: SqlErrorFields = {
    code: err.code,
    detail: typeof err.detail === "string" ? err.detail : undefined,
    hint: typeof err.hint === "string" ? err.hint : undefined,
  };
  const subclass = DETAIL_SUBCLASSES[err.code as IdemqErrorCode];
  const cls: IdemqErrorClass | undefined =
    (subclass !== undefined && detailHas(fields.detail, subclass.field) ? subclass.cls : undefined) ??
    (ERROR_CLASSES as Readonly<Record<string, IdemqErrorClass>>)[err.code] ??
    SQLSTATE_CLASS_FALLBACKS[err.code.slice(0, 2)];
  if (cls === undefined) return err;
  try {
    return new cls(err.message, fields, { cause: err });
  } catch {
    // A DETAIL that breaks the contract still yields an error with the right
    // code rather than hiding the original failure.
    return new IdemqError(err.message, fields, { cause: err });
  }
}

/** DETAIL as JSON: the fields the error classes read, and any others. */
type DetailJson = {
  key?: unknown;
  existing_job_id?: unknown;
  existing_state?: unknown;
  policy?: unknown;
  owner?: unknown;
} & Record<string, unknown>;

/** DETAIL as a JSON object with every `required` field set; throws when it is not. */
function parseDetail(detail: string | undefined, required: readonly string[]): DetailJson {
  let json: unknown;
  try {
    json = JSON.parse(detail ?? "");
  } catch {
    throw new Error(`DETAIL is not JSON: ${String(detail)}`);
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new Error(`DETAIL is not a JSON object: ${String(detail)}`);
  }
  const obj = json as DetailJson;
  for (const field of required) {
    if (obj[field] === undefined || obj[field] === null) throw new Error(`DETAIL lacks ${field}: ${detail}`);
  }
  return obj;
}

function detailHas(detail: string | undefined, field: string): boolean {
  try {
    parseDetail(detail, [field]);
    return true;
  } catch {
    return false;
  }
}

// A bigint id in JSON may exceed 2^53, where JSON.parse rounds it: read the
// digits from the text instead.
function existingJobId(detail: string, parsed: unknown): string {
  if (typeof parsed === "string") return parsed;
  if (typeof parsed === "number" && Number.isSafeInteger(parsed)) return String(parsed);
  const m = /"existing_job_id"\s*:\s*(-?\d+)/.exec(detail);
  if (m?.[1] !== undefined) return m[1];
  throw new Error(`DETAIL existing_job_id is not an integer: ${detail}`);
}

/** SQLSTATEs and socket codes of a server that is unreachable, restarting or shutting down. */
const CONNECTION_CODES = new Set(["57P01", "57P02", "57P03", "ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH"]);
const CONNECTION_MESSAGES = /Connection terminated|connection error and is not queryable|timeout exceeded when trying to connect/i;

/**
 * A server that is unreachable, restarting or shutting down, or a connection it
 * cut: what ends when the server is back (the worker's outages, the CLI's wait
 * for a server). Authentication or a missing database is not one.
 */
export function isConnectionFailure(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && (CONNECTION_CODES.has(code) || code.startsWith("08"))) return true;
    if (CONNECTION_MESSAGES.test(e.message)) return true;
    if (e instanceof AggregateError && e.errors.some(isConnectionFailure)) return true;
  }
  return false;
}

/**
 * A durable step used wrongly (docs/worker.md, "Durable steps"): a step name
 * used twice in one run, a result that is not JSON or is over
 * RESULT_BYTES, a step in a transactional task. The same code fails the
 * same way on every attempt, so it is permanent: the job fails at once.
 */
export class StepError extends PermanentError {
  readonly jobId: string;
  readonly step: string;
  constructor(jobId: string, step: string, problem: string, options?: ErrorOptions) {
    super(`job ${jobId}, step "${step}": ${problem}`, options);
    this.name = "StepError";
    this.jobId = jobId;
    this.step = step;
  }
}

/**
 * ctx.waitFor's timeout passed before the event (event, key) was emitted.
 * Recorded in the job's step ledger, so every later attempt gets it again:
 * permanent unless the handler catches it (and, say, takes another path).
 */
export class WaitTimeoutError extends PermanentError {
  readonly jobId: string;
  readonly step: string;
  readonly event: string;
  readonly key: string | null;
  constructor(jobId: string, step: string, event: string, key: string | null) {
    super(`job ${jobId}, step "${step}": no event "${event}"${key === null ? "" : ` with key "${key}"`} came before the wait's timeout`);
    this.name = "WaitTimeoutError";
    this.jobId = jobId;
    this.step = step;
    this.event = event;
    this.key = key;
  }
}
