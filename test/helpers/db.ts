// Database helpers for test files. Each test file gets its own database, a
// clone of the migrated template; SQL tests run inside
// transactions that roll back; errors are asserted by SQLSTATE and DETAIL.
import { randomBytes } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, expect, inject } from "vitest";
import { databaseUrl } from "../../src/embedded/server.ts";

export interface TestDatabase {
  name: string;
  url: string;
  /** A pool on this database (max 10 connections by default). */
  pool: pg.Pool;
  /** A new connected client of its own (for concurrency tests); closed by drop(). */
  newClient(): Promise<pg.Client>;
  /** Closes the pool and every client from newClient(), then drops the database. */
  drop(): Promise<void>;
}

export interface FreshDatabaseOptions {
  /** An empty database (no idemq schema, no migrations) instead of a clone of the template. */
  empty?: boolean;
  /** pg.Pool max. */
  poolSize?: number;
}

/** The server's maintenance URL, from the global setup. */
export function serverUrl(): string {
  return inject("idemqServerUrl");
}

/**
 * Creates a database for one test file: a clone of the migrated template, or an
 * empty database with `{ empty: true }`. Call drop() in afterAll.
 */
export async function freshDatabase(options: FreshDatabaseOptions = {}): Promise<TestDatabase> {
  const server = serverUrl();
  const template = inject("idemqTemplate");
  const name = `${template}_${process.pid}_${randomBytes(4).toString("hex")}`;
  const source = options.empty ? "template0" : template;

  const admin = await connect(server);
  try {
    await createDatabaseFromTemplate(admin, name, source);
  } finally {
    await admin.end();
  }

  const url = databaseUrl(server, name);
  const pool = new pg.Pool({ connectionString: url, max: options.poolSize ?? 10 });
  // An idle client gets 57P01 when drop() terminates the sessions; that is expected.
  pool.on("error", () => {});
  const clients = new Set<pg.Client>();
  let dropped: Promise<void> | undefined;

  return {
    name,
    url,
    pool,
    async newClient() {
      const client = await connect(url);
      clients.add(client);
      return client;
    },
    drop() {
      dropped ??= (async () => {
        await Promise.allSettled([pool.end(), ...[...clients].map((client) => client.end())]);
        const dropper = await connect(server);
        try {
          await dropper.query(`DROP DATABASE IF EXISTS ${dropper.escapeIdentifier(name)} WITH (FORCE)`);
        } finally {
          await dropper.end();
        }
      })();
      return dropped;
    },
  };
}

/**
 * The database of a test file, or of the describe block that calls it:
 * freshDatabase in a beforeAll, drop() in an afterAll. Its fields are there
 * from that beforeAll on; vitest runs the file's later beforeAll hooks after it
 * and their afterAll hooks before the drop (sequence.hooks "stack"), so they
 * can set up with the database and clean up while it still exists. Cleanup
 * that must come after the drop calls drop() itself first: it runs once.
 */
export function useTestDatabase(options: FreshDatabaseOptions = {}): TestDatabase {
  let current: TestDatabase | undefined;
  beforeAll(async () => {
    current = await freshDatabase(options);
  });
  afterAll(async () => {
    await current?.drop();
  });
  const made = (): TestDatabase => {
    if (current === undefined) throw new Error("useTestDatabase: the database is made in beforeAll; read it in a hook or a test");
    return current;
  };
  return {
    get name() {
      return made().name;
    },
    get url() {
      return made().url;
    },
    get pool() {
      return made().pool;
    },
    newClient: () => made().newClient(),
    // Nothing to drop when the beforeAll failed before making it.
    drop: async () => {
      await current?.drop();
    },
  };
}

/**
 * For a file that makes databases as its tests need them: the returned
 * function is freshDatabase, and one afterAll drops every database it made
 * (after the file's later afterAll hooks, as with useTestDatabase).
 */
export function useTestDatabases(): (options?: FreshDatabaseOptions) => Promise<TestDatabase> {
  const made: TestDatabase[] = [];
  afterAll(async () => {
    await Promise.all(made.splice(0).map((db) => db.drop()));
  });
  return async (options) => {
    const db = await freshDatabase(options);
    made.push(db);
    return db;
  };
}

async function createDatabaseFromTemplate(admin: pg.Client, name: string, source: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      await admin.query(
        `CREATE DATABASE ${admin.escapeIdentifier(name)} TEMPLATE ${admin.escapeIdentifier(source)}`,
      );
      return;
    } catch (error) {
      // 55006 object_in_use: "source database is being accessed by other users".
      if (sqlStateOf(error) !== "55006" || Date.now() > deadline) throw error;
      await new Promise((r) => setTimeout(r, 25));
    }
  }
}

async function connect(url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => {});
  await client.connect();
  return client;
}

/**
 * Runs `work` in a transaction on one pooled connection and always rolls it
 * back, so each test sees the database as the template left it.
 */
export async function inRollback<T>(pool: pg.Pool, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query("BEGIN");
    return await work(client);
  } finally {
    try {
      await client.query("ROLLBACK");
    } catch (error) {
      broken = error instanceof Error ? error : new Error(String(error));
    }
    // A connection that cannot roll back is discarded, not reused.
    client.release(broken);
  }
}

/** A PostgreSQL error as node-postgres reports it. */
export type PgError = Error & {
  code?: string;
  detail?: string;
  hint?: string;
  constraint?: string;
  table?: string;
  column?: string;
};

function sqlStateOf(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

/** The SQLSTATE that `promise` rejects with; fails the test when it resolves or rejects without one. */
export async function sqlState(promise: Promise<unknown>): Promise<string> {
  const error = await rejection(promise);
  const code = sqlStateOf(error);
  if (code === undefined) throw new Error(`expected a PostgreSQL error with a SQLSTATE, got: ${String(error)}`);
  return code;
}

export interface ExpectedSqlError {
  code: string;
  /** Fields the DETAIL, parsed as JSON, must contain (toMatchObject). */
  detail?: Record<string, unknown>;
  /** A substring of, or a pattern for, the message. */
  message?: string | RegExp;
  hint?: string | RegExp;
  constraint?: string;
}

/**
 * Asserts that `promise` rejects with a PostgreSQL error of SQLSTATE `code`,
 * and, when given, DETAIL fields, message, HINT and constraint. Returns the error.
 *
 *   await expectSqlError(client.query("SELECT idemq.enqueue(...)"), {
 *     code: "IQ409", detail: { existing_state: "failed", policy: "reject_if_failed" } });
 */
export async function expectSqlError(promise: Promise<unknown>, expected: ExpectedSqlError): Promise<PgError> {
  const error = (await rejection(promise)) as PgError;
  expect(sqlStateOf(error), `SQLSTATE of: ${error?.message}`).toBe(expected.code);
  if (expected.detail !== undefined) {
    expect(error.detail, "DETAIL").toBeTypeOf("string");
    let parsed: unknown;
    try {
      parsed = JSON.parse(error.detail ?? "");
    } catch {
      throw new Error(`DETAIL is not JSON: ${error.detail}`);
    }
    expect(parsed, "DETAIL").toMatchObject(expected.detail);
  }
  if (expected.message !== undefined) expect(error.message).toMatch(expected.message);
  if (expected.hint !== undefined) expect(error.hint ?? "", "HINT").toMatch(expected.hint);
  if (expected.constraint !== undefined) expect(error.constraint, "constraint").toBe(expected.constraint);
  return error;
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error("expected the statement to fail, but it succeeded");
}

type Queryable = pg.Pool | pg.ClientBase;

/** The backend PID of a connection, for waitUntilBlocked. */
export async function backendPid(client: pg.ClientBase): Promise<number> {
  const { rows } = await client.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
  return rows[0]!.pid;
}

/**
 * Waits until the session `pid` is blocked by a lock (pg_blocking_pids is not
 * empty) and returns the PIDs blocking it. Query from a connection other than
 * the blocked one. Fails after `timeoutMs`.
 */
export async function waitUntilBlocked(
  db: Queryable,
  pid: number,
  { timeoutMs = 10_000 }: { timeoutMs?: number } = {},
): Promise<number[]> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await db.query<{ blockers: number[] }>("SELECT pg_blocking_pids($1) AS blockers", [pid]);
    const blockers = rows[0]?.blockers ?? [];
    if (blockers.length > 0) return blockers;
    if (Date.now() > deadline) {
      throw new Error(`backend ${pid} was not blocked within ${timeoutMs} ms (${await sessionSummary(db, pid)})`);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** What a session is doing, for failure messages: often its statement finished without ever waiting. */
async function sessionSummary(db: Queryable, pid: number): Promise<string> {
  const { rows } = await db.query<{ state: string | null; wait: string | null; query: string | null }>(
    `SELECT state, wait_event_type || ':' || wait_event AS wait, left(query, 200) AS query
       FROM pg_stat_activity WHERE pid = $1`,
    [pid],
  );
  const row = rows[0];
  if (row === undefined) return "no such session";
  return `state: ${row.state ?? "?"}, wait: ${row.wait ?? "none"}, last statement: ${row.query ?? "?"}`;
}

/**
 * Waits until some session waits on a lock that the session `pid` holds, and
 * returns the PIDs of those that do (the other way round from waitUntilBlocked:
 * for a waiter the test did not start, such as a migration). Fails after `timeoutMs`.
 */
export async function waitUntilBlocking(
  db: Queryable,
  pid: number,
  { timeoutMs = 10_000 }: { timeoutMs?: number } = {},
): Promise<number[]> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await db.query<{ pid: number }>(
      "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND $1 = ANY (pg_blocking_pids(pid))",
      [pid],
    );
    if (rows.length > 0) return rows.map((row) => row.pid);
    if (Date.now() > deadline) throw new Error(`no session waited on a lock of backend ${pid} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

export interface InterleaveSteps<H, T> {
  /** The session that takes the lock. */
  first: pg.ClientBase;
  /** Run by `first` in the transaction it holds open; its locks are what `second` waits on. */
  holds: (first: pg.ClientBase) => Promise<H>;
  /** The session that waits; idle when interleave is called. */
  second: pg.ClientBase;
  /** Started by `second` once `holds` is done; it must wait on a lock `holds` took. */
  blocks: (second: pg.ClientBase) => Promise<T>;
  /** How `first` ends its transaction once `second` is seen waiting. */
  end: "COMMIT" | "ROLLBACK";
}

export interface Interleaving<H, T> {
  /** What `holds` returned. */
  held: H;
  /** `first`'s PID, for assertions on `blockers`. */
  firstPid: number;
  /** Who pg_blocking_pids said `second` was waiting for. */
  blockers: number[];
  /** What `blocks` resolved or rejected with, after `first`'s end; a rejection is not unhandled, and awaiting this rethrows it. */
  second: Promise<T>;
}

/**
 * One deterministic interleaving of two sessions, with no sleeps: `first`
 * opens a transaction and runs `holds`; `second` starts `blocks`; once
 * pg_blocking_pids shows `second` waiting, `first` runs `end`. The caller
 * asserts on the blockers and on the outcome of `second`.
 */
export async function interleave<H, T>(db: Queryable, steps: InterleaveSteps<H, T>): Promise<Interleaving<H, T>> {
  // Read while both are idle: a client runs one query at a time.
  const firstPid = await backendPid(steps.first);
  const secondPid = await backendPid(steps.second);
  await steps.first.query("BEGIN");
  const held = await steps.holds(steps.first);
  const second = steps.blocks(steps.second);
  // Observed at once: `second` may reject before `end` returns.
  second.catch(() => {});
  const blockers = await waitUntilBlocked(db, secondPid);
  await steps.first.query(steps.end);
  await second.catch(() => {});
  return { held, firstPid, blockers, second };
}
