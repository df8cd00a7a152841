// The parent's side of a worker child process (bench/worker-child.ts): spawn
// it under this same Node (and tsx), wait for "ready" and "done", kill it on
// timeout. The child's output goes to stderr so --json output stays clean.

import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { Mode, SystemName } from "./systems/types.ts";

export interface ChildConfig {
  system: SystemName;
  mode: Mode;
  concurrency: number;
  url: string;
  /** Handler calls that end the run. */
  expect: number;
  /**
   * throughput: until `expect` handler calls; latency: the same, recording
   * each job's delay; share: one of several workers on one queue, until the
   * database shows no unfinished job (its count is its share).
   */
  kind: "throughput" | "latency" | "share";
  notify: boolean;
  /** The worker claims from these queues only, and the run ends when they are empty (process.many-queues; idemq). */
  queues?: string[];
  /** idemq: its default settings instead of the tuned ones. */
  defaults?: boolean;
}

export interface ChildResult {
  jobs: number;
  seconds: number;
  machineCpuSeconds: number;
  workerCpuSeconds: number;
  /** CPU of the worker's PostgreSQL backends; null when the server is not readable in /proc. */
  backendCpuSeconds: number | null;
  maxRssKb: number;
  /** Statements the worker's pg clients sent during the window: its round trips. */
  statements: number;
  latenciesMs: number[];
  /** Latency runs: where each job's latency went (worker-child.ts, pathOf), for the jobs whose path the statements show. */
  paths: { wake: number; fetch: number; dispatch: number }[];
}

export type ChildMessage =
  | { type: "ready" }
  | { type: "done"; result: ChildResult }
  | { type: "error"; message: string }
  /** The child's sharedClockMs(), answering a ParentMessage "clock". */
  | { type: "clock"; ms: number };

export type ParentMessage = { type: "clock" };

export interface WorkerChild {
  ready: Promise<void>;
  done: Promise<ChildResult>;
  exited: Promise<void>;
  /** The child's sharedClockMs() (bench/measure.ts), read on request. */
  readClock(): Promise<number>;
  kill(): void;
}

const CHILD = fileURLToPath(new URL("./worker-child.ts", import.meta.url));

export function spawnWorker(config: ChildConfig, timeoutMs: number): WorkerChild {
  const child = spawn(process.execPath, ["--import", "tsx", CHILD, JSON.stringify(config)], {
    stdio: ["ignore", "pipe", "pipe", "ipc"],
  });
  const prefix = `[${config.system}:${config.mode} worker] `;
  const forward = (chunk: Buffer) => {
    for (const line of chunk.toString().split("\n")) if (line.trim()) process.stderr.write(prefix + line + "\n");
  };
  child.stdout!.on("data", forward);
  child.stderr!.on("data", forward);

  let markReady!: () => void;
  let markDone!: (r: ChildResult) => void;
  let rejectReady!: (e: Error) => void;
  let rejectDone!: (e: Error) => void;
  const ready = new Promise<void>((res, rej) => ((markReady = res), (rejectReady = rej)));
  const done = new Promise<ChildResult>((res, rej) => ((markDone = res), (rejectDone = rej)));
  ready.catch(() => {});
  done.catch(() => {});
  // Settling a settled promise is a no-op, so this is safe after ready/done.
  const failAll = (e: Error) => {
    rejectReady(e);
    rejectDone(e);
  };

  const timer = setTimeout(() => {
    failAll(new Error(`${prefix}timed out after ${timeoutMs} ms`));
    child.kill("SIGKILL");
  }, timeoutMs);

  const clockReads: ((ms: number) => void)[] = [];
  child.on("message", (message: ChildMessage) => {
    if (message.type === "clock") clockReads.shift()?.(message.ms);
    else if (message.type === "ready") markReady();
    else if (message.type === "done") markDone(message.result);
    else failAll(new Error(`${prefix}${message.message}`));
  });
  const exited = new Promise<void>((resolve) => {
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      failAll(new Error(`${prefix}exited (code ${code}, signal ${signal}) before reporting`));
      resolve();
    });
  });
  const readClock = () =>
    new Promise<number>((resolve, reject) => {
      clockReads.push(resolve);
      child.send({ type: "clock" } satisfies ParentMessage, (err) => err && reject(err));
    });
  return { ready, done, exited, readClock, kill: () => child.kill("SIGKILL") };
}
