// How an attempt ended, recorded: complete() with a result (a plain success
// without one goes to the Completer), fail(), snooze(), hold(), or a park
// the database already recorded. A failed attempt is recorded by fail(): not
// retryable for PermanentError or exceptOn/onlyOn; the task's own
// maxAttempts and backoff, when it has them, go to fail(), which applies
// them to the counted attempts (snoozes do not count) on the database clock
// (else the job's own, in SQL). Each end tells the attempt's span how it
// ended (held.trace) and takes the job off the worker's hands.
import { RESULT_BYTES } from "../contract.ts";
import { toMilliseconds } from "../duration.ts";
import { BadArgumentError, EffectClaimLostError, LeaseLostError, PermanentError, RateLimitedError } from "../errors.ts";
import * as sql from "../sql/index.ts";
import { EffectBusyError } from "./effect.ts";
import { errorInfo, leaseLostFields } from "./events.ts";
import type { HeldJob } from "./held-jobs.ts";
import { asLost, attemptLost } from "./lost.ts";
import type { NormalizedTask } from "./task-config.ts";
import { jitter } from "./timers.ts";
import { durationOf, jobEvent, type WorkerState } from "./worker-state.ts";

/** started -> finished, and the slot goes to the next job. */
export function handlerOver(state: WorkerState, held: HeldJob): void {
  state.held.finish(held);
  state.held.freeSlot(held);
}

/** complete() with the handler's result, as storable's JSON text (the Completer's batches carry none). */
export async function completeWithResult(state: WorkerState, held: HeldJob, resultJson: string): Promise<void> {
  try {
    await sql.complete(state.preparedCalls, held.job.id, held.job.attempt, held.job.leaseToken, resultJson);
    held.trace?.end("succeeded");
    if (state.listening("job:success")) state.emit("job:success", { ...jobEvent(state, held), durationMs: durationOf(held) });
  } catch (caught) {
    const error = asLost(caught);
    if (error instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(error));
    // The lease runs out and rescue() hands the job back: at least once.
    state.report(`complete of job ${held.job.id}`, error);
  } finally {
    state.held.remove(held);
  }
}

/**
 * Records a failed attempt with fail(), or reports the lease lost. An effect
 * claim lost in ctx.effect is a failure like any other: the job's own lease
 * may be intact, so the attempt is recorded and retried.
 */
export async function failJob(state: WorkerState, held: HeldJob, error: unknown): Promise<void> {
  // The database said why (an IQ410 naming the job's state, or IQ404). The
  // LeaseLostError ctx.signal aborted with says only that a heartbeat missed
  // the job: then, as for any error of a fenced-out attempt, fail() below asks
  // (fenced, it records nothing; its IQ410 tells a cancel from a lost lease).
  const saidWhy = !(held.fencedOut && error === held.abortedBy);
  if (error instanceof LeaseLostError && !(error instanceof EffectClaimLostError) && saidWhy) {
    return attemptLost(state, held, leaseLostFields(error));
  }
  if (error instanceof EffectBusyError) {
    // "Not yet" is no failure: the job waits for the other run without spending an attempt.
    held.snoozeDelay = Math.round(jitter(state.settings.effectBusySnoozeMs, 0.5));
    return snoozeJob(state, held);
  }
  if (error instanceof RateLimitedError) return holdJob(state, held, error);
  const task = held.task;
  const permanent = isPermanent(task, error);
  const retryable = !permanent;
  // fail() applies the task's maxAttempts and backoff to the counted attempts
  // (snoozes do not count) on the database clock, and returns the run_at it
  // chose: the event reports it and the claim loop wakes for it.
  const info = errorInfo(error);
  try {
    const { state: jobState, runAt } = await sql.fail(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, info, {
      retryable,
      ...(task?.backoff === undefined ? {} : { backoff: task.backoff }),
      ...(task?.maxAttempts === undefined ? {} : { maxAttempts: task.maxAttempts }),
    });
    held.trace?.end(jobState === "failed" ? "failed" : "retry", error);
    if (jobState === "failed") {
      state.emit("job:failed", { ...jobEvent(state, held), durationMs: durationOf(held), error: info, permanent });
    } else {
      state.emit("job:retry", { ...jobEvent(state, held), durationMs: durationOf(held), error: info, retryAt: runAt });
      state.wakeAt(runAt.getTime());
    }
  } catch (caught) {
    const failError = asLost(caught);
    if (failError instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(failError));
    // A heartbeat missed the job, and asking why failed: lost all the same, for a reason unknown.
    if (held.fencedOut) {
      return attemptLost(state, held, { reason: "lost while the handler ran (a heartbeat missed the job); its error is discarded" });
    }
    held.trace?.end("retry", error); // not recorded: rescue() hands the job back when its lease runs out
    state.report(`fail of job ${held.job.id}`, failError);
  } finally {
    state.held.remove(held);
  }
}

function isPermanent(task: NormalizedTask | undefined, error: unknown): boolean {
  if (error instanceof PermanentError) return true;
  // busy means "not yet", never "never": retried whatever onlyOn says.
  if (error instanceof EffectBusyError || task === undefined) return false;
  if (task.exceptOn.some((cls) => error instanceof (cls as unknown as abstract new () => unknown))) return true;
  return task.onlyOn !== undefined && !task.onlyOn.some((cls) => error instanceof (cls as unknown as abstract new () => unknown));
}

export async function snoozeJob(state: WorkerState, held: HeldJob): Promise<void> {
  const delay = held.snoozeDelay!;
  try {
    await sql.snooze(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, { delay });
    held.trace?.end("snoozed");
    state.emit("job:snoozed", { ...jobEvent(state, held), durationMs: durationOf(held), delay: String(delay) });
    let ms: number | undefined;
    try {
      ms = toMilliseconds(delay);
    } catch {
      // months and years: the fallback poll finds the job
    }
    if (ms !== undefined) state.wakeAt(Date.now() + ms);
  } catch (caught) {
    const error = asLost(caught);
    if (error instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(error));
    state.report(`snooze of job ${held.job.id}`, error);
  } finally {
    state.held.remove(held);
  }
}

/**
 * ctx.sleep or ctx.waitFor parked the job (sleep(), await_event()): the
 * database already ended the attempt without spending it, so nothing is left
 * to record, whatever the handler did after. The claim loop wakes at `until`
 * (a wait's event wakes it sooner, by NOTIFY).
 */
export function parkedJob(state: WorkerState, held: HeldJob, until: Date): void {
  held.trace?.end("snoozed");
  state.emit("job:snoozed", { ...jobEvent(state, held), durationMs: durationOf(held), delay: `${Math.max(0, until.getTime() - Date.now())}ms` });
  state.wakeAt(until.getTime());
  state.held.remove(held);
}

/**
 * The handler threw RateLimitedError (its API said 429 with a Retry-After):
 * hold() holds back the job's queue, task or concurrency key from every
 * claim until then and snoozes the job to that time, its attempt not spent.
 * A transactional attempt's writes rolled back first, as for any error. A
 * hold the database refuses (scope "key" on a job without a concurrency
 * key: 22023, naming the job and the fix) fails the attempt with that
 * error, so it is on the job and the task's retry policy applies.
 */
async function holdJob(state: WorkerState, held: HeldJob, error: RateLimitedError): Promise<void> {
  const delay = `${error.retryAfterMs}ms`;
  try {
    const until = await sql.hold(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, error.scope, delay);
    held.trace?.end("snoozed");
    const name = error.scope === "queue" ? held.job.queue : error.scope === "task" ? held.job.task : null;
    state.emit("job:snoozed", {
      ...jobEvent(state, held),
      durationMs: durationOf(held),
      delay,
      held: { scope: error.scope, name, until },
    });
    state.wakeAt(Date.now() + error.retryAfterMs);
  } catch (caught) {
    const lost = asLost(caught);
    if (lost instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(lost));
    // Awaited: the job stays held (heartbeats, shutdown) until fail() answers.
    if (lost instanceof BadArgumentError) return await failJob(state, held, lost);
    held.trace?.end("retry", error); // not recorded: rescue() hands the job back when its lease runs out
    state.report(`hold of job ${held.job.id}`, lost);
  } finally {
    state.held.remove(held);
  }
}

/**
 * A handler's return value as the JSON text of its jsonb result (serialized
 * once: measured for the limit, then sent as is); undefined when there is
 * none to store.
 */
export function storable(state: WorkerState, held: HeldJob, result: unknown): string | undefined {
  if (result === undefined || result === null) return undefined;
  let text: string | undefined;
  try {
    text = JSON.stringify(result);
  } catch {
    // below
  }
  // complete() would refuse a result over the limit and leave the job held
  // until its lease ran out and it ran again: the work is done, so the job
  // completes and the result is what gives way, with a line saying so.
  const bytes = text === undefined ? 0 : Buffer.byteLength(text);
  if (text !== undefined && bytes <= RESULT_BYTES) return text;
  state.emit("log", {
    level: "warn",
    message:
      text === undefined
        ? "the handler's return value is not JSON; the job completes without a result"
        : `the handler's return value is ${bytes} bytes of JSON, over the limit of ${RESULT_BYTES}; the job completes without a result (keep bulky data in a table and return its key)`,
    workerId: state.settings.workerId,
    jobId: held.job.id,
    task: held.job.task,
    attempt: held.job.attempt,
  });
  return undefined;
}
