// One embedded server for every CLI command in a directory. A long-running
// command (worker, `stats --watch`, demo) marks its lock `shared`: while it
// runs, other commands use its server (they borrow it) instead of starting one,
// and never stop it. Any other holder is a short command: it is waited for,
// and the next command then starts the server itself.
//
// The races, and what each side does:
// - The holder is still starting (no URL in its lock yet, or the server does
//   not answer yet): wait for it, at most HOLDER_WAIT_MS per holder.
// - The holder died and left its lock (SIGKILL, OOM): tryLock stops the server
//   it left and takes the directory over.
// - The holder is stopping: its close() clears `shared` before it stops the
//   server, so a newcomer waits for the lock instead of borrowing a server
//   about to go away.
// - The server stops while a borrower runs: the borrower's next query fails,
//   and serverLost() turns that error into one line saying why; a watcher tells
//   a borrower that would otherwise wait or retry forever (a worker) as soon
//   as the postmaster is gone (the CLI then exits).
import { realpathSync } from "node:fs";
import pg from "pg";
import { holderRunning, type Lock, type LockContent, lockPath, readLock, sameHolder, tryLock } from "./data-dir-lock.ts";
import { pidAlive } from "./processes.ts";

/** How long to wait for one holder to finish, or to have its server ready: longer than a cold start on a busy machine. */
const HOLDER_WAIT_MS = 60_000;
const POLL_MS = 100;
const WATCH_MS = 250;
const CHECK_TIMEOUT_MS = 5_000;

/** A progress line on stderr: its start at once, its end when the outcome is known. */
export interface ProgressLine {
  start(text: string): void;
  end(text: string): void;
}

export type ServingHolder = LockContent & { url: string; postmasterPid: number };

/** This process holds the data directory, or may use the server of a holder that shares it. */
export type DataDirClaim = { lock: Lock } | { holder: ServingHolder };

export interface DataDirClaimOptions {
  /** Mark the lock shared: this process lets others use its server. */
  share: boolean;
  progress: ProgressLine;
  /** How long to wait for one holder (default HOLDER_WAIT_MS). */
  waitMs?: number;
}

export async function claimDataDir(dataDir: string, shown: string, options: DataDirClaimOptions): Promise<DataDirClaim> {
  const { share, progress, waitMs = HOLDER_WAIT_MS } = options;
  let waitingFor: LockContent | undefined;
  let deadline = 0;
  const stopWaiting = (outcome: string): void => {
    if (waitingFor !== undefined) progress.end(outcome);
    waitingFor = undefined;
  };
  try {
    for (;;) {
      const attempt = await tryLock(dataDir, shown, share ? { shared: true } : {});
      if ("lock" in attempt) {
        stopWaiting("released");
        return attempt;
      }
      const { holder } = attempt;
      if (holder !== undefined) {
        const server = await serving(holder, dataDir);
        if (server !== undefined) {
          stopWaiting("ready");
          return { holder: server };
        }
        if (!sameHolder(waitingFor, holder)) {
          stopWaiting("released");
          waitingFor = holder;
          deadline = Date.now() + waitMs;
          const what = holder.shared ? "to have its server ready" : "to finish with it";
          progress.start(`idemq: the embedded PostgreSQL in ${shown} is in use by PID ${holder.pid} (${holder.command}); waiting ${what} ...`);
        }
        if (Date.now() > deadline) throw inUse(holder, shown, waitMs);
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  } catch (error) {
    stopWaiting("gave up");
    throw error;
  }
}

function inUse(holder: LockContent, shown: string, waitMs: number): Error {
  const alternative = holder.url ? ` ${holder.url}` : "";
  return new Error(
    `the data directory ${shown} is in use by PID ${holder.pid} (an idemq process: ${holder.command}), ` +
      `still after ${waitMs / 1000} s; stop it or pass --database-url${alternative}`,
  );
}

/** The live process that shares its server in `dataDir`, when that server answers (nothing is locked or waited for). */
export async function servingHolder(dataDir: string): Promise<ServingHolder | undefined> {
  const holder = readLock(lockPath(dataDir));
  if (holder === undefined || holder.pid === process.pid || !holderRunning(holder)) return undefined;
  return serving(holder, dataDir);
}

/** The holder, when it shares its server and that server is up and answers as the server of this data directory. */
async function serving(holder: LockContent, dataDir: string): Promise<ServingHolder | undefined> {
  const { url, postmasterPid } = holder;
  if (!holder.shared || url === undefined || postmasterPid === undefined || !pidAlive(postmasterPid)) return undefined;
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: CHECK_TIMEOUT_MS });
  client.on("error", () => {});
  try {
    await client.connect();
    // Not some other server that took the port: the one whose data is here.
    const { rows } = await client.query<{ dir: string }>("SELECT current_setting('data_directory') AS dir");
    const same = rows[0] !== undefined && realpathSync(rows[0].dir) === realpathSync(dataDir);
    return same ? { ...holder, url, postmasterPid } : undefined;
  } catch {
    return undefined;
  } finally {
    await client.end().catch(() => {});
  }
}

export interface BorrowedServer {
  /** The error to report instead of a failed query's once the holder has stopped the server. */
  serverLost(): Error | undefined;
  /** Stops watching; leaves the server alone (it is the holder's). */
  close(): Promise<void>;
}

/** Watches the holder's server; `onLost` runs once it is gone. */
export function borrowServer(
  holder: ServingHolder,
  dataDir: string,
  shown: string,
  onLost: (error: Error) => void,
): BorrowedServer {
  const lost = (): Error =>
    new Error(
      `the embedded PostgreSQL in ${shown}, run by PID ${holder.pid} (${holder.command}), ` +
        "stopped while this command was using it; run the command again",
    );
  const watcher = setInterval(() => {
    if (pidAlive(holder.postmasterPid)) return;
    clearInterval(watcher);
    onLost(lost());
  }, WATCH_MS);
  watcher.unref();
  return {
    serverLost() {
      const now = readLock(lockPath(dataDir));
      const stillServing = sameHolder(now, holder) && now?.shared === true && pidAlive(holder.postmasterPid);
      return stillServing ? undefined : lost();
    },
    close: async () => clearInterval(watcher),
  };
}
