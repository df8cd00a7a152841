// The time limit of an attempt, for both paths (run-job.ts, run-transactional.ts).
import { TimeoutError } from "../errors.ts";
import { abortAttempt, type HeldJob } from "./held-jobs.ts";

/**
 * The attempt's time limit: its task's `timeout`, counted from the
 * attempt's start, and its job's own (enqueue's timeout), counted from its
 * claim as heartbeat() counts it from locked_at; whichever runs out first
 * aborts ctx.signal with a TimeoutError naming its limit (`fired`), and
 * `expired` rejects with it. Undefined when neither is set.
 */
export function timeLimit(held: HeldJob): { expired: Promise<never>; fired: TimeoutError | undefined; clear(): void } | undefined {
  // Most jobs have no limit: nothing allocated for them.
  if (held.task?.timeoutMs === undefined && held.job.timeoutMs === null) return undefined;
  const now = performance.now();
  const limits: { limitMs: number; leftMs: number }[] = [];
  if (held.task?.timeoutMs !== undefined) limits.push({ limitMs: held.task.timeoutMs, leftMs: held.task.timeoutMs - (now - held.startedAt) });
  if (held.job.timeoutMs !== null) limits.push({ limitMs: held.job.timeoutMs, leftMs: held.job.timeoutMs - (now - held.claimedAt) });
  if (limits.length === 0) return undefined;
  const { limitMs, leftMs } = limits.reduce((a, b) => (b.leftMs < a.leftMs ? b : a));
  let timer: ReturnType<typeof setTimeout> | undefined;
  const state: { expired: Promise<never>; fired: TimeoutError | undefined; clear(): void } = {
    fired: undefined,
    expired: new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => {
        const error = new TimeoutError(held.job.id, held.job.task, held.job.attempt, limitMs);
        state.fired = error;
        abortAttempt(held, error);
        reject(error);
      }, Math.max(0, leftMs));
    }),
    clear: () => clearTimeout(timer),
  };
  state.expired.catch(() => undefined); // raced, or unused by a transactional attempt
  return state;
}
