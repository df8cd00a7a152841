// Public types of the worker: options, task definitions, the handler's ctx.
import type pg from "pg";
import type { Backoff, Duration } from "../contract.ts";
import type { ChildJob, ChildOutcome, ScheduleDefinition } from "../sql/index.ts";
import type { WakeUpMode } from "./defaults.ts";
import type { StepContext } from "./steps.ts";

/**
 * A payload as the handler receives it (parsed jsonb). `any`, because it is
 * whatever the enqueuer sent; it keeps handlers free of casts.
 */
export type Payload = any;

/** An error class for exceptOn / onlyOn. */
export type ErrorClass = abstract new (...args: never[]) => unknown;

/** What ctx.job says about the attempt; P is the task's payload type. */
export interface JobInfo<P = Payload> {
  /** The job id (a bigint, kept exact as a string). */
  id: string;
  task: string;
  queue: string;
  /** This attempt's number: with id, the fencing token. */
  attempt: number;
  /** Attempts allowed: the job's max_attempts, lowered by the task's maxAttempts when set. */
  maxAttempts: number;
  /** The job's idempotency key. */
  key: string | null;
  /** The previous attempt lost its lease: its effects may have happened. */
  reclaimed: boolean;
  /** The payload (parsed jsonb): the value the handler receives as its first argument. */
  payload: P;
}

export interface JobLog {
  debug(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

export interface EffectOptions<T> {
  /** After how long another attempt may take over an unfinished claim (effect_claim's stale_after; SQL default when unset). */
  staleAfter?: Duration | undefined;
  /**
   * Called instead of fn when an earlier claim went stale (its owner may have
   * made the call): return the earlier result if the effect happened, or
   * undefined to call fn again with the same key.
   */
  reconcile?: ((key: string) => Promise<T | undefined> | T | undefined) | undefined;
  /**
   * Whether an error thrown by fn means the call definitely did not happen
   * (then the claim is released so a later attempt claims afresh). Default:
   * every error. Return false for ambiguous failures (a timeout): the claim
   * is kept, goes stale after staleAfter, and the next attempt reconciles.
   */
  definiteFailure?: ((error: unknown) => boolean) | undefined;
}

/**
 * The ctx a handler receives; P is the task's payload type. A plain task's
 * ctx has `tx: undefined`, a transactional task's is a TransactionalJobContext.
 */
export interface JobContext<P = Payload> extends StepContext {
  job: JobInfo<P>;
  /** Aborts when the lease is lost, or when shutdownTimeout runs out during shutdown. */
  signal: AbortSignal;
  /** Structured log lines carrying the job id, task and attempt. */
  log: JobLog;
  /**
   * Ends this attempt without spending it: the job goes back to `scheduled`
   * and runs again after `delay`. Throws (do not catch it); a transactional
   * task's transaction is rolled back.
   */
  snooze(delay: Duration): never;
  /**
   * Runs an effect outside the database once per key (docs/design.md, "Effects
   * once"): claims the key first, runs fn(key), records its JSON result.
   * A key already done returns the stored result without calling fn.
   */
  effect<T>(key: string, fn: (key: string) => Promise<T> | T, options?: EffectOptions<T>): Promise<T>;
  /**
   * Reports how far this attempt has got, a whole percentage 0..100, which
   * idemq.job(), `idemq jobs show` and the dashboard's job page show. Cheap
   * in a loop: the worker writes the latest value in the background at most
   * once a second per job (idemq.progress, fenced like complete), outside
   * ctx.tx; a value reported less than a second before the attempt ends
   * may not be written. A value that is not an integer 0..100 throws a
   * TypeError.
   */
  progress(value: number): void;
  /**
   * Fan-out and fan-in: enqueues these child jobs (each with a unique
   * `name`, and enqueue_many's fields), linked to this job, and returns
   * their outcomes once all have finished. While any is unfinished it ends
   * the attempt instead (it throws; do not catch it; a transactional task's
   * transaction rolls back): the job waits `awaiting` without holding a
   * worker slot or spending an attempt, and runs again from the top when the
   * last child finishes; called again with the same children there, it
   * spawns nothing twice (they are found by name) and returns their
   * outcomes. failFast: the first child that does not succeed ends the wait,
   * and ctx.spawn throws ChildFailedError (the job fails). The children are
   * enqueued outside ctx.tx (they commit at once).
   */
  spawn(children: readonly ChildJob[], options?: { failFast?: boolean | undefined }): Promise<ChildOutcome[]>;
  /** This job's children (every ctx.spawn's; a batch callback's: the batch's jobs) with their outcomes so far. */
  children(): Promise<ChildOutcome[]>;
  /** The job's transaction (transactional tasks only). */
  tx: pg.PoolClient | undefined;
}

/** The ctx of a transactional task: `tx` is always there. */
export interface TransactionalJobContext<P = Payload> extends JobContext<P> {
  /** The transaction in which the worker calls guard() and complete(): write the job's effects here. */
  tx: pg.PoolClient;
}

/** A plain task's handler: no transaction, so `ctx.tx` is undefined. Its result is stored as the job's result. */
export interface TaskHandler<P = Payload> {
  (payload: P, ctx: JobContext<P> & { tx: undefined }): unknown;
  /** Never set: declared so a task object without `transactional` is typed as a plain task. */
  transactional?: undefined;
}
/** A transactional task's handler: it writes its effects in `ctx.tx`, which commits with complete(). */
export type TransactionalTaskHandler<P = Payload> = (payload: P, ctx: TransactionalJobContext<P>) => unknown;

interface TaskOptions {
  /** Attempts allowed, counted by ctx.job.attempt; the job's own max_attempts still applies. */
  maxAttempts?: number | undefined;
  /** Retry schedule computed by the worker (instead of the job's backoff). */
  backoff?: Backoff | undefined;
  /** Errors of these classes fail the job at once. */
  exceptOn?: readonly ErrorClass[] | undefined;
  /** Only errors of these classes are retried; any other fails the job at once. */
  onlyOn?: readonly ErrorClass[] | undefined;
  /** This task's lease (heartbeats extend it by this much). */
  lease?: Duration | undefined;
  /**
   * At most this many of the task's jobs processing at once, across every
   * worker and SQL consumer (1..10000): applied at start(), lower-only
   * (docs/worker.md, "Declared limits").
   */
  concurrencyLimit?: number | undefined;
  /** At most `rate` starts of the task per `per` (at least 1 second), e.g. { rate: 100, per: "1 minute" }; applied as concurrencyLimit is. */
  rateLimit?: { rate: number; per: Duration } | undefined;
  /**
   * How long one attempt may run (e.g. "30s"): past it ctx.signal aborts
   * with a TimeoutError and the attempt fails (retried by the policy), even
   * if the handler ignores the signal. A job's own timeout (enqueue) applies
   * too: the shorter wins.
   */
  timeout?: Duration | undefined;
}

/** A plain task with options. */
export interface PlainTaskConfig<P = Payload> extends TaskOptions {
  transactional?: false;
  run: TaskHandler<P>;
}

/** A task whose handler runs in the transaction that records the guard row and complete(). */
export interface TransactionalTaskConfig<P = Payload> extends TaskOptions {
  transactional: true;
  /**
   * The guard key: the business key of the effect (e.g. p => `credit:order-${p.orderId}`).
   * Without it (or when it returns null/undefined) the job's idempotency key
   * is used; with neither, the task runs unguarded.
   */
  guardKey?: ((payload: P) => string | null | undefined) | undefined;
  run: TransactionalTaskHandler<P>;
}

/** A task's handler with its options; P is its payload type. */
export type TaskConfig<P = Payload> = PlainTaskConfig<P> | TransactionalTaskConfig<P>;

/** A task: a handler function, or a handler with options; P is its payload type. */
export type TaskDefinition<P = Payload> = TaskHandler<P> | TaskConfig<P>;

/** Tasks by name, as createWorker takes them (payloads untyped). */
export type Tasks = Record<string, TaskDefinition>;

/**
 * The tasks of a payload map, each handler typed by its payload:
 * `TasksFor<{ credit: { orderId: number } }>` is `{ credit: TaskDefinition<{ orderId: number }> }`.
 */
export type TasksFor<Payloads extends object> = { [K in keyof Payloads]: TaskDefinition<Payloads[K]> };

/** The payload type of one task definition: its handler's first parameter (`unknown` when it has none). */
export type TaskPayload<D> = D extends (payload: infer P, ...rest: never[]) => unknown
  ? P
  : D extends { run: (payload: infer P, ...rest: never[]) => unknown }
    ? P
    : never;

/**
 * Task name -> payload type of a tasks object, e.g.
 * `TaskPayloads<typeof tasks>` is `{ credit: { orderId: number }; ... }`.
 * `Client<typeof tasks>` uses it to type enqueue.
 */
export type TaskPayloads<T extends Tasks> = { [K in keyof T]: TaskPayload<T[K]> };

interface WorkerSettings {
  tasks: Tasks;
  /** Queues to claim from; all queues when unset. */
  queues?: readonly string[] | undefined;
  /** Jobs running at once (default 10). */
  concurrency?: number | undefined;
  /**
   * Claimed jobs waiting locally for a free slot, fixed (0 claims only for
   * free slots). Unset, the buffer adapts: from concurrency, doubling while
   * claims come back full, halving when they come back
   * short, at most 490 jobs and at most what the observed completion rate
   * starts within a quarter of the lease.
   */
  prefetch?: number | undefined;
  /**
   * Payload bytes (UTF-8 of their JSON text) the claimed jobs waiting for a
   * slot may hold together (default 32 MiB); the buffer may always hold one
   * job, whatever its size. With `prefetch`, the lower bound applies.
   */
  prefetchBytes?: number | undefined;
  /** Names this worker in locked_by and in error entries (default host:pid:random). */
  workerId?: string | undefined;
  /** Lease of claimed jobs (default 30 seconds). */
  lease?: Duration | undefined;
  /** Default lease / 3. */
  heartbeatInterval?: Duration | undefined;
  /**
   * How the worker learns of new jobs (default "listen"): "listen" holds a
   * LISTEN connection and a wait-marker connection (session state: they need
   * a direct server or a session pooler); "poll" holds no session state and
   * claims on an adaptive poll, for a transaction-pooling PgBouncer
   * (docs/worker.md, "Deploying").
   */
  wakeUp?: WakeUpMode | undefined;
  /**
   * listen mode: where the LISTEN and wait-marker connections go, when not to
   * connectionString (e.g. the server directly, while claims and jobs go
   * through a transaction pooler). Must reach the same database.
   */
  listenConnectionString?: string | undefined;
  /** listen mode: the fallback poll (default 2 seconds, jittered); poll mode: the longest gap between claims. */
  pollInterval?: Duration | undefined;
  /** poll mode: the gap between claims after a claim brought jobs or a job finished (default 50 ms); doubles up to pollInterval. */
  minPollInterval?: Duration | undefined;
  /** rescue() timer (default 15 seconds, jittered); 0 disables it. */
  rescueInterval?: Duration | undefined;
  /** tick() timer for schedules (default 10 seconds, jittered); 0 disables it. */
  tickInterval?: Duration | undefined;
  /**
   * How often the worker refreshes its row in idemq.workers (worker_seen():
   * its queues and task names, last seen now; default 15 seconds, jittered),
   * read by `idemq doctor` to find jobs no live worker claims. Must be more
   * than 0: a worker that never says it is there looks gone.
   */
  presenceInterval?: Duration | undefined;
  /** prune_keys() timer (default 1 hour, jittered); 0 disables it. */
  pruneInterval?: Duration | undefined;
  /**
   * apply_retention() timer (default 1 minute, jittered); 0 disables it. Each
   * run deletes finished jobs past their retention in batches until a batch
   * comes back short or 2 seconds are spent.
   */
  retentionInterval?: Duration | undefined;
  /** Jobs one apply_retention() call deletes at most (default 500, 1..10000). */
  retentionBatchSize?: number | undefined;
  /**
   * Passed to prune_keys(older_than); when unset the SQL default applies. A floor: a key goes
   * only once this and its own retention (enqueue's keyRetention) have passed.
   */
  keyRetention?: Duration | undefined;
  /** Running jobs get this long to finish on stop() before they are handed back (default 25 seconds). */
  shutdownTimeout?: Duration | undefined;
  /** Install SIGTERM/SIGINT handlers that stop the worker (default true). */
  handleSignals?: boolean | undefined;
  /**
   * OpenTelemetry traces (default true): when @opentelemetry/api is
   * installed, each attempt runs in a CONSUMER span whose parent is the
   * enqueue span the job stored (docs/worker.md, "Tracing"). Without the
   * API, or with false, nothing is loaded and a job costs one null check.
   */
  tracing?: boolean | undefined;
  /**
   * Recurring schedules this worker declares: each is upserted by name
   * (client.schedule) at start(), in one transaction, before claiming. An
   * unchanged definition keeps its next slot, so restarts and many workers
   * declaring the same list create no extra job. Schedules not listed are
   * left alone (other applications may own them); remove one with
   * unschedule. A definition SQL refuses makes start() reject, naming it.
   */
  schedules?: readonly ScheduleDefinition[] | undefined;
}

/** The options of createWorker: tasks and settings, plus where the database is. */
export type WorkerOptions = WorkerSettings &
  (
    | {
        /**
         * Default: DATABASE_URL, else the embedded PostgreSQL that `idemq dev`
         * runs for the current directory (.idemq/pg, or IDEMQ_DATA_DIR); with
         * neither, createWorker throws, saying which to set up.
         */
        connectionString?: string | undefined;
        /** Settings for the pool the worker creates (default max: concurrency + 4). */
        poolConfig?: Omit<pg.PoolConfig, "connectionString"> | undefined;
        pool?: undefined;
      }
    | {
        /** A pool you own: the worker never ends it. Give it at least concurrency + 2 connections. */
        pool: pg.Pool;
        connectionString?: undefined;
      }
  );

/** What a tasks module may export besides its tasks (for `idemq worker --tasks`). */
export type ModuleWorkerOptions = Omit<WorkerSettings, "tasks">;
