// Checks a task's backoff when the worker is configured (createWorker,
// defineTasks): synchronously, without a database, so a mistake fails at
// start-up with the task's name rather than at its first failure. No delay is
// computed here: fail() applies the backoff in SQL (_backoff_delay) and
// returns the run_at it chose. The rules mirror
// sql/functions/attempts/_backoff_problem.sql: test/worker/backoff.test.ts holds the
// two equal case by case, and test/contract/contract.test.ts the fields of each kind.
import { BACKOFF_FIELDS, BACKOFF_KINDS, type Backoff } from "../contract.ts";
import { toMilliseconds } from "../duration.ts";
import { toBackoffJson } from "../encode.ts";
import { BadArgumentError } from "../errors.ts";

/** Throws a BadArgumentError, its message starting with `what`, unless _backoff_problem would accept the backoff. */
export function checkBackoff(backoff: Backoff, what: string): void {
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
  const allowed: readonly string[] = BACKOFF_FIELDS[backoff.kind] ?? [];
  const extra = Object.keys(backoff).find((k) => !allowed.includes(k));
  if (extra !== undefined) {
    throw new BadArgumentError(`${what}: backoff kind "${backoff.kind}" has no field "${extra}"`, {
      hint: `fields: ${allowed.join(", ")}`,
    });
  }
  switch (backoff.kind) {
    case "polynomial":
      return;
    case "exponential": {
      const factor = backoff.factor ?? 2;
      const jitter = backoff.jitter ?? 0;
      if (ms(backoff.initial, "initial") <= 0) throw new BadArgumentError(`${what}: exponential backoff "initial" must be positive`);
      if (!(factor >= 1)) throw new BadArgumentError(`${what}: exponential backoff "factor" must be a number >= 1`);
      if (!(jitter >= 0 && jitter < 1)) {
        throw new BadArgumentError(`${what}: exponential backoff "jitter" must be a number in [0, 1)`);
      }
      if (backoff.max !== undefined && ms(backoff.max, "max") <= 0) {
        throw new BadArgumentError(`${what}: exponential backoff "max" must be positive`);
      }
      return;
    }
    case "fixed":
      backoff.delays.forEach((d, i) => ms(d, `delays[${i}]`));
      return;
    default:
      throw new BadArgumentError(`${what}: backoff kind must be one of ${BACKOFF_KINDS.join(", ")}`);
  }
}
