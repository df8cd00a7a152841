// createWorker(): wires the claim loop, job runner, completer, heartbeat,
// maintenance services and wake-ups (listen or poll mode) around one pool and
// one record of held jobs (HeldJobs), and runs the shutdown sequence.
import { EventEmitter } from "node:events";
import pg from "pg";
import { defaultConnectionString } from "../database-url.ts";
import { checkSchema } from "../schema-check.ts";
import type { ClaimedJob } from "../sql/index.ts";
import { Completer } from "./completer.ts";
import { ClaimLoop, claimTarget } from "./claim-loop.ts";
import { APPLICATION_NAME, type WakeUpMode } from "./defaults.ts";
import { asError, type WorkerEvents } from "./events.ts";
import { Heartbeat } from "./heartbeat.ts";
import { HeldJobs, isReleased, type HeldJob } from "./held-jobs.ts";
import { KeyPruner } from "./maintenance/key-pruner.ts";
import { PreparedCalls } from "./prepared-calls.ts";
import { transactionPoolerEvidence } from "./wake-ups/pooler-probe.ts";
import { ListenWakeUps, PollWakeUps, type WakeUps } from "./wake-ups/wake-ups.ts";
import { Rescuer } from "./maintenance/rescuer.ts";
import { Retainer } from "./maintenance/retainer.ts";
import { Ticker } from "./maintenance/ticker.ts";
import { runJob } from "./run-job.ts";
import { loadOtelApi } from "../tracing/otel-api.ts";
import { AttemptTracing } from "../tracing/spans.ts";
import { declareLimits } from "./declared-limits.ts";
import { declareSchedules } from "./schedules.ts";
import { normalizeSettings, type Settings } from "./settings.ts";
import { handBack, installSignalHandlers, releaseClaimed, releaseOverBudget } from "./shutdown.ts";
import { normalizeTasks, WorkerConfigError } from "./task-config.ts";
import { sleep } from "./timers.ts";
import type { WorkerOptions } from "./types.ts";
import { safeEmit, timedCalls, type WorkerState } from "./worker-state.ts";
import { openConnection, Outage } from "./outage.ts";
import { Presence } from "./maintenance/presence.ts";

type Lifecycle = "new" | "starting" | "running" | "stopping" | "stopped";

/** How long stop() waits for the pool to close before giving up on connections a stuck handler holds. */
const POOL_END_TIMEOUT_MS = 5000;
const WORKER_NEEDS = "createWorker needs { connectionString } or { pool }";
/** A started job's inFlight entry while runJob is being called (startJob). */
const STARTING: Promise<void> = Promise.resolve();

export function createWorker(options: WorkerOptions): Worker {
  return new Worker(options);
}

export class Worker extends EventEmitter<WorkerEvents> {
  readonly workerId: string;
  /** rescue() on a timer; `runOnce()` runs it now. */
  readonly rescuer: Rescuer;
  readonly ticker: Ticker;
  /** prune_keys() on a timer; `runOnce()` runs it now. */
  readonly keyPruner: KeyPruner;
  /** apply_retention() on a timer, in batches; `runOnce()` runs it now and returns how many it deleted. */
  readonly retainer: Retainer;
  /** worker_seen() on a timer (the worker's row in idemq.workers); `runOnce()` refreshes it now. */
  readonly presence: Presence;

  private lifecycle: Lifecycle = "new";
  private readonly pool: pg.Pool;
  private readonly ownsPool: boolean;
  private readonly settings: Settings;
  private readonly state: WorkerState;
  /** Each started job until its attempt is recorded. */
  private readonly inFlight = new Map<HeldJob, Promise<void>>();
  /** Jobs beyond the buffer's byte budget being given back. */
  private readonly givingBack = new Set<Promise<void>>();
  private readonly claimLoop: ClaimLoop;
  private readonly completer: Completer;
  private readonly heartbeat: Heartbeat;
  /** Chosen at start: listen mode found behind a transaction pooler polls instead. */
  private wakeUps: WakeUps;
  /** Where the LISTEN and wait-marker connections go (listen mode). */
  private readonly listenConfig: pg.ClientConfig;
  /** A connection made as the pool's are (its settings without the pool's own), for the pooler probe. */
  private readonly poolClientConfig: pg.ClientConfig;
  /** The listen connections go where the pool's do (no listenConnectionString): one probe answers for both. */
  private readonly listenSharesPool: boolean;
  private readonly outage: Outage;
  private stopping: Promise<void> | undefined;
  /** start()'s worker_seen(): a stop() during start waits for it before worker_stopped(), so no row is left live behind. */
  private registered: Promise<unknown> = Promise.resolve();
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
      listenConfig = clientConfigOf(options.pool);
    } else if (options.connectionString === undefined || (typeof options.connectionString === "string" && options.connectionString !== "")) {
      const connectionString =
        options.connectionString ?? defaultConnectionString(WORKER_NEEDS, (message) => new WorkerConfigError(message));
      this.pool = new pg.Pool({
        fallback_application_name: APPLICATION_NAME.pool,
        // One connection per running transactional job, plus claim, completion, heartbeat and maintenance.
        max: this.settings.concurrency + 4,
        keepAlive: true,
        keepAliveInitialDelayMillis: this.settings.keepAliveDelayMs,
        ...options.poolConfig,
        connectionString,
      });
      this.ownsPool = true;
      listenConfig = {
        connectionString,
        keepAlive: true,
        keepAliveInitialDelayMillis: this.settings.keepAliveDelayMs,
      };
    } else {
      throw new WorkerConfigError(WORKER_NEEDS);
    }
    this.poolClientConfig = clientConfigOf(this.pool);
    this.listenSharesPool = options.listenConnectionString === undefined;
    if (options.listenConnectionString !== undefined) {
      // Split: LISTEN and the wait marker on a connection that keeps its session, claims and jobs through the pool.
      listenConfig = {
        connectionString: options.listenConnectionString,
        keepAlive: true,
        keepAliveInitialDelayMillis: this.settings.keepAliveDelayMs,
      };
    }
    this.listenConfig = listenConfig;
    // Without a listener an idle client's error (a server restart) would crash the process.
    this.pool.on("error", this.onPoolError);
    this.outage = new Outage(
      (downMs, failedCalls) => this.state.emit("worker:reconnected", { workerId: this.workerId, downMs, failedCalls }),
      () => openConnection(this.pool, this.settings.callTimeoutMs),
    );

    const calls = timedCalls(this.pool, this.settings.callTimeoutMs, (madeAt) => this.outage.reached(madeAt));
    this.state = {
      pool: this.pool,
      calls,
      preparedCalls: new PreparedCalls(calls, (message) => this.state.emit("log", { level: "warn", message, workerId: this.workerId })),
      settings: this.settings,
      tasks,
      held: new HeldJobs(tasks, this.settings, () => this.onRoomGrew()),
      tracing: undefined,
      emit: (event, ...args) => safeEmit(this, event, args, (error) => this.report(`a "${event}" listener`, error)),
      listening: (event) => this.listenerCount(event) > 0,
      report: (during, error) => this.report(during, error),
      reached: (madeAt) => this.outage.reached(madeAt),
      wakeAt: (at) => this.wakeUps.wakeAt(at),
    };
    this.wakeUps =
      this.settings.wakeUp === "poll" ? new PollWakeUps(this.state, this.wake) : new ListenWakeUps(this.state, listenConfig, this.wake);
    this.claimLoop = new ClaimLoop(this.state, () => this.room(), (jobs, asked) => this.onClaimed(jobs, asked), () => this.wakeUps);
    const takeNext = claimTarget(this.state);
    this.completer = new Completer(this.state, {
      options: () => (this.lifecycle === "running" ? takeNext : undefined),
      take: (jobs) => this.onHanded(jobs),
    });
    this.heartbeat = new Heartbeat(this.state);
    this.rescuer = new Rescuer(this.state);
    this.ticker = new Ticker(this.state);
    this.keyPruner = new KeyPruner(this.state);
    this.retainer = new Retainer(this.state);
    this.presence = new Presence(this.state, () => this.outage.livedThrough());
    this.stoppedPromise = new Promise((resolve) => (this.resolveStopped = resolve));
  }

  /**
   * Checks the database has this version's idemq schema (else a
   * SchemaMissingError naming both versions and `idemq migrate`; a newer
   * schema is one warn log line), in listen mode checks that the
   * listen connection keeps its session and connects the listener, then
   * starts claiming, heartbeats and maintenance. Resolves once running.
   */
  async start(): Promise<void> {
    if (this.lifecycle !== "new") throw new Error(`worker ${this.workerId} was already started`);
    this.lifecycle = "starting";
    try {
      const schema = await checkSchema(this.pool);
      if (schema.newer !== undefined) {
        this.state.emit("log", { level: "warn", message: `${schema.newer}; this worker runs on meanwhile`, workerId: this.workerId });
      }
      if (this.settings.tracing) {
        const api = await loadOtelApi();
        if (api !== null) this.state.tracing = new AttemptTracing(api, this.workerId);
      }
      await declareSchedules(this.pool, this.settings.schedules, this.settings.callTimeoutMs);
      await declareLimits(this.pool, this.state.tasks, this.settings.callTimeoutMs, (entry) => this.state.emit("log", entry), this.workerId);
      // Poll mode holds no session state, prepared statements included: only listen mode probes, and prepares.
      if (this.settings.wakeUp === "listen") await this.checkConnections();
      await this.wakeUps.start();
      // Registered before the first claim: a doctor run now already sees this worker.
      if (this.lifecycle === "starting") {
        this.registered = this.presence.runOnce();
        await this.registered;
      }
    } catch (error) {
      await this.wakeUps.stop();
      await this.closePool();
      this.lifecycle = "stopped";
      this.resolveStopped();
      throw error;
    }
    if (this.lifecycle !== "starting") {
      // stop() was called meanwhile and found nothing started yet.
      await this.wakeUps.stop();
      return;
    }
    this.lifecycle = "running";
    this.heartbeat.start();
    this.presence.start();
    this.rescuer.start();
    this.ticker.start();
    this.keyPruner.start();
    this.retainer.start();
    this.claimLoop.start();
    if (this.settings.handleSignals) {
      this.removeSignalHandlers = installSignalHandlers(this.state, () => this.stop(), () => this.runningCount);
    }
    this.announceSchedules();
    this.state.emit("worker:started", { workerId: this.workerId });
  }

  /** A log line for the declared schedules, and a warning for each whose task or queue this worker does not claim (another worker may). */
  private announceSchedules(): void {
    const { schedules, queues } = this.settings;
    if (schedules.length === 0) return;
    this.state.emit("log", {
      level: "info",
      message: `declared ${schedules.length} schedule${schedules.length === 1 ? "" : "s"}`,
      workerId: this.workerId,
      schedules: schedules.map((s) => s.name),
    });
    for (const s of schedules) {
      const elsewhere = !this.state.tasks.has(s.task)
        ? `its task "${s.task}" is not one of this worker's tasks`
        : queues !== undefined && s.queue !== undefined && !queues.includes(s.queue)
          ? `its queue "${s.queue}" is not one this worker claims from`
          : undefined;
      if (elsewhere === undefined) continue;
      this.state.emit("log", {
        level: "warn",
        message: `schedule "${s.name}": ${elsewhere}; its jobs wait for a worker that has it`,
        workerId: this.workerId,
        schedule: s.name,
      });
    }
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
    return this.state.held.running;
  }

  /** Claimed jobs waiting for a slot, and their payload bytes (UTF-8 of the JSON text). */
  get buffered(): { jobs: number; bytes: number } {
    return this.state.held.buffered;
  }

  /** The wake-up mode in use: the configured one, or "poll" once start() found the listen connection behind a transaction pooler. */
  get wakeUp(): WakeUpMode {
    return this.wakeUps instanceof PollWakeUps ? "poll" : "listen";
  }

  /**
   * Whether claim, heartbeat, complete and complete_many run as named
   * prepared statements: from start() on in listen mode, when the pool's
   * connections keep their session (not behind a transaction pooler); never
   * in poll mode (no session state); false again for good once one was found
   * gone from its connection (a `warn` log line says so).
   */
  get preparedStatements(): boolean {
    return this.state.preparedCalls.prepared;
  }

  private async shutdown(): Promise<void> {
    const wasStarted = this.lifecycle === "running" || this.lifecycle === "starting";
    this.lifecycle = "stopping";
    try {
      if (wasStarted) await this.drain();
    } finally {
      this.removeSignalHandlers?.();
      await this.closePool();
      this.lifecycle = "stopped";
      this.state.emit("worker:stopped", { workerId: this.workerId });
      this.resolveStopped();
    }
  }

  private async drain(): Promise<void> {
    await this.claimLoop.stop();
    await Promise.all([this.wakeUps.stop(), this.rescuer.stop(), this.ticker.stop(), this.keyPruner.stop(), this.retainer.stop()]);
    await Promise.all([releaseClaimed(this.state), ...this.givingBack]);

    const finished = Promise.all(this.inFlight.values()).then(() => true);
    const stopWaiting = new AbortController();
    const timedOut = sleep(this.settings.shutdownTimeoutMs, stopWaiting.signal).then(() => false);
    const allFinished = await Promise.race([finished, timedOut]);
    stopWaiting.abort();
    if (!allFinished) {
      const late = this.state.held.inPhase("started");
      await Promise.all(late.map((held) => handBack(this.state, held)));
      // The others are recording their outcome (fail, snooze, complete): let them.
      await Promise.all([...this.inFlight].filter(([held]) => !isReleased(held)).map(([, done]) => done));
    }
    await this.completer.drain();
    await this.heartbeat.stop();
    // Present until its last job is recorded; then gone at once, not stale.
    await this.presence.stop();
    await this.registered;
    await this.presence.stopped();
  }

  private room(): number {
    return this.lifecycle === "running" ? this.state.held.room() : 0;
  }

  /** Jobs a completion handed over: run as claimed ones; while stopping, given back at once. */
  private async onHanded(jobs: ClaimedJob[]): Promise<void> {
    if (this.state.listening("worker:handed")) this.state.emit("worker:handed", { workerId: this.settings.workerId, jobs: jobs.length });
    if (this.lifecycle === "running") {
      this.onClaimed(jobs);
      return;
    }
    this.state.held.claimed(jobs);
    await releaseClaimed(this.state);
  }

  /** `asked`: the claim's batch size, for the prefetch window; none for jobs a completion handed over. */
  private onClaimed(jobs: ClaimedJob[], asked?: number): void {
    this.state.held.claimed(jobs, asked);
    if (jobs.length === 0) return;
    this.state.tracing?.refresh();
    this.startClaimed();
    // Payloads larger than any seen lately can bring the buffer over its byte budget.
    const givingBack = releaseOverBudget(this.state).finally(() => this.givingBack.delete(givingBack));
    this.givingBack.add(givingBack);
  }

  /** HeldJobs' one wake-up: a slot came free, or a claimed job left the buffer, or the bound on held jobs lifted. */
  private onRoomGrew(): void {
    this.wakeUps.finished();
    this.startClaimed();
    this.claimLoop.kick();
  }

  private startClaimed(): void {
    while (this.lifecycle === "running") {
      const held = this.state.held.startNext();
      if (held === undefined) return;
      this.startJob(held);
    }
  }

  private startJob(held: HeldJob): void {
    // In flight before runJob runs: an attempt that ends before its first
    // await (a throw ahead of its handler) calls jobOver within the call.
    this.inFlight.set(held, STARTING);
    const running = runJob(this.state, held, this.completer, this.jobOver);
    if (this.inFlight.has(held)) this.inFlight.set(held, running);
  }

  /** A started job's attempt is recorded (or queued in the Completer): shutdown no longer waits for it. */
  private readonly jobOver = (held: HeldJob): void => {
    this.inFlight.delete(held);
  };

  private readonly wake = (): void => this.claimLoop.wake();

  /**
   * Whether the pool's and the listen connections go through a transaction
   * pooler (wake-ups/pooler-probe.ts; one probe when they go to the same
   * place). The pool's decide the hot calls' prepared statements
   * (prepared-calls.ts). Listen mode behind one would wait on its fallback
   * poll and leave its LISTEN and wait marker on a pooled server connection:
   * instead this worker polls (as wakeUp "poll"), and says so once.
   */
  private async checkConnections(): Promise<void> {
    const { markerCallTimeoutMs } = this.settings;
    const poolEvidence = await transactionPoolerEvidence(this.poolClientConfig, this.state.calls, markerCallTimeoutMs);
    this.state.preparedCalls.decide(poolEvidence === undefined);
    const evidence = this.listenSharesPool
      ? poolEvidence
      : await transactionPoolerEvidence(this.listenConfig, this.state.calls, markerCallTimeoutMs);
    if (evidence === undefined) return;
    this.wakeUps = new PollWakeUps(this.state, this.wake);
    const { minPollMs, pollMs } = this.settings;
    this.state.emit("log", {
      level: "warn",
      message:
        `the LISTEN connection goes through a transaction pooler (${evidence}), where LISTEN and the wait marker cannot work: ` +
        `this worker polls instead (every ${minPollMs} ms to ${pollMs} ms). Use --wake-up poll (wakeUp: "poll") to say so, ` +
        `or --listen-url with a direct connection to the database (listenConnectionString) to LISTEN there (docs/worker.md, "Deploying")`,
      workerId: this.workerId,
    });
    this.state.emit("worker:pooler", { workerId: this.workerId, evidence, wakeUp: "poll" });
  }

  private report(during: string, error: unknown): void {
    if (!this.outage.failed(error)) return;
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

/** A pool's connection settings without the pool's own (a client made with them connects as the pool's do). */
function clientConfigOf(pool: pg.Pool): pg.ClientConfig {
  const { max: _max, min: _min, idleTimeoutMillis: _idle, ...clientConfig } = pool.options as pg.PoolConfig;
  return clientConfig;
}
