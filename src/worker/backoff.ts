// A task's own retry schedule, computed by the worker, which then passes
// retry_at to fail(). Mirrors sql/functions/_backoff_delay.sql formula for
// formula (test/worker-backoff.test.ts compares the two), and accepts what
// _backoff_problem.sql accepts.
import { BACKOFF_KINDS, toBackoffJson, toMilliseconds, type Backoff } from "../contract.ts";
import { BadArgumentError } from "../errors.ts";

/** A validated backoff with its durations in milliseconds. */
export type BackoffSchedule =
  | { kind: "polynomial" }
  | { kind: "exponential"; initialMs: number; factor: number; maxMs: number | undefined; jitter: number }
  | { kind: "fixed"; delaysMs: number[] };

/** _backoff_delay caps an exponential delay without a max at 1e9 seconds. */
const EXPONENTIAL_CAP_SECONDS = 1e9;

/** Validates a task's backoff (as _backoff_problem does) and converts its durations. */
export function toBackoffSchedule(backoff: Backoff, what: string): BackoffSchedule {
  try {
    toBackoffJson(backoff); // the shape checks the client makes for enqueue
  } catch (error) {
    throw new BadArgumentError(`${what}: ${(error as Error).message}`, { hint: (error as BadArgumentError).hint });
  }
  const ms = (duration: unknown, field: string): number => {
    try {
      return toMilliseconds(duration as string);
    } catch (error) {
      throw new BadArgumentError(`${what}: backoff ${field}: ${(error as Error).message}`);
    }
  };
  const extra = Object.keys(backoff).find((k) => !allowedFields(backoff.kind).includes(k));
  if (extra !== undefined) {
    throw new BadArgumentError(`${what}: backoff kind "${backoff.kind}" has no field "${extra}"`, {
      hint: `fields: ${allowedFields(backoff.kind).join(", ")}`,
    });
  }
  switch (backoff.kind) {
    case "polynomial":
      return { kind: "polynomial" };
    case "exponential": {
      const initialMs = ms(backoff.initial, "initial");
      const factor = backoff.factor ?? 2;
      const jitter = backoff.jitter ?? 0;
      const maxMs = backoff.max === undefined ? undefined : ms(backoff.max, "max");
      if (initialMs <= 0) throw new BadArgumentError(`${what}: exponential backoff "initial" must be positive`);
      if (!(factor >= 1)) throw new BadArgumentError(`${what}: exponential backoff "factor" must be a number >= 1`);
      if (!(jitter >= 0 && jitter < 1)) {
        throw new BadArgumentError(`${what}: exponential backoff "jitter" must be a number in [0, 1)`);
      }
      if (maxMs !== undefined && maxMs <= 0) {
        throw new BadArgumentError(`${what}: exponential backoff "max" must be positive`);
      }
      return { kind: "exponential", initialMs, factor, maxMs, jitter };
    }
    case "fixed":
      return { kind: "fixed", delaysMs: backoff.delays.map((d, i) => ms(d, `delays[${i}]`)) };
    default:
      throw new BadArgumentError(`${what}: backoff kind must be one of ${BACKOFF_KINDS.join(", ")}`);
  }
}

function allowedFields(kind: string): string[] {
  if (kind === "exponential") return ["kind", "initial", "factor", "max", "jitter"];
  if (kind === "fixed") return ["kind", "delays"];
  return ["kind"];
}

/**
 * Milliseconds to wait after attempt `failedAttempt` (1 for the first
 * failure) failed, as idemq._backoff_delay computes it.
 */
export function backoffDelayMs(schedule: BackoffSchedule, failedAttempt: number, random: () => number = Math.random): number {
  const a = failedAttempt;
  switch (schedule.kind) {
    case "polynomial":
      // (a-1)^4 + 15 + random(0..29)*a seconds
      return ((a - 1) ** 4 + 15 + Math.floor(random() * 30) * a) * 1000;
    case "exponential": {
      // In seconds as float8, capped, then scaled by a uniform factor in [1 - jitter, 1 + jitter].
      let seconds = Math.min(
        (schedule.initialMs / 1000) * schedule.factor ** (a - 1),
        schedule.maxMs === undefined ? EXPONENTIAL_CAP_SECONDS : schedule.maxMs / 1000,
      );
      if (schedule.jitter > 0) seconds *= 1 + schedule.jitter * (2 * random() - 1);
      return seconds * 1000;
    }
    case "fixed":
      // delays[a], the last delay repeating
      return schedule.delaysMs[Math.min(a, schedule.delaysMs.length) - 1]!;
  }
}
