// The ctx a handler receives: job, tx, signal, log, snooze, effect, progress, spawn, children.
import type pg from "pg";
import { PROGRESS_BOUNDS, type Duration } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import { makeChildren, makeSpawn } from "./children.ts";
import { runEffect } from "./effect.ts";
import { signalOf, type HeldJob } from "./held-jobs.ts";
import { makeStepContext, type StepContext } from "./steps.ts";
import type { EffectOptions, JobContext, JobInfo, JobLog } from "./types.ts";
import type { WorkerState } from "./worker-state.ts";
import * as sql from "../sql/index.ts";

/** ctx.progress writes a job's progress at most this often (the latest value; a hot loop writes once a second). */
export const PROGRESS_INTERVAL_MS = 1000;

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
  #progress: JobContext["progress"] | undefined;
  #steps: StepContext | undefined;
  #spawn: JobContext["spawn"] | undefined;
  #children: JobContext["children"] | undefined;

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

  get progress(): JobContext["progress"] {
    return (this.#progress ??= makeProgress(this.#state, this.#held));
  }

  // Durable steps (steps.ts): one replay state per attempt, shared by the four.
  get #stepContext(): StepContext {
    return (this.#steps ??= makeStepContext(this.#state, this.#held, this.tx !== undefined));
  }
  get step(): StepContext["step"] {
    return this.#stepContext.step;
  }
  get sleep(): StepContext["sleep"] {
    return this.#stepContext.sleep;
  }
  get sleepUntil(): StepContext["sleepUntil"] {
    return this.#stepContext.sleepUntil;
  }
  get waitFor(): StepContext["waitFor"] {
    return this.#stepContext.waitFor;
  }

  get spawn(): JobContext["spawn"] {
    return (this.#spawn ??= makeSpawn(this.#state, this.#held));
  }

  get children(): JobContext["children"] {
    return (this.#children ??= makeChildren(this.#state, this.#held));
  }
}

/**
 * ctx.progress: keeps the latest value and writes it at most once per
 * PROGRESS_INTERVAL_MS, one write in flight at a time, while the attempt runs
 * (a write after it ended would only be refused: IQ410).
 */
function makeProgress(state: WorkerState, held: HeldJob): JobContext["progress"] {
  let latest: number | undefined;
  let written: number | undefined;
  let lastWriteAt = -Infinity;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let writing = false;
  const running = () => held.phase === "started" && !held.fencedOut && held.abortedBy === undefined;
  const write = async (): Promise<void> => {
    timer = undefined;
    if (latest === undefined || latest === written || !running()) return;
    const value = latest;
    writing = true;
    lastWriteAt = performance.now();
    try {
      await sql.progress(state.calls, held.job.id, held.job.attempt, value, held.job.leaseToken);
      written = value;
    } catch (error) {
      if (running()) state.report(`progress of job ${held.job.id}`, error);
    } finally {
      writing = false;
      if (latest !== written) schedule();
    }
  };
  const schedule = (): void => {
    if (timer !== undefined || writing || !running()) return;
    timer = setTimeout(() => void write(), Math.max(0, lastWriteAt + PROGRESS_INTERVAL_MS - performance.now()));
    timer.unref?.();
  };
  return (value: number): void => {
    if (!Number.isInteger(value) || value < PROGRESS_BOUNDS.min || value > PROGRESS_BOUNDS.max) {
      throw new TypeError(`ctx.progress: value must be an integer percentage from ${PROGRESS_BOUNDS.min} to ${PROGRESS_BOUNDS.max}, got ${String(value)}`);
    }
    latest = value;
    schedule();
  };
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
