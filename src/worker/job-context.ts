// The ctx a handler receives: job, tx, signal, log, snooze, effect.
import type pg from "pg";
import { type Duration } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import { runEffect } from "./effect.ts";
import { signalOf, type HeldJob } from "./held-jobs.ts";
import type { EffectOptions, JobContext, JobInfo, JobLog } from "./types.ts";
import type { WorkerState } from "./worker-state.ts";

/**
 * Thrown by ctx.snooze() to end the handler. The worker snoozes the job
 * whatever the handler does with it (catching it does not undo the snooze).
 */
export class JobSnoozed extends Error {
  constructor(readonly delay: Duration) {
    super(`job snoozed for ${toPgInterval(delay)}`);
    this.name = "JobSnoozed";
  }
}

export function jobInfo(held: HeldJob): JobInfo {
  const { job, task } = held;
  return {
    id: job.id,
    task: job.task,
    queue: job.queue,
    attempt: job.attempt,
    maxAttempts: Math.min(task?.maxAttempts ?? job.maxAttempts, job.maxAttempts),
    key: job.idempotencyKey,
    reclaimed: job.reclaimed,
    payload: job.payload,
  };
}

export function makeContext(state: WorkerState, held: HeldJob, tx: pg.PoolClient | undefined): JobContext {
  return new HandlerContext(state, held, tx);
}

/**
 * One per attempt. What a handler may use is made on its first use (most
 * handlers use little of it: 3 µs of worker CPU per job when all was made up
 * front), then kept, so every read returns the same object; snooze, effect
 * and the log's methods are closures, so they work detached
 * (`const { snooze } = ctx`) as before.
 */
class HandlerContext implements JobContext {
  readonly #state: WorkerState;
  readonly #held: HeldJob;
  #job: JobInfo | undefined;
  #log: JobLog | undefined;
  #snooze: JobContext["snooze"] | undefined;
  #effect: JobContext["effect"] | undefined;

  constructor(
    state: WorkerState,
    held: HeldJob,
    readonly tx: pg.PoolClient | undefined,
  ) {
    this.#state = state;
    this.#held = held;
  }

  get job(): JobInfo {
    return (this.#job ??= jobInfo(this.#held));
  }

  get signal(): AbortSignal {
    return signalOf(this.#held);
  }

  get log(): JobLog {
    return (this.#log ??= makeLog(this.#state, this.#held));
  }

  get snooze(): JobContext["snooze"] {
    const held = this.#held;
    return (this.#snooze ??= (delay: Duration): never => {
      toPgInterval(delay); // a bad duration throws here, as a failure of the handler
      held.snoozeDelay = delay;
      throw new JobSnoozed(delay);
    });
  }

  get effect(): JobContext["effect"] {
    const state = this.#state;
    const held = this.#held;
    return (this.#effect ??= <T>(key: string, fn: (key: string) => Promise<T> | T, options?: EffectOptions<T>): Promise<T> =>
      runEffect(state, held, key, fn, options));
  }
}
function makeLog(state: WorkerState, held: HeldJob): JobLog {
  const line =
    (level: "debug" | "info" | "warn" | "error") =>
    (message: string, fields: Record<string, unknown> = {}): void => {
      state.emit("log", {
        ...fields,
        level,
        message,
        workerId: state.settings.workerId,
        jobId: held.job.id,
        task: held.job.task,
        attempt: held.job.attempt,
      });
    };
  return { debug: line("debug"), info: line("info"), warn: line("warn"), error: line("error") };
}
