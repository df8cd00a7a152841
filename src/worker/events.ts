// The worker's events, for logs and metrics. Every job event carries the job
// id, task, queue and attempt; events that end an attempt carry its duration.

import type { LeaseLostError, RateLimitScope } from "../errors.ts";

/** An error as recorded in the job's errors list and in events. */
export interface ErrorInfo {
  /** The error's class (constructor name), e.g. "TypeError". */
  class: string;
  message: string;
  stack?: string;
}

export interface JobEvent {
  jobId: string;
  task: string;
  queue: string;
  attempt: number;
  workerId: string;
}

export interface JobEndEvent extends JobEvent {
  /** From the start of the attempt (the handler, or the guard) to its end. */
  durationMs: number;
}

/** The scope a RateLimitedError held back, and until when by the database's clock (hold()). */
export interface HeldScope {
  scope: RateLimitScope;
  /** The queue's or the task's name; null for a key (the claim does not carry it: job(jobId).concurrencyKey has it). */
  name: string | null;
  until: Date;
}

export interface LogEntry {
  level: "debug" | "info" | "warn" | "error";
  message: string;
  workerId: string;
  jobId?: string;
  task?: string;
  attempt?: number;
  [field: string]: unknown;
}

export interface WorkerEvents {
  "job:start": [JobEvent & { reclaimed: boolean }];
  "job:success": [JobEndEvent];
  /** Failed; another attempt is scheduled at retryAt (the run_at fail() stored, database clock). */
  "job:retry": [JobEndEvent & { error: ErrorInfo; retryAt: Date }];
  /** Failed for good: out of attempts, or a permanent error. */
  "job:failed": [JobEndEvent & { error: ErrorInfo; permanent: boolean }];
  /** A transactional task's guard key was already taken: completed without running the handler. */
  "job:duplicate": [JobEndEvent & { guardKey: string }];
  /**
   * An operator cancelled the job (idemq.cancel) while this worker held it,
   * running or waiting in the buffer: the attempt's result was discarded and
   * its transaction rolled back; the job stays cancelled. `reason` says which
   * call found out (lost.ts).
   */
  "job:cancelled": [JobEndEvent & { reason: string }];
  /**
   * This attempt no longer holds the job, and not because it was cancelled:
   * its lease ran out and the job was rescued (perhaps taken by a newer
   * attempt), or the job is gone. Its result was discarded and its
   * transaction rolled back. currentState is the job's state when the
   * database said so (complete, fail or snooze refused); absent when it did
   * not (the job is gone, or the call that would have asked failed).
   */
  "job:lease-lost": [JobEndEvent & LostFields];
  /**
   * Back to `scheduled` without spending an attempt. `held`: the handler threw
   * RateLimitedError, and the job's queue or task is held back from every
   * claim until `until` (the database's clock), when the job runs again.
   * `children`: ctx.spawn parked the job (`awaiting`, delay "children")
   * until that many unfinished children have finished.
   */
  "job:snoozed": [JobEndEvent & { delay: string; held?: HeldScope; children?: number }];
  /**
   * Something outside a job failed (a claim, a heartbeat, the listener...); the
   * worker keeps going. Of the connection failures of one outage only the first
   * is reported; worker:reconnected ends the outage.
   */
  "worker:error": [{ workerId: string; during: string; error: Error }];
  /** The database answers again after connection failures: how long since the first, and how many calls failed. */
  "worker:reconnected": [{ workerId: string; downMs: number; failedCalls: number }];
  /**
   * Listen mode found its listen connection behind a transaction pooler
   * (session state does not persist there): the worker polls instead. Comes
   * with one warn log line saying how to fix it.
   */
  "worker:pooler": [{ workerId: string; evidence: string; wakeUp: "poll" }];
  /** A claim() returned: how many jobs it brought (0 for an empty claim) and how many it asked for. */
  "worker:claimed": [{ workerId: string; jobs: number; asked: number }];
  /**
   * A completion (complete_and_take_next) handed this worker the next jobs of
   * the concurrency keys it freed, claimed for it in the same call: how many.
   * Not emitted for a completion that handed none.
   */
  "worker:handed": [{ workerId: string; jobs: number }];
  "worker:started": [{ workerId: string }];
  "worker:stopped": [{ workerId: string }];
  /** ctx.log lines, and the worker's own notices. */
  log: [LogEntry];
}

/**
 * The events that end an attempt (or a claimed job that never started), one
 * per attempt: the one list the metrics, the CLI and the demo read.
 */
export const JOB_END_EVENTS = [
  "job:success",
  "job:retry",
  "job:failed",
  "job:duplicate",
  "job:cancelled",
  "job:lease-lost",
  "job:snoozed",
] as const satisfies readonly (keyof WorkerEvents)[];
export type JobEndEventName = (typeof JOB_END_EVENTS)[number];

/** Why an attempt no longer holds its job: job:lease-lost's fields, and job:cancelled's when currentState is "cancelled". */
export interface LostFields {
  reason: string;
  currentState?: string;
}

/** The reason and currentState of a lost attempt, from the IQ410 the database raised. */
export function leaseLostFields(error: LeaseLostError): LostFields {
  const currentState = error.currentState;
  if (currentState === undefined) return { reason: error.message };
  return { reason: currentState === "cancelled" ? `cancelled while this attempt ran (${error.message})` : error.message, currentState };
}

/** What the job's errors list records for a thrown value. */
export function errorInfo(error: unknown): ErrorInfo {
  if (error instanceof Error) {
    const info: ErrorInfo = { class: error.constructor?.name || error.name || "Error", message: error.message };
    if (typeof error.stack === "string") info.stack = error.stack;
    return info;
  }
  if (error !== null && typeof error === "object") {
    const ctor = (error as object).constructor?.name;
    let message: string;
    try {
      message = JSON.stringify(error);
    } catch {
      message = String(error);
    }
    return { class: ctor && ctor !== "Object" ? ctor : "NonErrorThrown", message };
  }
  return { class: "NonErrorThrown", message: String(error) };
}

/** An Error for worker:error from anything thrown. */
export function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error(String(error));
}
