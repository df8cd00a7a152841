// What the worker's modules share: the pool, settings, tasks, the jobs this
// worker holds, and event emission.
import type { EventEmitter } from "node:events";
import type pg from "pg";
import type { Duration } from "../contract.ts";
import type { ClaimedJob } from "../sql-api.ts";
import { asError, type JobEvent, type WorkerEvents } from "./events.ts";
import type { Settings } from "./settings.ts";
import type { NormalizedTask } from "./task-config.ts";

/**
 * buffered: claimed, waiting for a slot; running: its handler runs (or its
 * transaction is open); finishing: the handler is done and its completion,
 * failure or snooze is being recorded (a lost lease no longer matters here).
 */
export type Phase = "buffered" | "running" | "finishing";

export interface HeldJob {
  job: ClaimedJob;
  /** undefined: this worker does not know the task. */
  task: NormalizedTask | undefined;
  phase: Phase;
  controller: AbortController;
  /** A heartbeat found the job no longer held by this attempt. */
  leaseLost: boolean;
  /** Handed back at shutdown: whatever the handler does later is ignored. */
  abandoned: boolean;
  /** performance.now() at the start of the attempt, and when the handler settled. */
  startedAt: number;
  endedAt: number | undefined;
  /** Set by ctx.snooze(). */
  snoozeDelay: Duration | undefined;
  /** The job's transaction, for a transactional task. */
  tx: pg.PoolClient | undefined;
}

export interface Runtime {
  readonly pool: pg.Pool;
  readonly settings: Settings;
  readonly tasks: ReadonlyMap<string, NormalizedTask>;
  /** Every job this worker holds a lease on, by id. */
  readonly held: Map<string, HeldJob>;
  emit<K extends keyof WorkerEvents>(event: K, ...args: WorkerEvents[K]): void;
  /** worker:error for a failure outside a job. */
  report(during: string, error: unknown): void;
  /** Wake the claim loop early at this time (a retry or snooze this worker scheduled). */
  wakeAt(at: number): void;
}

export function jobEvent(rt: Runtime, held: HeldJob): JobEvent {
  return {
    jobId: held.job.id,
    task: held.job.task,
    queue: held.job.queue,
    attempt: held.job.attempt,
    workerId: rt.settings.workerId,
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
