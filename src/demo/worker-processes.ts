// The demo's workers are real processes: `idemq worker` (bin/idemq.js) with the
// demo's tasks module (worker-tasks.js beside this file in dist/, or .ts when
// this module itself runs from source under tsx), printing its events as
// JSON lines. They connect to the demo's database by URL and never own the
// embedded server, so the demo can SIGKILL one without harming PostgreSQL.
import { type ChildProcess, spawn } from "node:child_process";
import { EventEmitter } from "node:events";
import { extname } from "node:path";
import { fileURLToPath } from "node:url";

const CLI = fileURLToPath(new URL("../../bin/idemq.js", import.meta.url));
/** The demo's tasks module. */
export const DEMO_TASKS_MODULE = fileURLToPath(new URL(`./worker-tasks${extname(fileURLToPath(import.meta.url))}`, import.meta.url));

/** One event line of `idemq worker --log-format json`. */
export interface WorkerEvent {
  time: string;
  event: string;
  workerId?: string;
  jobId?: string;
  task?: string;
  attempt?: number;
  reclaimed?: boolean;
  error?: { class: string; message: string };
  [field: string]: unknown;
}

export interface DemoWorkerOptions {
  /** Shown in the demo's output and part of the worker id. */
  name: string;
  databaseUrl: string;
  queues: readonly string[];
  concurrency: number;
  /** IDEMQ_DEMO_* settings for worker-tasks.ts (LEASE, RESCUE, POLL, PREFETCH, EMAIL_URL...). */
  settings?: Record<string, string>;
}

export class DemoWorker extends EventEmitter<{ event: [WorkerEvent] }> {
  readonly name: string;
  readonly pid: number;
  readonly events: WorkerEvent[] = [];
  /** Resolves with how the process ended. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private readonly child: ChildProcess;
  private stderrTail = "";
  private exitedYet = false;

  constructor(options: DemoWorkerOptions) {
    super();
    this.name = options.name;
    const settings = Object.fromEntries(
      Object.entries({ WORKER_NAME: options.name, ...options.settings }).map(([k, v]) => [`IDEMQ_DEMO_${k}`, v]),
    );
    this.child = spawn(
      process.execPath,
      [
        CLI,
        "worker",
        "--tasks",
        DEMO_TASKS_MODULE,
        "--log-format",
        "json",
        "--queues",
        options.queues.join(","),
        "--concurrency",
        String(options.concurrency),
      ],
      {
        env: { ...process.env, ...settings, DATABASE_URL: options.databaseUrl },
        // fd 3 is an IPC channel the worker watches: it exits when the demo dies.
        stdio: ["ignore", "pipe", "pipe", "ipc"],
      },
    );
    this.pid = this.child.pid ?? 0;
    this.exited = new Promise((resolve) => {
      this.child.on("exit", (code, signal) => {
        this.exitedYet = true;
        resolve({ code, signal });
      });
      this.child.on("error", (error) => {
        this.stderrTail += `${error.message}\n`;
        this.exitedYet = true;
        resolve({ code: null, signal: null });
      });
    });
    let partial = "";
    this.child.stdout!.setEncoding("utf8");
    this.child.stdout!.on("data", (chunk: string) => {
      partial += chunk;
      const lines = partial.split("\n");
      partial = lines.pop()!;
      for (const line of lines) {
        if (line.trim() === "") continue;
        let event: WorkerEvent;
        try {
          event = JSON.parse(line) as WorkerEvent;
        } catch {
          this.stderrTail = `${this.stderrTail}${line}\n`.slice(-4000);
          continue;
        }
        this.events.push(event);
        this.emit("event", event);
      }
    });
    this.child.stderr!.setEncoding("utf8");
    this.child.stderr!.on("data", (chunk: string) => (this.stderrTail = (this.stderrTail + chunk).slice(-4000)));
  }

  /** Resolves once the worker runs (its worker:started line); rejects if it exits first. */
  async started(timeoutMs = 90_000): Promise<void> {
    await this.waitFor((e) => e.event === "worker:started", "to start", timeoutMs);
  }

  /** Resolves with the first event (past or future) that matches. */
  waitFor(match: (event: WorkerEvent) => boolean, what: string, timeoutMs = 60_000): Promise<WorkerEvent> {
    const seen = this.events.find(match);
    if (seen !== undefined) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const onEvent = (event: WorkerEvent): void => {
        if (!match(event)) return;
        cleanup();
        resolve(event);
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`worker ${this.name} (pid ${this.pid}) did not get ${what} within ${timeoutMs / 1000} s${this.tail()}`));
      }, timeoutMs);
      void this.exited.then(({ code, signal }) => {
        cleanup();
        reject(new Error(`worker ${this.name} (pid ${this.pid}) exited (${signal ?? `code ${code}`}) before ${what}${this.tail()}`));
      });
      let done = false;
      const cleanup = (): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        this.off("event", onEvent);
      };
      this.on("event", onEvent);
    });
  }

  count(event: string, task?: string): number {
    return this.events.filter((e) => e.event === event && (task === undefined || e.task === task)).length;
  }

  /** SIGKILL: the process dies at once, whatever it holds. */
  async kill(): Promise<void> {
    if (!this.exitedYet) this.child.kill("SIGKILL");
    await this.exited;
  }

  /** SIGTERM (the worker drains), then SIGKILL if it has not exited after graceMs. */
  async stop(graceMs = 10_000): Promise<void> {
    if (this.exitedYet) return;
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), graceMs);
    await this.exited;
    clearTimeout(timer);
  }

  private tail(): string {
    const text = this.stderrTail.trim();
    return text === "" ? "" : `; its output ended with:\n${text.split("\n").slice(-8).join("\n")}`;
  }
}
