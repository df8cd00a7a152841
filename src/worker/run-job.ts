// Runs one claimed job: the attempt in its span when tracing is on, and the
// plain task's path; a transactional task's attempt is run-transactional.ts's,
// and how an attempt ended is recorded by record-outcome.ts.
//
// Plain task: handler -> complete_many through the Completer (or complete()
// when it returned a result to store).
// With tracing on, the whole attempt runs in its span (src/tracing/spans.ts),
// and each end tells the span how the attempt ended (held.trace).
import { parkJob } from "./children.ts";
import type { Completer } from "./completer.ts";
import { isReleased, type HeldJob } from "./held-jobs.ts";
import { makeContext } from "./job-context.ts";
import { completeWithResult, failJob, handlerOver, parkedJob, snoozeJob, storable } from "./record-outcome.ts";
import { runTransactional } from "./run-transactional.ts";
import { parkedAt } from "./steps.ts";
import { timeLimit } from "./time-limit.ts";
import { jobEvent, type WorkerState } from "./worker-state.ts";

/** The job names a task this worker does not have. Retryable: another worker may have it. */
export class UnknownTaskError extends Error {
  constructor(task: string, known: readonly string[]) {
    super(`this worker has no task "${task}" (it has: ${known.join(", ")})`);
    this.name = "UnknownTaskError";
  }
}

/**
 * Runs a started job: gives its slot back (HeldJobs.freeSlot) once its
 * handler (and, for a transactional task, its transaction) is over, and
 * resolves when its attempt is recorded (a plain success is then queued in
 * the Completer), after calling `over` (the worker forgets the job: its
 * inFlight entry). Never rejects: what escapes is reported (worker:error).
 */
export function runJob(state: WorkerState, held: HeldJob, completer: Completer, over: (held: HeldJob) => void): Promise<void> {
  const tracing = state.tracing;
  // The common case (no tracing, or the API without an SDK or a context manager): one async function per job.
  if (tracing === undefined || tracing.passesThrough) return runAttempt(state, held, completer, over);
  return runTraced(tracing, state, held, completer, over);
}

/**
 * The attempt in its span: the bookkeeping waits for the span's end, and
 * what escapes the attempt marks the span before it is reported.
 */
async function runTraced(
  tracing: NonNullable<WorkerState["tracing"]>,
  state: WorkerState,
  held: HeldJob,
  completer: Completer,
  over: (held: HeldJob) => void,
): Promise<void> {
  try {
    await tracing.run(held.job, (span) => {
      held.trace = span;
      return runAttempt(state, held, completer, undefined);
    });
  } catch (error) {
    state.report(`running job ${held.job.id}`, error);
  } finally {
    jobOver(state, held, over);
  }
}

/**
 * One attempt, from job:start to its outcome recorded or queued. One async
 * function for the whole of it, the worker's bookkeeping included (`over`,
 * when the caller leaves it here): each async layer per job is a frame, a
 * promise and an await more, and the two layers that wrapped it (the
 * worker's, and tracing.run's without an SDK) cost 540 B per job
 * (bench/FINDINGS.md, "The worker's allocations per job"). The microtask
 * before the handler stays: a handler never runs inside startClaimed's loop.
 */
async function runAttempt(state: WorkerState, held: HeldJob, completer: Completer, over: ((held: HeldJob) => void) | undefined): Promise<void> {
  try {
    if (state.listening("job:start")) state.emit("job:start", { ...jobEvent(state, held), reclaimed: held.job.reclaimed });
    if (held.task?.transactional) {
      await runTransactional(state, held, held.task);
      return;
    }
    // The outcome as two locals, not an object: this path runs once per job, and
    // its allocations are the largest share of the worker's (bench/FINDINGS.md,
    // "The worker's allocations per job").
    let failed = false;
    let returned: unknown;
    const limit = timeLimit(held);
    try {
      // claim() passes this worker's tasks, so this is a guard, not a path jobs take.
      if (held.task === undefined) throw new UnknownTaskError(held.job.task, [...state.tasks.keys()]);
      const task = held.task;
      // A microtask later: never inside startClaimed's loop. (`await undefined`,
      // then the handler, allocated more: 1,099 against 873 B/job sampled.)
      const running = Promise.resolve().then(() => task.run(held.job.payload, makeContext(state, held, undefined) as never));
      // Past the time limit the attempt fails whether or not the handler heeds ctx.signal.
      returned = await (limit === undefined ? running : Promise.race([running, limit.expired]));
    } catch (error) {
      failed = true;
      returned = limit?.fired ?? error;
    } finally {
      limit?.clear();
    }
    handlerOver(state, held);
    // Each end below is awaited here, not returned: the finally waits for it.
    if (isReleased(held)) {
      held.trace?.end("released"); // handed back at shutdown; the attempt is already recorded
      return;
    }
    const parked = parkedAt(held);
    if (parked !== undefined) return parkedJob(state, held, parked);
    if (held.snoozeDelay !== undefined) return await snoozeJob(state, held);
    if (held.awaitingChildren !== undefined) return await parkJob(state, held);
    if (failed) return await failJob(state, held, returned);
    // A heartbeat found the lease gone (held.fencedOut): complete anyway. It is
    // fenced, so it changes nothing, and its IQ410 says why (a cancel included).
    const result = storable(state, held, returned);
    if (result === undefined) {
      held.trace?.end("succeeded"); // complete_many follows in a batch, after the span
      completer.add(held);
      return;
    }
    await completeWithResult(state, held, result);
  } catch (error) {
    if (over === undefined) throw error; // runTraced reports it, after the span has seen it
    state.report(`running job ${held.job.id}`, error);
  } finally {
    if (over !== undefined) jobOver(state, held, over);
  }
}

/** The attempt is over, however it ended: its slot is free (already, unless a throw came first), and the worker forgets it. */
function jobOver(state: WorkerState, held: HeldJob, over: (held: HeldJob) => void): void {
  state.held.freeSlot(held);
  over(held);
}
