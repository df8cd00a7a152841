// Looking at an embedded data directory from a test: its server's PID, whether
// a process lives, its lock file; and stopping a server a failed test left.
import { readFileSync } from "node:fs";
import { waitFor } from "../fixtures/worker/wait.ts";

export interface LockFile {
  pid: number;
  command: string;
  startedAt: string;
  url?: string;
  postmasterPid?: number;
  shared?: boolean;
}

export function postmasterPidOf(dataDir: string): number | undefined {
  try {
    return Number.parseInt(readFileSync(`${dataDir}/postmaster.pid`, "utf8").split("\n")[0]!, 10);
  } catch {
    return undefined;
  }
}

export function readLockFile(dataDir: string): LockFile | undefined {
  try {
    return JSON.parse(readFileSync(`${dataDir}.lock`, "utf8")) as LockFile;
  } catch {
    return undefined;
  }
}

/** Alive and not a zombie. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** Stops the server still running in `dataDir` (left by a failed test), before its directory is removed. */
export async function stopLeftoverServer(dataDir: string): Promise<void> {
  const pid = postmasterPidOf(dataDir);
  if (pid === undefined || !alive(pid)) return;
  try {
    process.kill(pid, "SIGINT");
  } catch {
    return;
  }
  await waitFor(() => !alive(pid), { what: `leftover server ${pid} to stop` });
}
