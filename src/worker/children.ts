// ctx.spawn and ctx.children: fan-out and fan-in for a handler (SQL:
// spawn, wait_for_children, children; sql/functions/children/).
//
// ctx.spawn(children) enqueues the children (idempotent by name: a replay of
// the handler spawns nothing twice) and, while any is unfinished, ends the
// attempt by throwing JobAwaitingChildren; once the handler is over,
// parkJob() calls wait_for_children: the job waits `awaiting`, holding no
// worker slot, its attempt not spent, until the last child finishes, and
// then runs again from the top. On that run ctx.spawn, called with the same
// children, finds them finished and returns their outcomes. With failFast,
// the first child that did not succeed releases the job, and ctx.spawn
// throws ChildFailedError (permanent: the job fails).
import { ChildFailedError, LeaseLostError } from "../errors.ts";
import * as sql from "../sql/index.ts";
import { isTerminalState } from "../contract.ts";
import type { HeldJob } from "./held-jobs.ts";
import { leaseLostFields } from "./events.ts";
import { asLost, attemptLost } from "./lost.ts";
import type { JobContext } from "./types.ts";
import { jobEvent, durationOf, type WorkerState } from "./worker-state.ts";

/**
 * Thrown by ctx.spawn() to end the handler while children are unfinished.
 * The worker parks the job whatever the handler does with it (catching it
 * does not undo the park); a transactional task's transaction rolls back.
 */
export class JobAwaitingChildren extends Error {
  constructor(readonly unfinished: number) {
    super(`job parked until its ${unfinished} unfinished children have finished`);
    this.name = "JobAwaitingChildren";
  }
}

export function makeSpawn(state: WorkerState, held: HeldJob): JobContext["spawn"] {
  return async (children, options = {}) => {
    const { job } = held;
    const rows = await sql.spawn(state.calls, job.id, job.attempt, job.leaseToken, children, { failFast: options.failFast });
    const outcomes = rows.map(({ outcome: _outcome, ...child }) => child);
    if (options.failFast === true) {
      const failed = outcomes.find((c) => isTerminalState(c.state) && c.state !== "succeeded");
      if (failed !== undefined) throw new ChildFailedError(job.id, failed);
    }
    const unfinished = outcomes.filter((c) => !isTerminalState(c.state)).length;
    if (unfinished === 0) return outcomes;
    held.awaitingChildren = unfinished;
    throw new JobAwaitingChildren(unfinished);
  };
}

export function makeChildren(state: WorkerState, held: HeldJob): JobContext["children"] {
  return () => sql.children(state.calls, held.job.id);
}

/**
 * The handler is over and ctx.spawn left children unfinished: wait_for_children
 * parks the job. When they all finished meanwhile (it says false), the job
 * is snoozed to now instead, its attempt not spent either, and runs again at
 * once: its ctx.spawn then returns the outcomes.
 */
export async function parkJob(state: WorkerState, held: HeldJob): Promise<void> {
  const { job } = held;
  try {
    const parked = await sql.waitForChildren(state.calls, job.id, job.attempt, job.leaseToken);
    if (!parked) {
      await sql.snooze(state.calls, job.id, job.attempt, job.leaseToken, { delay: 0 });
      state.wakeAt(Date.now());
    }
    held.trace?.end("snoozed");
    state.emit("job:snoozed", {
      ...jobEvent(state, held),
      durationMs: durationOf(held),
      delay: parked ? "children" : "0",
      ...(parked && held.awaitingChildren !== undefined ? { children: held.awaitingChildren } : {}),
    });
  } catch (caught) {
    const error = asLost(caught);
    if (error instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(error));
    // Not recorded: rescue() hands the job back when its lease runs out, and the replay spawns nothing twice.
    state.report(`wait_for_children of job ${job.id}`, error);
  } finally {
    state.held.remove(held);
  }
}
