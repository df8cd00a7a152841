// Graceful shutdown: SIGTERM/SIGINT handlers, releasing the buffer, and
// handing back jobs whose handlers outlived shutdownTimeout.
import { constants } from "node:os";
import * as sql from "../sql-api.ts";
import { LeaseLostError } from "../errors.ts";
import { errorInfo } from "./events.ts";
import { release } from "./run-job.ts";
import { durationOf, jobEvent, type HeldJob, type Runtime } from "./runtime.ts";

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
export function installSignalHandlers(rt: Runtime, stop: () => Promise<void>, runningJobs: () => number): () => void {
  let received = 0;
  const onSignal = (signal: NodeJS.Signals): void => {
    received++;
    if (received > 1) {
      process.exit(128 + (constants.signals[signal] ?? constants.signals.SIGTERM));
    }
    rt.emit("log", {
      level: "info",
      message: `${signal}: stopping; ${runningJobs()} running jobs get ${rt.settings.shutdownTimeoutMs} ms to finish; signal again to exit now`,
      workerId: rt.settings.workerId,
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
export async function releaseBuffered(rt: Runtime, buffered: readonly HeldJob[]): Promise<void> {
  await Promise.all(
    buffered.map(async (held) => {
      try {
        await sql.snooze(rt.pool, held.job.id, held.job.attempt, { delay: 0 });
      } catch (error) {
        // Lost anyway, or the lease runs out and rescue() hands it back.
        if (!(error instanceof LeaseLostError)) rt.report(`releasing unstarted job ${held.job.id}`, error);
      } finally {
        release(rt, held);
      }
    }),
  );
  if (buffered.length > 0) {
    rt.emit("log", {
      level: "info",
      message: `released ${buffered.length} claimed jobs that had not started`,
      workerId: rt.settings.workerId,
    });
  }
}

/**
 * Hands back a job whose handler did not finish within shutdownTimeout:
 * aborts its signal, rolls back its transaction (by destroying the
 * connection under the handler), and records the attempt with fail()
 * (retryable), so it runs again elsewhere. Whatever the handler does
 * afterwards is ignored.
 */
export async function handBack(rt: Runtime, held: HeldJob): Promise<void> {
  held.abandoned = true;
  held.endedAt = performance.now();
  const reason = new WorkerShutdownError(rt.settings.shutdownTimeoutMs);
  held.controller.abort(reason);
  const tx = held.tx;
  if (tx !== undefined) {
    held.tx = undefined;
    tx.release(reason);
  }
  const info = errorInfo(reason);
  try {
    const { state, runAt } = await sql.fail(rt.pool, held.job.id, held.job.attempt, info, { retryable: true });
    const event = { ...jobEvent(rt, held), durationMs: durationOf(held), error: info };
    if (state === "failed") rt.emit("job:failed", { ...event, permanent: false });
    else rt.emit("job:retry", { ...event, retryAt: runAt });
  } catch (error) {
    if (error instanceof LeaseLostError) {
      rt.emit("job:lease-lost", { ...jobEvent(rt, held), durationMs: durationOf(held), reason: error.message });
    } else {
      rt.report(`handing back job ${held.job.id}`, error);
    }
  } finally {
    release(rt, held);
  }
}
