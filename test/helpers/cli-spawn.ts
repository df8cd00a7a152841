// A long-running CLI subprocess (stats --watch, a process holding the embedded
// server) that a test can read line by line and signal. runCli (cli.ts) is for
// commands that finish by themselves.
import { type ChildProcess, spawn } from "node:child_process";
import { resolve } from "node:path";
import { CLI } from "./cli.ts";

export interface CliProcess {
  child: ChildProcess;
  pid: number;
  stdout(): string;
  stderr(): string;
  /** Resolves with the first stdout line matching `test` (rejects if the process exits first). */
  waitForLine(test: (line: string) => boolean, timeoutMs?: number): Promise<string>;
  /** Resolves when the process exits. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }>;
}

export interface StartCliOptions {
  env?: Record<string, string>;
  /** In a process group of its own, so a test can signal the group as a terminal's Ctrl-C does. */
  detached?: boolean;
  /** Working directory (default: the repository root). */
  cwd?: string;
}

const running = new Set<ChildProcess>();

/** SIGKILLs every process still running (call in afterAll). */
export function killAll(): void {
  for (const child of running) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
}

export function startCli(args: string[], options: StartCliOptions = {}): CliProcess {
  return startNode([CLI, ...args], options);
}

/** `node <nodeArgs>` with the same environment rules as startCli (e.g. a fixture run with --import tsx). */
export function startNode(nodeArgs: string[], options: StartCliOptions = {}): CliProcess {
  const env: NodeJS.ProcessEnv = { ...process.env, ...options.env, NO_COLOR: "1" };
  if (options.env?.DATABASE_URL === undefined) delete env.DATABASE_URL;
  const child = spawn(process.execPath, nodeArgs, {
    cwd: options.cwd ?? resolve(import.meta.dirname, "..", ".."),
    env,
    stdio: ["ignore", "pipe", "pipe"],
    detached: options.detached ?? false,
  });
  running.add(child);
  let out = "";
  let err = "";
  const waiters = new Set<() => void>();
  child.stdout!.on("data", (chunk: Buffer) => {
    out += chunk.toString();
    for (const wake of waiters) wake();
  });
  child.stderr!.on("data", (chunk: Buffer) => (err += chunk.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }>(
    (resolve) => {
      child.on("close", (code, signal) => {
        running.delete(child);
        for (const wake of waiters) wake();
        resolve({ code, signal, stdout: out, stderr: err });
      });
    },
  );
  let done = false;
  void exited.then(() => (done = true));
  return {
    child,
    pid: child.pid!,
    stdout: () => out,
    stderr: () => err,
    exited,
    waitForLine(test, timeoutMs = 30_000) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => finish(new Error(`no matching line after ${timeoutMs} ms; stdout:\n${out}\nstderr:\n${err}`)), timeoutMs);
        const finish = (error?: Error, line?: string): void => {
          clearTimeout(timer);
          waiters.delete(check);
          if (error) reject(error);
          else resolve(line!);
        };
        const check = (): void => {
          const line = out.split("\n").find((candidate) => candidate !== "" && test(candidate));
          if (line !== undefined) finish(undefined, line);
          else if (done || child.exitCode !== null || child.signalCode !== null) finish(new Error(`exited (${child.exitCode}) first; stdout:\n${out}\nstderr:\n${err}`));
        };
        waiters.add(check);
        check();
      });
    },
  };
}
