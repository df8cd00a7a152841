// Graceful shutdown: SIGTERM/SIGINT handlers, giving back claimed jobs that
// had not started, and handing back jobs whose handlers outlived shutdownTimeout.
import { constants } from "node:os";
import * as sql from "../sql/index.ts";
import { LeaseLostError } from "../errors.ts";
import { errorInfo, leaseLostFields } from "./events.ts";
import { abortAttempt, type HeldJob } from "./held-jobs.ts";
import { attemptLost } from "./lost.ts";
import { durationOf, jobEvent, type WorkerState } from "./worker-state.ts";

/** The reason ctx.signal aborts with when shutdownTimeout ran out. */
export class WorkerShutdownError extends Error {
  constructor(timeoutMs: number) {
    super(`the worker stopped and the job did not finish within shutdownTimeout (${timeoutMs} ms)`);
    this.name = "WorkerShutdownError";
  }
}

/**
 * First SIGTERM/SIGINT: `stop()` (stop claiming, drain). A second one exits
 * at once. Returns a function that removes the handlers.
 */
export function installSignalHandlers(state: WorkerState, stop: () => Promise<void>, runningJobs: () => number): () => void {
  let received = 0;
  const onSignal = (signal: NodeJS.Signals): void => {
    received++;
    if (received > 1) {
      process.exit(128 + (constants.signals[signal] ?? constants.signals.SIGTERM));
    }
    state.emit("log", {
      level: "info",
      message: `${signal}: stopping; ${runningJobs()} running jobs get ${state.settings.shutdownTimeoutMs} ms to finish; signal again to exit now`,
      workerId: state.settings.workerId,
    });
    void stop();
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);
  return () => {
    process.off("SIGTERM", onSignal);
    process.off("SIGINT", onSignal);
  };
}

/**
 * Gives unstarted jobs back at once: snooze() to now returns each to
 * `scheduled`, runnable right away, without spending an attempt.
 */
export async function releaseClaimed(state: WorkerState): Promise<void> {
  const claimed = state.held.releaseClaimed();
  await giveBack(state, claimed);
  if (claimed.length > 0) {
    state.emit("log", {
      level: "info",
      message: `released ${claimed.length} claimed jobs that had not started`,
      workerId: state.settings.workerId,
    });
  }
}

/**
 * Gives back the jobs a claim brought beyond the buffer's byte budget
 * (HeldJobs.releaseOverBudget), as releaseClaimed does at shutdown.
 */
export async function releaseOverBudget(state: WorkerState): Promise<void> {
  const over = state.held.releaseOverBudget();
  if (over.length === 0) return;
  state.emit("log", {
    level: "debug",
    message: `gave back ${over.length} claimed jobs beyond prefetchBytes (${state.settings.prefetchBytes} bytes)`,
    workerId: state.settings.workerId,
  });
  await giveBack(state, over);
}

/** Snoozes released, unstarted jobs to now, then forgets them. */
async function giveBack(state: WorkerState, claimed: readonly HeldJob[]): Promise<void> {
  await Promise.all(
    claimed.map(async (held) => {
      try {
        await sql.snooze(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, { delay: 0 });
      } catch (error) {
        // Lost anyway, or the lease runs out and rescue() hands it back.
        if (!(error instanceof LeaseLostError)) state.report(`releasing unstarted job ${held.job.id}`, error);
      } finally {
        state.held.remove(held);
      }
    }),
  );
}

/**
 * Hands back a job whose handler did not finish within shutdownTimeout:
 * aborts its signal, rolls back its transaction (by destroying the
 * connection under the handler), and records the attempt with fail()
 * (retryable, not counted: no attempt spent, no backoff), so it runs again
 * elsewhere at once. Whatever the handler does
 * afterwards is ignored.
 */
export async function handBack(state: WorkerState, held: HeldJob): Promise<void> {
  state.held.release(held);
  const reason = new WorkerShutdownError(state.settings.shutdownTimeoutMs);
  abortAttempt(held, reason);
  const tx = held.tx;
  if (tx !== undefined) {
    held.tx = undefined;
    tx.release(reason);
  }
  const info = errorInfo(reason);
  try {
    // The attempt was cut short, it did not fail: it is not spent and no backoff applies.
    const { state: jobState, runAt } = await sql.fail(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, info, {
      retryable: true,
      counted: false,
    });
    const event = { ...jobEvent(state, held), durationMs: durationOf(held), error: info };
    if (jobState === "failed") state.emit("job:failed", { ...event, permanent: false });
    else state.emit("job:retry", { ...event, retryAt: runAt });
  } catch (error) {
    if (error instanceof LeaseLostError) {
      attemptLost(state, held, leaseLostFields(error));
    } else {
      state.report(`handing back job ${held.job.id}`, error);
    }
  } finally {
    state.held.remove(held);
  }
}
