// Reporting an attempt that no longer holds its job. Two causes look alike
// from the worker (a heartbeat misses the job, or complete, fail or snooze is
// refused with IQ410) and are told apart by the state the database names in
// that IQ410 (current_state in its DETAIL):
//   cancelled  an operator cancelled the job (idemq.cancel) while this worker
//              held it: job:cancelled
//   any other  the lease ran out and the job was rescued (perhaps taken by a
//              newer attempt), or the job is gone (IQ404): job:lease-lost
// A heartbeat names no state for the jobs it did not keep, so where only a
// heartbeat knows, a fenced call asks: it cannot change a job this attempt
// no longer holds, and its refusal says why.
import { JobNotFoundError, LeaseLostError } from "../errors.ts";
import * as sql from "../sql/index.ts";
import { leaseLostFields, type LostFields } from "./events.ts";
import type { HeldJob } from "./held-jobs.ts";
import { durationOf, jobEvent, type WorkerState } from "./worker-state.ts";

/**
 * IQ404 from complete, fail or snooze of the job this attempt holds: the job
 * is gone, so this attempt holds it no more. Another attempt succeeded and
 * its retention (0) deleted it, or it finished and was purged. It is a lost
 * lease like IQ410 (the attempt's transaction rolls back), not a failure.
 */
export function asLost(error: unknown): unknown {
  if (!(error instanceof JobNotFoundError)) return error;
  return new LeaseLostError(`lease lost: the job is gone (${error.message})`, { code: "IQ410" }, { cause: error });
}

/** job:cancelled or job:lease-lost, as `why` says; the span ends with it, and the job is no longer this worker's. */
export function attemptLost(state: WorkerState, held: HeldJob, why: LostFields, durationMs = durationOf(held)): void {
  if (why.currentState === "cancelled") {
    // An operator's decision, not an error of the attempt's.
    held.trace?.end("cancelled");
    state.emit("job:cancelled", { ...jobEvent(state, held), durationMs, reason: why.reason });
  } else {
    held.trace?.end("lease-lost", new LeaseLostError(why.reason, { code: "IQ410" }));
    state.emit("job:lease-lost", { ...jobEvent(state, held), durationMs, ...why });
  }
  state.held.remove(held);
}

/**
 * A heartbeat missed a job that waited in the buffer (HeldJobs.fenceOut
 * removed it): a fenced snooze to now asks why. Refused, its IQ410 names the
 * job's state; were it accepted, it would give the job back, as the buffer
 * gives back any job it will not run.
 */
export async function reportLostInBuffer(state: WorkerState, held: HeldJob): Promise<void> {
  let why: LostFields = { reason: "lost while waiting in the buffer" };
  try {
    await sql.snooze(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, { delay: 0 });
  } catch (caught) {
    const error = asLost(caught);
    if (error instanceof LeaseLostError) {
      const fields = leaseLostFields(error);
      why =
        fields.currentState === "cancelled"
          ? { reason: `cancelled while waiting in this worker's buffer (${error.message})`, currentState: "cancelled" }
          : fields;
    } else {
      state.report(`asking why job ${held.job.id} was lost from the buffer`, error);
    }
  }
  attemptLost(state, held, why, 0);
}
