// The lock file next to an embedded data directory (`.idemq/pg.lock`): which
// idemq process runs the server there (PID and start time, command), the URL
// of its database once it is ready, its postmaster PID, and whether it lets
// other CLI commands use the server meanwhile (`shared`). share.ts decides
// what to do with a lock someone else holds.
import { linkSync, readFileSync, renameSync, rmSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { basename } from "node:path";
import { pidAlive, processStartTime, runningServer, stopLeftoverServer } from "./processes.ts";

export interface LockContent {
  pid: number;
  /** Start time of the process (Linux), to tell it from a later process given the same PID. */
  processStart?: string;
  command: string;
  startedAt: string;
  /** The database `idemq` on the server, written once it is ready for use. */
  url?: string;
  postmasterPid?: number;
  /** Other CLI commands may use the server while the holder runs (a worker, `stats --watch`, the demo). */
  shared?: boolean;
}

export interface Lock {
  update(fields: Partial<LockContent>): void;
  release(): void;
}

/** The lock, or the live process holding it (undefined: a lock being written this very moment). */
export type LockAttempt = { lock: Lock } | { holder: LockContent | undefined };

export function lockPath(dataDir: string): string {
  return `${dataDir}.lock`;
}

/**
 * Takes `<dataDir>.lock`, created atomically (a hard link fails when the name
 * exists), or names its live holder. A lock whose holder died is stale: the
 * server it may have left running is stopped and the lock taken over.
 */
export async function tryLock(dataDir: string, shown: string, fields: Partial<LockContent>): Promise<LockAttempt> {
  const path = lockPath(dataDir);
  const processStart = processStartTime(process.pid);
  let content: LockContent = {
    pid: process.pid,
    ...(processStart === undefined ? {} : { processStart }),
    command: commandLine(),
    startedAt: new Date().toISOString(),
    ...fields,
  };
  for (let attempt = 0; attempt < 5; attempt++) {
    const temp = `${path}.${process.pid}.tmp`;
    writeFileSync(temp, JSON.stringify(content));
    try {
      linkSync(temp, path);
      unlinkSync(temp);
      let released = false;
      const releaseOnExit = (): void => release();
      const release = (): void => {
        if (released) return;
        released = true;
        process.removeListener("exit", releaseOnExit);
        if (readLock(path)?.pid === process.pid) rmSync(path, { force: true });
      };
      process.on("exit", releaseOnExit);
      return {
        lock: {
          update(more) {
            content = { ...content, ...more };
            writeFileSync(temp, JSON.stringify(content));
            renameSync(temp, path);
          },
          release,
        },
      };
    } catch (error) {
      rmSync(temp, { force: true });
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
    const holder = readLock(path);
    if (holder !== undefined && holder.pid !== process.pid && holderRunning(holder)) return { holder };
    if (holder === undefined && recentlyCreated(path)) return { holder: undefined };
    // Whatever its parent now is (PID 1 or a subreaper): the holder that ran it is gone.
    const leftover = runningServer(dataDir);
    if (leftover !== undefined && leftover.pid === holder?.postmasterPid) await stopLeftoverServer(leftover.pid, dataDir);
    rmSync(path, { force: true });
  }
  throw new Error(`could not lock the data directory ${shown} (${path} keeps changing); try again`);
}

export function readLock(path: string): LockContent | undefined {
  try {
    const parsed = JSON.parse(readFileSync(path, "utf8")) as Partial<LockContent>;
    if (typeof parsed.pid !== "number") return undefined;
    return { command: "", startedAt: "", ...parsed } as LockContent;
  } catch {
    return undefined;
  }
}

/** The same holder: a lock rewritten by its process (update) is still that holder's. */
export function sameHolder(a: LockContent | undefined, b: LockContent): boolean {
  return a !== undefined && a.pid === b.pid && a.startedAt === b.startedAt;
}

function recentlyCreated(path: string): boolean {
  try {
    return Date.now() - statSync(path).mtimeMs < 2_000;
  } catch {
    return false;
  }
}

function commandLine(): string {
  const script = process.argv[1] ? basename(process.argv[1]) : "node";
  const name = script === "idemq.js" || script === "idemq" ? "idemq" : script;
  return [name, ...process.argv.slice(2)].join(" ").slice(0, 120);
}

/** Alive, and still the process that wrote the lock (not a reused PID: same start time). */
export function holderRunning(holder: LockContent): boolean {
  if (!pidAlive(holder.pid)) return false;
  const started = processStartTime(holder.pid);
  return started === undefined || holder.processStart === undefined || started === holder.processStart;
}
