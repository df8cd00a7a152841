// The Client: enqueue and admin calls over a pg.Pool. Every call goes through
// src/sql/; this class adds pool ownership, the caller's transaction
// (`client` option) and events for what the database cannot count.

import { EventEmitter } from "node:events";
import pg from "pg";
import type { BulkAction, Duration, JobState } from "./contract.ts";
import { runBulkAction, type BulkOptions, type BulkProgress } from "./bulk-actions.ts";
import { defaultConnectionString } from "./database-url.ts";
import { DuplicateJobError } from "./errors.ts";
import { getJob, listJobs, sqlJobFilter, type Job, type JobFilter, type ListJobsFilter } from "./job-reads.ts";
import { ResultWaiter, type ResultOptions } from "./results.ts";
import * as sql from "./sql/index.ts";
import { loadOtelApi, otelApiIfLoaded } from "./tracing/otel-api.ts";
import { ProducerTracing } from "./tracing/spans.ts";
import type {
  EnqueueManyJob,
  EnqueueManyResult,
  EnqueueOptions,
  EnqueueResult,
  Instant,
  JobIdInput,
  OverviewRow,
  PayloadMap,
  Queryable,
  Schedule,
  ScheduleDefinition,
  ScheduleNextOptions,
  StatsRow,
} from "./sql/index.ts";
import type { TaskPayloads, Tasks } from "./worker/types.ts";

interface CommonClientOptions {
  onError?: ((err: Error) => void) | undefined;
  /**
   * OpenTelemetry traces (default true): when @opentelemetry/api is
   * installed, each enqueue runs in a PRODUCER span and stores its
   * traceparent on the job, which the worker's attempt spans continue.
   * Without the API, or with false, nothing is loaded and nothing stored.
   */
  tracing?: boolean | undefined;
  /**
   * Where result() LISTENs (one connection of its own, opened by the first
   * result() and kept until close()): a direct connection to the database
   * (or a session pooler). Default: the Client's own connection settings.
   * Behind a transaction pooler (PgBouncer) LISTEN cannot work: set this,
   * or pass result()'s pollInterval.
   */
  listenConnectionString?: string | undefined;
}

export type ClientOptions =
  | ({
      /** A pool you own: the Client never ends it. */
      pool: pg.Pool;
    } & CommonClientOptions)
  | ({
      /**
       * Default: DATABASE_URL, else the embedded PostgreSQL that `idemq dev`
       * runs for the current directory (.idemq/pg, or IDEMQ_DATA_DIR); with
       * neither, the constructor throws, saying which to set up.
       */
      connectionString?: string | undefined;
      /** Further settings for the pool the Client creates (and ends in close()). */
      poolConfig?: Omit<pg.PoolConfig, "connectionString"> | undefined;
    } & CommonClientOptions);

/** Run on your own transaction's client instead of the pool (an outbox-style enqueue). */
export interface InTransaction {
  client?: Queryable | undefined;
}

/**
 * The payload map of a Client's type argument: tasks (`typeof tasks`) give
 * their handlers' payload types; anything else is a payload map already. A
 * payload is JSON, never a function or an object with a `run` function, so
 * the two cannot be confused.
 */
export type ClientPayloads<T extends object> = T extends Tasks ? TaskPayloads<T> : T;

/** The task names a Client accepts. */
export type TaskName<T extends object> = keyof ClientPayloads<T> & string;

/** enqueue's arguments after the task name: the payload (optional when its type admits undefined), then options. */
export type EnqueueArgs<P> = undefined extends P
  ? [payload?: P, opts?: (EnqueueOptions & InTransaction) | undefined]
  : [payload: P, opts?: (EnqueueOptions & InTransaction) | undefined];

/** An IQ409 raised by enqueue: it rolls back with the statement, so SQL cannot count it. */
export interface EnqueueRejectedEvent {
  task: string;
  error: DuplicateJobError;
}

export interface ClientEvents {
  "enqueue:rejected": [EnqueueRejectedEvent];
  /** An idle pool connection failed (e.g. the server restarted); the pool replaces it. */
  "client:error": [Error];
}

const CLIENT_NEEDS = "new Client() needs { connectionString }, { pool } or a pg.Pool";

/**
 * Enqueue and admin calls. `new Client<typeof tasks>(...)` (tasks from
 * defineTasks) or `new Client<{ credit: { orderId: number } }>(...)` checks
 * each enqueue's task name and payload at compile time; a plain `Client`
 * takes any task name and payload.
 */
export class Client<T extends object = PayloadMap> extends EventEmitter<ClientEvents> {
  readonly pool: pg.Pool;
  private readonly ownsPool: boolean;
  private readonly onPoolError: (err: Error) => void;
  private closed = false;
  /** null: tracing off (disabled, or @opentelemetry/api absent); undefined: not known until the API's import settles. */
  private producer: ProducerTracing | null | undefined;
  private readonly results: ResultWaiter;

  constructor(options: ClientOptions | pg.Pool = {}) {
    super();
    if (options === null || typeof options !== "object") throw new TypeError(CLIENT_NEEDS);
    if (isPool(options)) {
      this.pool = options;
      this.ownsPool = false;
    } else if ("pool" in options && options.pool !== undefined) {
      this.pool = options.pool;
      this.ownsPool = false;
    } else {
      const given = "connectionString" in options ? options.connectionString : undefined;
      if (given !== undefined && typeof given !== "string") throw new TypeError(CLIENT_NEEDS);
      const connectionString = given ?? defaultConnectionString(CLIENT_NEEDS, (message) => new TypeError(message));
      const poolConfig = "poolConfig" in options ? options.poolConfig : undefined;
      this.pool = new pg.Pool({ ...poolConfig, connectionString });
      this.ownsPool = true;
    }
    const onError = isPool(options) ? undefined : options.onError;
    const tracing = isPool(options) ? undefined : options.tracing;
    if (tracing !== undefined && typeof tracing !== "boolean") {
      throw new TypeError(`new Client(): tracing must be true or false, not ${JSON.stringify(tracing)}`);
    }
    if (tracing === false) this.producer = null;
    // Without a listener, an idle client's error would crash the process.
    this.onPoolError = (err) => {
      if (onError !== undefined) onError(err);
      else if (this.listenerCount("client:error") > 0) this.emit("client:error", err);
      else console.warn("[idemq] idle PostgreSQL connection error:", err.message);
    };
    this.pool.on("error", this.onPoolError);
    const listenUrl = isPool(options) ? undefined : options.listenConnectionString;
    if (listenUrl !== undefined && (typeof listenUrl !== "string" || listenUrl === "")) {
      throw new TypeError("new Client(): listenConnectionString must be a connection string");
    }
    // result()'s LISTEN connection cannot come from the pool (it is held): the pool's settings, a client of its own.
    const { max: _max, min: _min, idleTimeoutMillis: _idle, ...poolClientConfig } = (this.pool.options ?? {}) as pg.PoolConfig;
    this.results = new ResultWaiter(this.pool, listenUrl === undefined ? poolClientConfig : { connectionString: listenUrl }, this.onPoolError);
  }

  /** The producer spans, once known; a promise only until the first import of @opentelemetry/api settles. */
  private tracing(): ProducerTracing | null | Promise<ProducerTracing | null> {
    if (this.producer !== undefined) return this.producer;
    const settle = (api: ReturnType<typeof otelApiIfLoaded>): ProducerTracing | null =>
      (this.producer = api === null || api === undefined ? null : new ProducerTracing(api));
    const api = otelApiIfLoaded();
    return api !== undefined ? settle(api) : loadOtelApi().then(settle);
  }

  private db(opts?: InTransaction): Queryable {
    if (this.closed) throw new Error("idemq Client is closed");
    return opts?.client ?? this.pool;
  }

  /** Enqueues one job; `client` runs it in your transaction. An IQ409 rejection also emits `enqueue:rejected`. */
  async enqueue<K extends TaskName<T>>(task: K, ...args: EnqueueArgs<ClientPayloads<T>[K]>): Promise<EnqueueResult> {
    const [payload, opts = {}] = args as [unknown?, (EnqueueOptions & InTransaction)?];
    const { client, ...options } = opts;
    const db = this.db({ client });
    try {
      let tracing = this.tracing();
      if (tracing instanceof Promise) tracing = await tracing;
      if (tracing === null) return await sql.enqueue(db, task, payload, options);
      const { jobId, deduplicated } = await tracing.enqueue(task, options.queue, options.traceparent, (traceparent) =>
        sql.enqueueTraced(db, task, payload, { ...options, traceparent }),
      );
      return { jobId, deduplicated };
    } catch (err) {
      if (err instanceof DuplicateJobError) this.emit("enqueue:rejected", { task, error: err });
      throw err;
    }
  }

  /**
   * idemq.emit(event, key, payload): wakes the jobs waiting for the event
   * (ctx.waitFor) and keeps it for waits reached later; `client` runs it in
   * your transaction, so it counts only if that commits. Returns how many
   * waiting jobs it woke. (Not `emit`: that is the Client's EventEmitter.)
   */
  async emitEvent(event: string, opts: { key?: string | undefined; payload?: unknown } & InTransaction = {}): Promise<number> {
    const { client, ...options } = opts;
    return sql.emit(this.db({ client }), event, options);
  }

  /** Bulk enqueue: rejections and conflicts are row outcomes, never raised. */
  async enqueueMany(jobs: readonly EnqueueManyJob<ClientPayloads<T>>[], opts: InTransaction = {}): Promise<EnqueueManyResult[]> {
    const db = this.db(opts);
    let tracing = this.tracing();
    if (tracing instanceof Promise) tracing = await tracing;
    if (tracing === null || !Array.isArray(jobs)) return sql.enqueueMany(db, jobs);
    return tracing.enqueueMany(jobs.length, (traceparent) =>
      sql.enqueueMany(
        db,
        traceparent === undefined
          ? jobs
          : jobs.map((job) => (job !== null && typeof job === "object" && job.traceparent === undefined ? { ...job, traceparent } : job)),
      ),
    );
  }

  /** Returns the job's new state. */
  cancel(jobId: JobIdInput, opts: InTransaction = {}): Promise<JobState> {
    return sql.cancel(this.db(opts), jobId);
  }

  /** A failed, cancelled or expired job back to `enqueued` with fresh attempts; returns its new state. */
  retry(jobId: JobIdInput, opts: InTransaction = {}): Promise<JobState> {
    return sql.retry(this.db(opts), jobId);
  }

  reschedule(jobId: JobIdInput, runAt: Instant, opts: InTransaction = {}): Promise<JobState> {
    return sql.reschedule(this.db(opts), jobId, runAt);
  }

  /**
   * Deletes finished jobs older than `olderThan` (at most `batchSize` of them
   * when given, oldest first); keys stay until pruneKeys. Returns the count.
   */
  purge(opts: { olderThan: Duration; states?: readonly JobState[]; batchSize?: number | undefined } & InTransaction): Promise<number> {
    return sql.purge(this.db(opts), opts);
  }

  /** Deletes at most `batchSize` finished jobs past their retention (workers do it on a timer). Returns the count. */
  applyRetention(opts: { batchSize?: number | undefined } & InTransaction = {}): Promise<number> {
    return sql.applyRetention(this.db(opts), opts);
  }

  /** How long finished jobs in `state` are kept: the default, or for one queue or task (`keep: null` removes that override). */
  setRetention(
    opts: { state: JobState; keep: Duration | null; queue?: string | undefined; task?: string | undefined } & InTransaction,
  ): Promise<void> {
    return sql.setRetention(this.db(opts), opts);
  }

  /** Sets the flow control of one queue or one task: concurrency, rate per period, perKey (fields left out are kept). */
  setLimit(opts: sql.LimitScope & sql.LimitSettings & InTransaction): Promise<void> {
    return sql.setLimit(this.db(opts), opts);
  }

  /** Removes the limits of one queue or one task (a pause stays); true when it had one. */
  clearLimit(opts: sql.LimitScope & InTransaction): Promise<boolean> {
    return sql.clearLimit(this.db(opts), opts);
  }

  /** Pauses one queue or one task: claims hand out none of its jobs; running jobs finish. True when it was not paused. */
  pause(opts: sql.LimitScope & InTransaction): Promise<boolean> {
    return sql.pause(this.db(opts), opts);
  }

  /** Ends the pause of one queue or one task; true when it was paused. */
  resume(opts: sql.LimitScope & InTransaction): Promise<boolean> {
    return sql.resume(this.db(opts), opts);
  }

  /** Every queue and task with a limit or a pause, and its use now. */
  limits(opts: InTransaction = {}): Promise<sql.LimitRow[]> {
    return sql.limits(this.db(opts));
  }

  /** The concurrency keys held back now (a handler's RateLimitedError with scope "key"), and until when. */
  heldKeys(opts: InTransaction = {}): Promise<sql.HeldKeyRow[]> {
    return sql.heldKeys(this.db(opts));
  }

  /** Releases idempotency keys; without olderThan, the SQL default retention applies. */
  pruneKeys(opts: { olderThan?: Duration | undefined } & InTransaction = {}): Promise<number> {
    return sql.pruneKeys(this.db(opts), opts);
  }

  rescue(opts: InTransaction = {}): Promise<number> {
    return sql.rescue(this.db(opts));
  }

  stats(opts: InTransaction = {}): Promise<StatsRow[]> {
    return sql.stats(this.db(opts));
  }

  /** overview() (admin role): active counts, finishes within `recent`, capped totals; never counts the whole table as stats() does. */
  overview(opts: { recent?: Duration | undefined; exactUpTo?: number | undefined } & InTransaction = {}): Promise<OverviewRow[]> {
    return sql.overview(this.db(opts), opts);
  }

  /**
   * Creates or replaces (by name) a recurring schedule: tick() (every
   * worker's timer, or pg_cron) enqueues a job of its task for each slot.
   * Options left out take schedule()'s SQL defaults. Re-declaring a
   * schedule with the same cron and time zone keeps its next slot; an
   * unchanged definition writes nothing. Returns the schedule's next slot.
   */
  schedule(definition: ScheduleDefinition<ClientPayloads<T>>, opts: InTransaction = {}): Promise<Date> {
    return sql.schedule(this.db(opts), definition as ScheduleDefinition);
  }

  /** Removes a schedule; false when there was none of that name. Jobs it already enqueued stay. */
  unschedule(name: string, opts: InTransaction = {}): Promise<boolean> {
    return sql.unschedule(this.db(opts), name);
  }

  /** Every schedule, by name, with the state of each one's latest job. */
  schedules(opts: InTransaction = {}): Promise<Schedule[]> {
    return sql.schedules(this.db(opts));
  }

  /**
   * The next `count` slots (default 1) of the schedule `name`, first the one
   * not yet handled (its nextAt, which is in the past while it waits for the
   * next tick); null when there is no such schedule.
   */
  scheduleNext(name: string, opts?: { count?: number | undefined } & InTransaction): Promise<Date[] | null>;
  /** The next slots of a cron expression (in `timezone`, after `after`, default now), to check it before scheduling it. */
  scheduleNext(expression: ScheduleNextOptions, opts?: InTransaction): Promise<Date[]>;
  async scheduleNext(
    target: string | ScheduleNextOptions,
    opts: { count?: number | undefined } & InTransaction = {},
  ): Promise<Date[] | null> {
    const db = this.db(opts);
    if (typeof target !== "string") return sql.scheduleNext(db, target);
    const found = (await sql.schedules(db)).find((s) => s.name === target);
    if (found === undefined) return null;
    // Slots are whole seconds, so "after nextAt - 1 ms" starts with nextAt itself.
    return sql.scheduleNext(db, {
      cron: found.cron,
      timezone: found.timezone,
      after: new Date(found.nextAt.getTime() - 1),
      count: opts.count,
    });
  }

  /**
   * A job's state and outcome (idemq.job(): any idemq role may call it, a
   * producer included); null when there is no such job. Its payload is null
   * unless the login may read idemq.jobs (idemq_admin).
   */
  getJob(jobId: JobIdInput, opts: InTransaction = {}): Promise<Job | null> {
    return getJob(this.db(opts), jobId);
  }

  /** Newest first, through find_jobs (the admin and viewer roles; payloads for the admin only). */
  listJobs(filter: ListJobsFilter & InTransaction = {}): Promise<Job[]> {
    return listJobs(this.db(filter), filter);
  }

  /**
   * How many jobs `filter` matches, counted up to `atMost` (count_jobs;
   * default 10,000); with `action`, only those that bulk action would take:
   * the number its confirmation states.
   */
  async countJobs(
    filter: JobFilter,
    opts: { action?: BulkAction | undefined; atMost?: number | undefined } & InTransaction = {},
  ): Promise<{ count: number; exact: boolean }> {
    const { jobs, exact } = await sql.countJobs(this.db(opts), sqlJobFilter(filter), { action: opts.action, atMost: opts.atMost });
    return { count: jobs, exact };
  }

  /**
   * retry, cancel, delete or run_now every job `filter` matches, in batches
   * of `maxJobs` (each its own transaction, unless `client` gives one); the
   * per-job rules are retry()'s, cancel()'s, purge()'s and reschedule()'s.
   */
  bulkAction(
    action: BulkAction,
    filter: JobFilter,
    opts: BulkOptions & InTransaction = {},
  ): Promise<BulkProgress & { interrupted: boolean; nextBeforeId: string | null }> {
    return runBulkAction(this.db(opts), action, filter, opts);
  }

  /**
   * Waits for a job's outcome without polling (LISTEN on idemq_results, and
   * job_result(..., notify => true)): resolves with its result (what its
   * handler returned; null for none) once it succeeded; rejects with
   * JobNotSucceededError (failed, expired or cancelled; its latest error),
   * ResultTimeoutError after `timeout` (the job goes on), or
   * JobNotFoundError. Works from any process. Behind a transaction pooler,
   * set listenConnectionString or pass `pollInterval` (job_result polled).
   */
  result<R = unknown>(jobId: JobIdInput, opts: ResultOptions = {}): Promise<R> {
    if (this.closed) return Promise.reject(new Error("idemq Client is closed"));
    return this.results.wait(jobId, opts) as Promise<R>;
  }

  /**
   * A job's step ledger (idemq.steps: its steps, sleeps and event waits with
   * their results), oldest first; empty for a job without steps. The worker
   * and admin roles may call it, not the producer or the viewer.
   */
  steps(jobId: JobIdInput, opts: InTransaction = {}): Promise<sql.StepRow[]> {
    return sql.steps(this.db(opts), jobId);
  }

  /** A job's children (spawn, or a batch's jobs for its callback) with their outcomes, in the order they were linked. */
  children(jobId: JobIdInput, opts: InTransaction = {}): Promise<sql.ChildOutcome[]> {
    return sql.children(this.db(opts), jobId);
  }

  /**
   * A batch: enqueues `jobs` and a `callback` job that runs once, when all of
   * them have finished (with failFast, at the first that did not succeed),
   * and reads their outcomes with ctx.children() (each named by its ordinal,
   * "1", "2", ...). An idempotencyKey on the callback makes the batch
   * idempotent: a second call with it enqueues nothing.
   */
  enqueueBatch(
    jobs: readonly EnqueueManyJob<ClientPayloads<T>>[],
    callback: EnqueueManyJob<ClientPayloads<T>>,
    opts: { failFast?: boolean | undefined } & InTransaction = {},
  ): Promise<{ callback: EnqueueManyResult; jobs: EnqueueManyResult[] }> {
    return sql.enqueueBatch(this.db(opts), jobs as readonly EnqueueManyJob[], callback as EnqueueManyJob, opts);
  }

  /** Ends the pool if this Client created it; idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.results.close();
    if (this.ownsPool) {
      // Our listener stays on our ended pool: a connection still closing can
      // report 57P01 (server shutting down) after end() resolves.
      await this.pool.end();
    } else {
      this.pool.off("error", this.onPoolError);
    }
  }
}

function isPool(value: unknown): value is pg.Pool {
  return (
    value instanceof pg.Pool ||
    (typeof value === "object" &&
      value !== null &&
      typeof (value as pg.Pool).connect === "function" &&
      typeof (value as pg.Pool).query === "function" &&
      typeof (value as pg.Pool).end === "function" &&
      typeof (value as pg.Pool).on === "function" &&
      // A pg.Client has the four methods above too, but no pool counters.
      typeof (value as pg.Pool).totalCount === "number")
  );
}
