// Which database a CLI command talks to, and the CLI's lines about it. With
// --database-url or DATABASE_URL, that server (checked first, so an
// unreachable one is one clear line). With neither, the embedded PostgreSQL 18
// of the data directory (src/embedded/data-dir-server.ts) whose data lives in
// .idemq/pg under the current directory (IDEMQ_DATA_DIR overrides it; see
// data-dir.ts): its database `idemq` created and migrated, the server shared
// by long-running commands, stopped by close().
//
// A given URL is not migrated automatically: commands refuse a database
// without the idemq schema and name `idemq migrate` (doctor reports it).
import pg from "pg";
import { Client } from "../client.ts";
import { type DataDirServer, openDataDirServer } from "../embedded/data-dir-server.ts";
import type { ProgressLine } from "../embedded/share.ts";
import { isConnectionFailure, SchemaMissingError, schemaMissingMessage } from "../errors.ts";
import { checkSchema } from "../schema-check.ts";
import { migrate } from "../migrate.ts";
import { displayPath, embeddedDataDir } from "../embedded/data-dir.ts";
import { EXIT, SIGNAL_EXIT } from "./exit-codes.ts";
import { UsageError } from "./output.ts";

const EMBEDDED_DATABASE = "idemq";
const CONNECT_TIMEOUT_MS = 10_000;

export interface OpenDatabaseOptions {
  /** A connection string; empty or absent means the embedded server. */
  databaseUrl?: string | undefined;
  /** Machine-readable output: no progress lines. */
  json?: boolean | undefined;
  /** Where progress lines go; default stderr (nothing with json). */
  log?: ((line: string) => void) | undefined;
  /** Refuse a database without the idemq schema (default true; doctor reports it instead). */
  requireSchema?: boolean | undefined;
  /** Migrate the embedded database (default true; `migrate` and `migrate status` do their own). */
  migrate?: boolean | undefined;
  /**
   * A long-running command (worker, `stats --watch`, demo): while it runs, other
   * CLI commands in the directory use the embedded server it starts.
   */
  share?: boolean | undefined;
  /** Run the embedded server in this process, never use another's (`idemq dev`): see DataDirServerOptions.own. */
  own?: boolean | undefined;
  /**
   * How long to wait for a given URL's server while it cannot be reached (down,
   * restarting, starting up): 0 (default) fails at once; Infinity waits for good.
   * Authentication and a missing database fail at once whatever this says.
   */
  waitForServerMs?: number | undefined;
}

/** The database a command uses; on a given URL, close() has nothing to stop. */
export interface OpenDatabase extends DataDirServer {
  embedded: boolean;
  /** The embedded server's data directory. */
  dataDir?: string;
}

export async function openDatabase(options: OpenDatabaseOptions = {}): Promise<OpenDatabase> {
  const url = options.databaseUrl?.trim();
  if (url) {
    await waitForServer(url, options);
    await checkServer(url, options.requireSchema ?? true);
    return { url, embedded: false, close: async () => {} };
  }
  return openEmbedded(options);
}

/** Opens the database, runs `work` with a Client on it, then closes both. */
export async function withClient<T>(
  options: OpenDatabaseOptions,
  work: (client: Client, db: OpenDatabase) => Promise<T>,
): Promise<T> {
  const db = await openDatabase(options);
  // Client.close() keeps its error listener on the pool it owns, so a 57P01
  // from the embedded server stopping right after is handled.
  const client = new Client({ connectionString: db.url, poolConfig: { max: 4 }, onError: () => {} });
  try {
    return await work(client, db);
  } catch (error) {
    throw db.serverLost?.() ?? error;
  } finally {
    await client.close().catch(() => {});
    await db.close();
  }
}

// ------------------------------------------------------------ a given URL

interface Target {
  where: string;
  database: string;
  user: string;
}

function describeTarget(url: string): Target {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new UsageError(
      "the database URL is not a connection string: give postgres://user:password@host:5432/database",
    );
  }
  if (parsed.protocol !== "postgres:" && parsed.protocol !== "postgresql:") {
    throw new UsageError(
      `the database URL starts with ${parsed.protocol}//: give postgres://user:password@host:5432/database`,
    );
  }
  const host = decodeURIComponent(parsed.hostname) || parsed.searchParams.get("host") || "localhost";
  const port = parsed.port || parsed.searchParams.get("port") || "5432";
  return {
    where: host.startsWith("/") ? `${host} (socket, port ${port})` : `${host}:${port}`,
    database: decodeURIComponent(parsed.pathname.replace(/^\//, "")) || decodeURIComponent(parsed.username) || "postgres",
    user: decodeURIComponent(parsed.username) || process.env.PGUSER || "the current user",
  };
}

async function checkServer(url: string, requireSchema: boolean): Promise<void> {
  const target = describeTarget(url);
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: CONNECT_TIMEOUT_MS });
  client.on("error", () => {});
  try {
    await client.connect();
  } catch (error) {
    await client.end().catch(() => {});
    throw new Error(connectFailure(target, error), { cause: error });
  }
  try {
    if (!requireSchema) return;
    let schema;
    try {
      schema = await checkSchema(client);
    } catch (error) {
      if (error instanceof SchemaMissingError) throw new Error(schemaMissingMessage(target, error.versions), { cause: error });
      throw error;
    }
    // On stderr even with --json: stdout stays machine-readable.
    if (schema.newer !== undefined) process.stderr.write(`idemq: ${schema.newer}\n`);
  } finally {
    await client.end().catch(() => {});
  }
}

const WAIT_BACKOFF_MS = { first: 100, max: 5_000 };

/**
 * Waits until the server at `url` accepts a connection, for at most
 * waitForServerMs: one line when the wait begins and one when it ends (not one
 * per try), retries on a capped, jittered backoff.
 */
export async function waitForServer(url: string, options: Pick<OpenDatabaseOptions, "waitForServerMs" | "log">): Promise<void> {
  const budget = options.waitForServerMs ?? 0;
  if (budget <= 0) return;
  const target = describeTarget(url);
  // On stderr even with --json: stdout stays machine-readable, and a wait is worth seeing.
  const say = options.log ?? ((line: string) => void process.stderr.write(`${line}\n`));
  const deadline = Date.now() + budget;
  let delay = WAIT_BACKOFF_MS.first;
  let waiting = false;
  for (;;) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: CONNECT_TIMEOUT_MS });
    client.on("error", () => {});
    try {
      await client.connect();
      await client.end().catch(() => {});
      if (waiting) say(`idemq: the database at ${target.where} answers`);
      return;
    } catch (error) {
      await client.end().catch(() => {});
      // Waits on what ends when the server is back; fails at once on others (authentication, no such database).
      // The last try is at the deadline, so the wait lasts the whole budget.
      if (!isConnectionFailure(error) || Date.now() >= deadline) return; // checkServer says why, in its one line
      if (!waiting) {
        const why = connectFailure(target, error).replace(/;.*$/, "");
        const until = Number.isFinite(budget) ? ` for up to ${Math.round(budget / 1000)} s` : "";
        say(`idemq: waiting${until}: ${why}`);
        waiting = true;
      }
    }
    await new Promise((resolve) => setTimeout(resolve, Math.min(delay * (0.5 + Math.random() / 2), Math.max(0, deadline - Date.now()))));
    delay = Math.min(delay * 2, WAIT_BACKOFF_MS.max);
  }
}

const USE_ANOTHER =
  "fix --database-url or DATABASE_URL, or leave both unset to use the embedded PostgreSQL";

function connectFailure(target: Target, error: unknown): string {
  const codes = errorCodes(error);
  const prefix = `cannot connect to the database at ${target.where}`;
  if (codes.has("28P01") || codes.has("28000")) {
    return `${prefix}: authentication failed for user ${target.user}; check the user and password in the URL`;
  }
  if (codes.has("3D000")) {
    return `${prefix}: database ${target.database} does not exist; create it (createdb ${target.database}) or ${USE_ANOTHER}`;
  }
  if (codes.has("ECONNREFUSED")) return `${prefix}: connection refused (no server listens there); start PostgreSQL or ${USE_ANOTHER}`;
  if (codes.has("ENOTFOUND") || codes.has("EAI_AGAIN")) return `${prefix}: unknown host; ${USE_ANOTHER}`;
  const message = error instanceof Error ? error.message : String(error);
  if (codes.has("ETIMEDOUT") || /timeout/i.test(message)) {
    return `${prefix}: no answer within ${CONNECT_TIMEOUT_MS / 1000} s; check the host, port and firewall, or ${USE_ANOTHER}`;
  }
  const reason = message.replace(/\s*\n\s*/g, " ").trim() || [...codes].join(", ") || "unknown error";
  return `${prefix}: ${reason}; ${USE_ANOTHER}`;
}

function errorCodes(error: unknown): Set<string> {
  const codes = new Set<string>();
  const visit = (value: unknown): void => {
    if (!(value instanceof Error)) return;
    const { code } = value as { code?: unknown };
    if (typeof code === "string") codes.add(code);
    if (value instanceof AggregateError) value.errors.forEach(visit);
  };
  visit(error);
  return codes;
}

// ------------------------------------------------------- the embedded server

async function openEmbedded(options: OpenDatabaseOptions): Promise<OpenDatabase> {
  const dataDir = embeddedDataDir();
  const shown = displayPath(dataDir);
  const server = await openDataDirServer(dataDir, shown, {
    database: EMBEDDED_DATABASE,
    share: options.share ?? false,
    own: options.own ?? false,
    progress: progressLine(options),
    signalExit: SIGNAL_EXIT,
    ...(options.migrate === false ? {} : { prepare: migrateEmbedded }),
    onLost(error) {
      // A worker would otherwise retry forever against a server that is gone.
      process.stderr.write(`idemq: ${error.message}\n`);
      process.exit(EXIT.FAILURE);
    },
  });
  if (server.sharedBy !== undefined) {
    const { pid, command } = server.sharedBy;
    note(options, `idemq: using the embedded PostgreSQL in ${shown} of PID ${pid} (${command})`);
  }
  return { ...server, embedded: true, dataDir };
}

/** Migrates the embedded database before other commands may use it; the progress line names what ran. */
async function migrateEmbedded(url: string): Promise<string> {
  const applied = await migrate({ connectionString: url });
  return applied.length > 0 ? ` (migrated: ${applied.join(", ")})` : "";
}

/**
 * "idemq: starting embedded PostgreSQL 18 in .idemq/pg ... ready in 1.2 s" on
 * stderr: the start of the line at once, its end when the server is ready (or
 * failed, before the error's own line). With a `log` option, two lines to it.
 */
function progressLine(options: OpenDatabaseOptions): ProgressLine {
  if (options.log !== undefined) {
    const log = options.log;
    return { start: (text) => log(text), end: (text) => log(`idemq: embedded PostgreSQL ${text}`) };
  }
  if (options.json) return { start: () => {}, end: () => {} };
  let open = false;
  return {
    start(text) {
      process.stderr.write(text);
      open = true;
    },
    end(text) {
      if (open) process.stderr.write(` ${text}\n`);
      open = false;
    },
  };
}

/** A whole progress line: to `log` when given, else stderr (nothing with json). */
function note(options: OpenDatabaseOptions, line: string): void {
  if (options.log !== undefined) options.log(line);
  else if (!options.json) process.stderr.write(`${line}\n`);
}
