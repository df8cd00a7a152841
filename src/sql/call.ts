// The call machinery every wrapper of src/sql/ shares: the parameters of
// each public SQL function (SQL_FUNCTIONS), the statement a call sends, and
// the mapping of SQL errors to idemq's classes. Functions are called with
// the parameters given from the first one on by position and the rest by
// name (buildCall), and options left undefined are left out of the call, so
// each default lives once, in SQL. The argument list follows the function's
// declared parameter order (SQL_FUNCTIONS), never the caller's key order, so
// the same set of options always gives the same statement text. Ids are
// bigint in SQL and exact strings here.

import pg from "pg";
import { fromPgError } from "../errors.ts";

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
    "concurrency_key",
    "timeout",
  ],
  enqueue_many: ["jobs"],
  enqueue_batch: ["jobs", "callback", "fail_fast"],
  job: ["job_id"],
  job_result: ["job_id", "notify"],
  children: ["job_id"],
  spawn: ["job_id", "attempt", "children", "lease_token", "fail_fast"],
  wait_for_children: ["job_id", "attempt", "lease_token"],
  claim: ["worker_id", "queues", "batch_size", "lease", "tasks", "token"],
  complete: ["job_id", "attempt", "result", "lease_token"],
  complete_many: ["job_ids", "attempts", "lease_tokens"],
  complete_and_take_next: ["job_ids", "attempts", "lease_tokens", "worker_id", "queues", "lease", "tasks"],
  fail: ["job_id", "attempt", "error", "retryable", "retry_at", "backoff", "max_attempts", "counted", "lease_token"],
  heartbeat: ["job_ids", "attempts", "lease", "lease_tokens"],
  snooze: ["job_id", "attempt", "run_at", "lease_token"],
  progress: ["job_id", "attempt", "value", "lease_token"],
  hold: ["job_id", "attempt", "scope", "until", "lease_token"],
  rescue: [],
  guard: ["key", "task"],
  effect_claim: ["key", "owner", "stale_after", "job_id", "attempt", "lease_token"],
  effect_done: ["key", "owner", "result"],
  effect_release: ["key", "owner"],
  cancel: ["job_id"],
  retry: ["job_id"],
  reschedule: ["job_id", "run_at"],
  find_jobs: ["filter", "before_id", "page_size"],
  count_jobs: ["filter", "action", "at_most"],
  retry_jobs: ["filter", "before_id", "max_jobs"],
  cancel_jobs: ["filter", "before_id", "max_jobs"],
  delete_jobs: ["filter", "before_id", "max_jobs"],
  run_jobs_now: ["filter", "before_id", "max_jobs"],
  purge: ["older_than", "states", "batch_size"],
  prune_keys: ["older_than"],
  apply_retention: ["batch_size"],
  set_retention: ["state", "keep", "queue", "task"],
  stats: [],
  overview: ["recent", "exact_up_to"],
  roll_up: [],
  history: ["since", "queue", "task"],
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
  worker_seen: ["worker_id", "queues", "tasks", "host", "pid", "concurrency", "refresh_every", "outages", "outage_ms"],
  worker_stopped: ["worker_id"],
  workers: [],
  unserved_jobs: ["seen_within"],
  schema_version: [],
  set_limit: ["queue", "task", "concurrency", "rate", "per", "per_key"],
  clear_limit: ["queue", "task"],
  pause: ["queue", "task"],
  resume: ["queue", "task"],
  limits: [],
  held_keys: [],
  declare_limit: ["task", "concurrency", "rate", "per"],
  step_record: ["job_id", "attempt", "name", "result", "lease_token"],
  steps: ["job_id"],
  sleep: ["job_id", "attempt", "name", "wake_at", "lease_token"],
  await_event: ["job_id", "attempt", "name", "event", "key", "timeout", "lease_token"],
  emit: ["event", "key", "payload"],
} as const satisfies Record<string, readonly string[]>;

export type SqlFunction = keyof typeof SQL_FUNCTIONS;
export type ParamOf<F extends SqlFunction> = (typeof SQL_FUNCTIONS)[F][number];

/** An argument computed in SQL from a parameter, e.g. now() + an interval. */
export class SqlExpression {
  constructor(
    readonly value: unknown,
    readonly sql: (placeholder: string) => string,
  ) {}
}

type Arg = unknown;
export type Args<F extends SqlFunction> = Partial<Record<ParamOf<F>, Arg>>;

/**
 * Builds `SELECT * FROM idemq.fn($1, $2, name => $3, ...) AS r`: the
 * parameters given from the first on without a gap are passed by position,
 * the rest by name. Undefined arguments are left out (SQL's default
 * applies); null is passed as SQL NULL. A function returning a scalar
 * yields one column named `r`.
 * Why positional where it can: PostgreSQL parses every call anew, and a
 * call in named notation costs the server more to resolve (measured:
 * bench/FINDINGS.md, "Why the SQL is written as it is").
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

/** Calls `fn` with `args` (buildCall) and returns its rows. */
export function call<F extends SqlFunction, R extends pg.QueryResultRow>(
  db: Queryable,
  fn: F,
  args: Args<F>,
  suffix = "",
  types?: pg.CustomTypesConfig,
): Promise<R[]> {
  const { text, values } = buildCall(fn, args, suffix);
  return runQuery<R>(db, text, values, types);
}

/**
 * One simple-protocol round trip for `before; SELECT * FROM idemq.fn(...) AS r; after`,
 * the arguments inlined as escaped literals (strings, numbers or JSON text;
 * the function's parameter types resolve them). Returns the call's rows. A
 * transactional job uses it to send BEGIN with guard() and complete() with
 * COMMIT: two round trips fewer per job. An error stops the string there.
 */
export async function callInline<F extends SqlFunction, R extends pg.QueryResultRow>(
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

/** The one value a function returning a scalar gives. */
export async function scalar<F extends SqlFunction, T>(db: Queryable, fn: F, args: Args<F>): Promise<T> {
  const rows = await call<F, { r: T }>(db, fn, args);
  return rows[0]!.r;
}

/** An instant `interval` from now by the database clock, not this process's, so app/DB clock skew cannot shift a delay. */
export function fromNow(interval: string): SqlExpression {
  return new SqlExpression(interval, (p) => `statement_timestamp() + ${p}::interval`);
}

const INTERVAL_OID = 1186;

/** pg's parsers, but an interval stays PostgreSQL's text ("00:01:00") rather than an object (schedules(), limits()). */
export const INTERVAL_AS_TEXT: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === INTERVAL_OID && format !== "binary" ? (value: string) => value : pg.types.getTypeParser(oid, format)) as pg.CustomTypesConfig["getTypeParser"],
};
