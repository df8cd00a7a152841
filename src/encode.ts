// Client-side checks and encodings of call arguments. The SQL functions are
// the real boundary; these catch the obvious mistakes with a clearer message
// and turn TypeScript values into what the parameters expect.

import {
  BACKOFF_KINDS,
  DUPLICATE_POLICIES,
  JOB_STATES,
  isDuplicatePolicy,
  isJobState,
  type Backoff,
  type BackoffJson,
  type Duration,
  type DuplicatePolicy,
  type JobState,
} from "./contract.ts";
import { toPgInterval } from "./duration.ts";
import { BadArgumentError } from "./errors.ts";

/** A job id as callers may hold it; idemq always returns ids as exact strings. */
export type JobIdInput = string | bigint | number;
/** An instant: a Date or a timestamptz literal (ISO 8601). */
export type Instant = Date | string;

export function bad(message: string, hint?: string): BadArgumentError {
  return new BadArgumentError(message, { hint });
}

export function toJobId(id: JobIdInput, what = "job id"): string {
  if (typeof id === "bigint") return id.toString();
  if (typeof id === "number" && Number.isSafeInteger(id)) return String(id);
  if (typeof id === "string" && /^-?\d+$/.test(id.trim())) return id.trim();
  throw bad(`${what} must be an integer (a string, a bigint or a safe integer), got ${String(id)}`);
}

/** A lease token as SQL takes it: claim()'s uuid text, or null (an attempt claimed before 0.2.0). */
export function leaseToken(token: string | null): string | null {
  if (token !== null && typeof token !== "string") throw bad("leaseToken must be the lease_token claim() returned (a uuid string) or null");
  return token;
}

export function optionalJobIds(ids: readonly JobIdInput[] | undefined, what: string): string[] | undefined {
  if (ids === undefined) return undefined;
  if (!Array.isArray(ids)) throw bad(`${what} must be an array of job ids`);
  return ids.map((id) => toJobId(id, what));
}

export function integer(value: number | undefined, what: string): number | undefined {
  if (value === undefined) return undefined;
  if (!Number.isInteger(value)) throw bad(`${what} must be an integer, got ${String(value)}`);
  return value;
}

export function text(value: string | undefined, what: string): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "string") throw bad(`${what} must be a string, got ${typeof value}`);
  return value;
}

export function requiredText(value: string, what: string): string {
  if (typeof value !== "string" || value.trim() === "") throw bad(`${what} must be a non-empty string`);
  return value;
}

export function instant(value: Instant | undefined, what: string): Date | string | undefined {
  if (value === undefined) return undefined;
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) throw bad(`${what} is an invalid Date`);
    return value;
  }
  if (typeof value !== "string") throw bad(`${what} must be a Date or a timestamp string`);
  return value;
}

export function interval(value: Duration | undefined): string | undefined {
  return value === undefined ? undefined : toPgInterval(value);
}

export function policy(value: DuplicatePolicy | undefined): DuplicatePolicy | undefined {
  if (value === undefined || isDuplicatePolicy(value)) return value;
  throw bad(`unknown duplicate policy ${JSON.stringify(value)}`, `use one of ${DUPLICATE_POLICIES.join(", ")}`);
}

/** A value of a SQL enum the contract lists (`values`), or undefined; anything else is refused naming the values. */
export function oneOf<V extends string>(value: V | undefined, values: readonly V[], what: string): V | undefined {
  if (value === undefined || values.includes(value)) return value;
  throw bad(`${what} must be one of ${values.join(", ")}, not ${JSON.stringify(value)}`);
}

export function states(value: readonly JobState[] | undefined): JobState[] | undefined {
  if (value === undefined) return undefined;
  if (!Array.isArray(value)) throw bad("states must be an array of job states");
  for (const s of value) {
    if (!isJobState(s)) throw bad(`unknown job state ${JSON.stringify(s)}`, `use one of ${JOB_STATES.join(", ")}`);
  }
  return [...value];
}

/**
 * JSON text for a jsonb parameter: pg would send a JS array as a SQL array
 * and a JS string as plain text. undefined stays undefined (left out), null
 * is SQL NULL.
 */
export function jsonb(value: unknown, what: string): string | null | undefined {
  if (value === undefined || value === null) return value;
  let out: string | undefined;
  try {
    out = JSON.stringify(value);
  } catch (err) {
    throw new BadArgumentError(`${what} is not JSON-serializable: ${(err as Error).message}`, {}, { cause: err });
  }
  if (out === undefined) throw bad(`${what} is not JSON-serializable (${typeof value})`);
  return out;
}

/**
 * Validates the obvious and converts durations to interval strings. Fields
 * left undefined stay out, so SQL applies its own defaults (factor, jitter).
 */
export function toBackoffJson(backoff: Backoff): BackoffJson {
  if (backoff === null || typeof backoff !== "object") {
    throw new BadArgumentError("backoff must be an object such as { kind: \"polynomial\" }", {
      hint: `kind is one of ${BACKOFF_KINDS.join(", ")}`,
    });
  }
  switch (backoff.kind) {
    case "polynomial":
      return { kind: "polynomial" };
    case "exponential": {
      if (backoff.initial === undefined) {
        throw new BadArgumentError("exponential backoff needs an initial delay", {
          hint: '{ kind: "exponential", initial: "2s", factor: 2, max: "1h", jitter: 0.1 }',
        });
      }
      const out: BackoffJson = { kind: "exponential", initial: toPgInterval(backoff.initial) };
      if (backoff.factor !== undefined) out.factor = finiteNumber("backoff factor", backoff.factor);
      if (backoff.max !== undefined) out.max = toPgInterval(backoff.max);
      if (backoff.jitter !== undefined) out.jitter = finiteNumber("backoff jitter", backoff.jitter);
      return out;
    }
    case "fixed": {
      if (!Array.isArray(backoff.delays) || backoff.delays.length === 0) {
        throw new BadArgumentError("fixed backoff needs at least one delay", {
          hint: '{ kind: "fixed", delays: ["2s", "5s", "10s"] } (the last delay repeats)',
        });
      }
      return { kind: "fixed", delays: backoff.delays.map(toPgInterval) };
    }
    default:
      throw new BadArgumentError(`unknown backoff kind ${JSON.stringify((backoff as { kind?: unknown }).kind)}`, {
        hint: `kind is one of ${BACKOFF_KINDS.join(", ")}`,
      });
  }
}

function finiteNumber(what: string, value: number): number {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new BadArgumentError(`${what} must be a finite number, got ${String(value)}`);
  }
  return value;
}
