// Processes around an embedded data directory: whether a PID is alive, which
// PostgreSQL server runs in a directory, and stopping one a killed process left
// behind. Linux answers from /proc; elsewhere (macOS) `ps` does.
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const STOP_TIMEOUT_MS = 30_000;
const STOP_POLL_MS = 50;

interface ProcessInfo {
  ppid: number;
  /** The state letter: R, S, D, Z (zombie), X (dead), ... */
  state: string;
  /** The command line, its arguments joined by spaces. */
  command: string;
}

/** Alive: it exists and is not a zombie (a process that exited but was not reaped yet). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  // /proc only: this is polled, and without /proc (macOS) the parent reaps soon enough.
  const state = procStatFields(pid)?.[0];
  return state !== "Z" && state !== "X";
}

/** Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot (Linux only), to tell it from a later process given the same PID. */
export function processStartTime(pid: number): string | undefined {
  return procStatFields(pid)?.[19];
}

/** The PID in `postmaster.pid`: the server running in the directory, if any. */
export function postmasterPid(dataDir: string): number | undefined {
  try {
    const pid = Number.parseInt(readFileSync(join(dataDir, "postmaster.pid"), "utf8").split("\n")[0] ?? "", 10);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The PostgreSQL server running in `dataDir`: the PID its postmaster.pid names,
 * alive and started on that directory (not a later process given the same PID).
 */
export function runningServer(dataDir: string): { pid: number; ppid: number } | undefined {
  const pid = postmasterPid(dataDir);
  if (pid === undefined || !pidAlive(pid)) return undefined;
  const info = processInfo(pid);
  if (info === undefined || !info.command.includes(dataDir)) return undefined;
  return { pid, ppid: info.ppid };
}

/**
 * Stops a server left running by a process that died (SIGKILL, OOM) with SIGINT,
 * PostgreSQL's fast shutdown, and waits until it is gone.
 */
export async function stopLeftoverServer(pid: number, dataDir: string): Promise<void> {
  try {
    process.kill(pid, "SIGINT");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ESRCH") return;
    throw error;
  }
  const deadline = Date.now() + STOP_TIMEOUT_MS;
  while (pidAlive(pid)) {
    if (Date.now() > deadline) {
      throw new Error(`PostgreSQL PID ${pid} left running in ${dataDir} did not stop after SIGINT; kill it and retry`);
    }
    await new Promise((r) => setTimeout(r, STOP_POLL_MS));
  }
}

/** undefined when the process does not exist or cannot be read. */
function processInfo(pid: number): ProcessInfo | undefined {
  const fields = procStatFields(pid);
  if (fields !== undefined) {
    let command = "";
    try {
      command = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ").trim();
    } catch {
      // Gone meanwhile: the command stays empty.
    }
    return { state: fields[0] ?? "", ppid: Number(fields[1]), command };
  }
  const result = spawnSync("ps", ["-o", "ppid=", "-o", "stat=", "-o", "args=", "-p", String(pid)], { encoding: "utf8" });
  const match = /^\s*(\d+)\s+(\S+)\s+(.*)$/.exec(result.stdout?.trim() ?? "");
  if (!match) return undefined;
  return { ppid: Number(match[1]), state: (match[2] ?? "").charAt(0), command: match[3] ?? "" };
}

/** The fields of /proc/<pid>/stat after "pid (comm) ", the comm possibly holding spaces and parentheses; field 3 (state) first. */
function procStatFields(pid: number): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  } catch {
    return undefined;
  }
}
