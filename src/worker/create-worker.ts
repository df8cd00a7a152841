// createWorker(): wires the claim loop, job runner, completer, heartbeat,
// rescuer and listener around one pool, and runs the shutdown sequence.
import { EventEmitter } from "node:events";
import pg from "pg";
import { checkSchema } from "../schema-check.ts";
import type { ClaimedJob } from "../sql-api.ts";
import { Completer } from "./completer.ts";
import { ClaimLoop } from "./claim-loop.ts";
import { APPLICATION_NAME } from "./defaults.ts";
import { asError, type WorkerEvents } from "./events.ts";
import { Heartbeat } from "./heartbeat.ts";
import { Listener } from "./listener.ts";
import { WaitMarker } from "./wait-marker.ts";
import { Rescuer } from "./rescuer.ts";
import { runJob } from "./run-job.ts";
import { safeEmit, type HeldJob, type Runtime } from "./runtime.ts";
import { normalizeSettings, type Settings } from "./settings.ts";
import { handBack, installSignalHandlers, releaseBuffered } from "./shutdown.ts";
import { normalizeTasks, WorkerConfigError, type NormalizedTask } from "./task-config.ts";
import { sleep } from "./timers.ts";
import type { WorkerOptions } from "./types.ts";

type State = "new" | "starting" | "running" | "stopping" | "stopped";

/** How long stop() waits for the pool to close before giving up on connections a stuck handler holds. */
const POOL_END_TIMEOUT_MS = 5000;

export function createWorker(options: WorkerOptions): Worker {
  return new Worker(options);
}

export class Worker extends EventEmitter<WorkerEvents> {
  readonly workerId: string;
  /** rescue() and prune_keys(): `runOnce()` / `pruneOnce()` run them now. */
  readonly rescuer: Rescuer;

  private state: State = "new";
  private readonly pool: pg.Pool;
  private readonly ownsPool: boolean;
  private readonly settings: Settings;
  private readonly rt: Runtime;
  private readonly buffer: HeldJob[] = [];
  private running = 0;
  /** Each started job until its attempt is recorded. */
  private readonly inFlight = new Map<HeldJob, Promise<void>>();
  private readonly claimLoop: ClaimLoop;
  private readonly completer: Completer;
  private readonly heartbeat: Heartbeat;
  private readonly listener: Listener;
  private readonly marker: WaitMarker;
  private stopping: Promise<void> | undefined;
  private removeSignalHandlers: (() => void) | undefined;
  private readonly stoppedPromise: Promise<void>;
  private resolveStopped!: () => void;

  constructor(options: WorkerOptions) {
    super();
    if (options === null || typeof options !== "object") throw new WorkerConfigError("createWorker needs an options object");
    const tasks = normalizeTasks(options.tasks);
    this.settings = normalizeSettings(options);
    this.workerId = this.settings.workerId;

    let listenConfig: pg.ClientConfig;
    if (options.pool !== undefined) {
      this.pool = options.pool;
      this.ownsPool = false;
      // The LISTEN and wait-marker connections cannot come from the pool (they are held for good): same settings, own clients.
      const { max: _max, min: _min, idleTimeoutMillis: _idle, ...clientConfig } = options.pool.options as pg.PoolConfig;
      listenConfig = clientConfig;
    } else if (typeof options.connectionString === "string" && options.connectionString !== "") {
      this.pool = new pg.Pool({
        fallback_application_name: APPLICATION_NAME.pool,
        // One connection per running transactional job, plus claim, completion, heartbeat and maintenance.
        max: this.settings.concurrency + 4,
        ...options.poolConfig,
        connectionString: options.connectionString,
      });
      this.ownsPool = true;
      listenConfig = { connectionString: options.connectionString };
    } else {
      throw new WorkerConfigError("createWorker needs { connectionString } or { pool }");
    }
    // Without a listener an idle client's error (a server restart) would crash the process.
    this.pool.on("error", this.onPoolError);

    this.rt = {
      pool: this.pool,
      settings: this.settings,
      tasks,
      held: new Map(),
      emit: (event, ...args) => safeEmit(this, event, args, (error) => this.report(`a "${event}" listener`, error)),
      report: (during, error) => this.report(during, error),
      wakeAt: (at) => this.listener.wakeAt(at),
    };
    this.marker = new WaitMarker(this.rt, listenConfig, () => this.claimLoop.wake());
    this.claimLoop = new ClaimLoop(this.rt, () => this.room(), (jobs) => this.onClaimed(jobs, tasks), this.marker);
    this.completer = new Completer(this.rt, (held) => this.settle(held));
    this.heartbeat = new Heartbeat(this.rt, (held) => this.dropFromBuffer(held));
    this.rescuer = new Rescuer(this.rt);
    this.listener = new Listener(this.rt, listenConfig, () => this.claimLoop.wake());
    this.stoppedPromise = new Promise((resolve) => (this.resolveStopped = resolve));
  }

  /**
   * Checks the database has this version's idemq schema (else a
   * SchemaMissingError naming `idemq migrate`), connects the listener, then
   * starts claiming, heartbeats and maintenance. Resolves once running.
   */
  async start(): Promise<void> {
    if (this.state !== "new") throw new Error(`worker ${this.workerId} was already started`);
    this.state = "starting";
    try {
      await checkSchema(this.pool);
      await this.listener.start();
    } catch (error) {
      await this.listener.stop();
      await this.closePool();
      this.state = "stopped";
      this.resolveStopped();
      throw error;
    }
    if (this.state !== "starting") {
      // stop() was called meanwhile and found nothing started yet.
      await this.listener.stop();
      return;
    }
    this.state = "running";
    this.heartbeat.start();
    this.rescuer.start();
    this.claimLoop.start();
    if (this.settings.handleSignals) {
      this.removeSignalHandlers = installSignalHandlers(this.rt, () => this.stop(), () => this.running);
    }
    this.rt.emit("worker:started", { workerId: this.workerId });
  }

  /**
   * Stops claiming, releases unstarted jobs, lets running jobs finish within
   * shutdownTimeout, hands the rest back, flushes completions and closes
   * connections. Idempotent.
   */
  stop(): Promise<void> {
    this.stopping ??= this.shutdown();
    return this.stopping;
  }

  /** Resolves when the worker has stopped (after stop(), or a signal). */
  wait(): Promise<void> {
    return this.stoppedPromise;
  }

  /** Jobs whose handlers are running now. */
  get runningCount(): number {
    return this.running;
  }

  private async shutdown(): Promise<void> {
    const wasStarted = this.state === "running" || this.state === "starting";
    this.state = "stopping";
    try {
      if (wasStarted) await this.drain();
    } finally {
      this.removeSignalHandlers?.();
      await this.closePool();
      this.state = "stopped";
      this.rt.emit("worker:stopped", { workerId: this.workerId });
      this.resolveStopped();
    }
  }

  private async drain(): Promise<void> {
    await this.claimLoop.stop();
    await Promise.all([this.listener.stop(), this.marker.stop(), this.rescuer.stop()]);
    await releaseBuffered(this.rt, this.buffer.splice(0));

    const finished = Promise.all(this.inFlight.values()).then(() => true);
    const stopWaiting = new AbortController();
    const timedOut = sleep(this.settings.shutdownTimeoutMs, stopWaiting.signal).then(() => false);
    const allFinished = await Promise.race([finished, timedOut]);
    stopWaiting.abort();
    if (!allFinished) {
      const late = [...this.rt.held.values()].filter((held) => held.phase === "running");
      await Promise.all(late.map((held) => handBack(this.rt, held)));
      // The others are recording their outcome (fail, snooze, complete): let them.
      await Promise.all([...this.inFlight].filter(([held]) => !held.abandoned).map(([, done]) => done));
    }
    await this.completer.drain();
    await this.heartbeat.stop();
  }

  private room(): number {
    if (this.state !== "running") return 0;
    const { concurrency, prefetch } = this.settings;
    if (this.buffer.length > Math.floor(prefetch / 2)) return 0;
    const slots = concurrency + prefetch - this.running - this.buffer.length;
    // Jobs whose outcome is still being recorded (a complete_many in flight)
    // are held too: when recording falls behind, claiming waits for it.
    const unrecorded = 2 * (concurrency + prefetch) - this.rt.held.size;
    return Math.min(slots, unrecorded);
  }

  private onClaimed(jobs: ClaimedJob[], tasks: ReadonlyMap<string, NormalizedTask>): void {
    for (const job of jobs) {
      const held: HeldJob = {
        job,
        task: tasks.get(job.task),
        phase: "buffered",
        controller: new AbortController(),
        leaseLost: false,
        abandoned: false,
        startedAt: performance.now(),
        endedAt: undefined,
        snoozeDelay: undefined,
        tx: undefined,
      };
      this.rt.held.set(job.id, held);
      this.buffer.push(held);
    }
    this.startFromBuffer();
  }

  private startFromBuffer(): void {
    while (this.state === "running" && this.running < this.settings.concurrency && this.buffer.length > 0) {
      this.startJob(this.buffer.shift()!);
    }
  }

  private startJob(held: HeldJob): void {
    this.running++;
    let freed = false;
    const freeSlot = (): void => {
      if (freed) return;
      freed = true;
      this.running--;
      this.startFromBuffer();
      this.claimLoop.kick();
    };
    const done = runJob(this.rt, held, this.completer, freeSlot)
      .catch((error) => this.report(`running job ${held.job.id}`, error))
      .finally(() => {
        freeSlot();
        this.inFlight.delete(held);
        this.claimLoop.kick();
      });
    this.inFlight.set(held, done);
  }

  private dropFromBuffer(held: HeldJob): void {
    const i = this.buffer.indexOf(held);
    if (i >= 0) this.buffer.splice(i, 1);
    this.settle(held);
    this.claimLoop.kick();
  }

  private settle(held: HeldJob): void {
    if (this.rt.held.get(held.job.id) === held) this.rt.held.delete(held.job.id);
    this.claimLoop.kick();
  }

  private report(during: string, error: unknown): void {
    try {
      this.emit("worker:error", { workerId: this.workerId, during, error: asError(error) });
    } catch {
      // a throwing worker:error listener has nowhere left to report to
    }
  }

  private readonly onPoolError = (error: Error): void => {
    this.report("an idle pool connection", error);
  };

  private async closePool(): Promise<void> {
    if (this.ownsPool) {
      try {
        // end() waits for checked-out connections; a handed-back handler may never return its own.
        const ended = this.pool.end();
        const timeout = new AbortController();
        await Promise.race([ended, sleep(POOL_END_TIMEOUT_MS, timeout.signal)]);
        timeout.abort();
      } catch (error) {
        this.report("closing the pool", error);
      }
    }
    this.pool.off("error", this.onPoolError);
    // Our connections still closing may yet report errors: keep a listener (a no-op once stopped).
    if (this.ownsPool) this.pool.on("error", () => {});
  }
}
