// WorkerState: what the worker's modules share — the pool, settings, tasks,
// the jobs this worker holds, and event emission. Created once by
// createWorker(); only `held` changes, and only through HeldJobs.
import type { EventEmitter } from "node:events";
import type pg from "pg";
import type { Queryable } from "../sql/index.ts";
import type { AttemptTracer } from "../tracing/types.ts";
import { asError, type JobEvent, type WorkerEvents } from "./events.ts";
import type { HeldJob, HeldJobs } from "./held-jobs.ts";
import type { Settings } from "./settings.ts";
import type { PreparedCalls } from "./prepared-calls.ts";
import type { NormalizedTask } from "./task-config.ts";

export interface WorkerState {
  readonly pool: pg.Pool;
  /** The pool for idemq calls, each bounded by WORKER_DEFAULTS.callTimeout (timedCalls). */
  readonly calls: Queryable;
  /** `calls` for the hot path (claim, heartbeat, complete, complete_many): named prepared statements once start() found that safe. */
  readonly preparedCalls: PreparedCalls;
  readonly settings: Settings;
  readonly tasks: ReadonlyMap<string, NormalizedTask>;
  /** Every job this worker holds a lease on. */
  readonly held: HeldJobs;
  /** Attempt spans; undefined while tracing is off (disabled, @opentelemetry/api absent, or before start()). */
  tracing: AttemptTracer | undefined;
  emit<K extends keyof WorkerEvents>(event: K, ...args: WorkerEvents[K]): void;
  /** Someone listens to `event`: the per-job paths build an event only then. */
  listening(event: keyof WorkerEvents): boolean;
  /** worker:error for a failure outside a job (once per outage for connection failures: outage.ts). */
  report(during: string, error: unknown): void;
  /**
   * A call made at `madeAt` (performance.now()) got an answer from the
   * database: ends an outage that began before it (worker:reconnected, outage.ts).
   */
  reached(madeAt: number): void;
  /** Wake the claim loop early at this time (a retry or snooze this worker scheduled). */
  wakeAt(at: number): void;
}

/**
 * `pool` for idemq calls, each abandoned after `timeoutMs` (pg's query_timeout:
 * the call rejects and the pool discards its connection), so no call can keep
 * the worker waiting for good: not a lock someone holds, not a stalled
 * connection. Keeps `options`, which error messages read the database from.
 * `reached` hears of every call answered, with when it was made.
 */
export function timedCalls(pool: pg.Pool, timeoutMs: number, reached?: (madeAt: number) => void): Queryable {
  return {
    options: pool.options,
    // runQuery passes a config object when it sets `types` (claim measures payload sizes as it parses them).
    query: (text: string | pg.QueryConfig, values?: unknown[]) => {
      const madeAt = performance.now();
      const config = { ...(typeof text === "string" ? { text, values } : text), query_timeout: timeoutMs };
      const answer = pool.query(config as unknown as pg.QueryConfig);
      if (reached === undefined) return answer;
      return answer.then((result) => {
        reached(madeAt);
        return result;
      });
    },
  } as Queryable;
}

export function jobEvent(state: WorkerState, held: HeldJob): JobEvent {
  return {
    jobId: held.job.id,
    task: held.job.task,
    queue: held.job.queue,
    attempt: held.job.attempt,
    workerId: state.settings.workerId,
  };
}

export function durationOf(held: HeldJob): number {
  return Math.round(((held.endedAt ?? performance.now()) - held.startedAt) * 1000) / 1000;
}

/** Emits an event; a listener that throws becomes a worker:error, never a failure of the job. */
export function safeEmit<Events extends Record<string, unknown[]>, K extends keyof Events & string>(
  emitter: EventEmitter<Events>,
  event: K,
  args: Events[K],
  onThrow: (error: Error) => void,
): void {
  try {
    (emitter.emit as (event: K, ...args: Events[K]) => boolean)(event, ...args);
  } catch (error) {
    onThrow(asError(error));
  }
}
