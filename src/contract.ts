// The TypeScript side of the contract in docs/design.md: every name that mirrors
// SQL (states, policies, backoff kinds, error codes, the NOTIFY channel) is
// defined here once. Contract tests compare these lists with the catalog.
// SQL defaults (queue 'default', max_attempts 10, lease 30 s, key retention
// 14 days in prune_keys...) are NOT repeated here: the client leaves unset
// options out of its calls so each of them lives once, in SQL.

import { BadArgumentError } from "./errors.ts";

// ---------------------------------------------------------------- states

/** Every value of `idemq.job_state`, in the enum's declaration order. */
export const JOB_STATES = [
  "scheduled",
  "enqueued",
  "processing",
  "awaiting",
  "succeeded",
  "failed",
  "expired",
  "cancelled",
] as const;
export type JobState = (typeof JOB_STATES)[number];

export const ACTIVE_STATES = ["scheduled", "enqueued", "processing", "awaiting"] as const satisfies readonly JobState[];
export type ActiveState = (typeof ACTIVE_STATES)[number];

export const TERMINAL_STATES = ["succeeded", "failed", "expired", "cancelled"] as const satisfies readonly JobState[];
export type TerminalState = (typeof TERMINAL_STATES)[number];

export function isJobState(value: unknown): value is JobState {
  return (JOB_STATES as readonly unknown[]).includes(value);
}
export function isActiveState(state: JobState): state is ActiveState {
  return (ACTIVE_STATES as readonly JobState[]).includes(state);
}
export function isTerminalState(state: JobState): state is TerminalState {
  return (TERMINAL_STATES as readonly JobState[]).includes(state);
}

// ------------------------------------------------------ duplicate policies

/** Every value of `idemq.duplicate_policy`; the first is the SQL default. */
export const DUPLICATE_POLICIES = [
  "allow_after_failed",
  "reject_if_failed",
  "reject_always",
  "reject_if_succeeded",
] as const;
export type DuplicatePolicy = (typeof DUPLICATE_POLICIES)[number];

export function isDuplicatePolicy(value: unknown): value is DuplicatePolicy {
  return (DUPLICATE_POLICIES as readonly unknown[]).includes(value);
}

// ------------------------------------------------------ schedule policies

/** Every value of `idemq.schedule_overlap`: what a slot does while the schedule's latest job is active. The first is schedule()'s SQL default. */
export const SCHEDULE_OVERLAPS = ["skip", "allow", "queue_one"] as const;
export type ScheduleOverlap = (typeof SCHEDULE_OVERLAPS)[number];

/** Every value of `idemq.schedule_misfire`: what slots missed while tick() was not called do. The first is schedule()'s SQL default. */
export const SCHEDULE_MISFIRES = ["once", "skip", "all"] as const;
export type ScheduleMisfire = (typeof SCHEDULE_MISFIRES)[number];

export function isScheduleOverlap(value: unknown): value is ScheduleOverlap {
  return (SCHEDULE_OVERLAPS as readonly unknown[]).includes(value);
}
export function isScheduleMisfire(value: unknown): value is ScheduleMisfire {
  return (SCHEDULE_MISFIRES as readonly unknown[]).includes(value);
}

/**
 * schedule()'s non-NULL DEFAULTs, as its SQL signature declares them, for
 * help texts and docs only: the client leaves unset options out of the call,
 * so SQL applies its own. test/contract holds this equal to the signature.
 */
export const SCHEDULE_SQL_DEFAULTS = {
  timezone: "UTC",
  overlap: SCHEDULE_OVERLAPS[0],
  misfire: SCHEDULE_MISFIRES[0],
  misfireGrace: "1 minute",
} as const;

// ------------------------------------------------------ other vocabularies

/** Row outcomes of `enqueue_many`. */
export const ENQUEUE_OUTCOMES = ["created", "deduplicated", "rejected", "conflict"] as const;
export type EnqueueOutcome = (typeof ENQUEUE_OUTCOMES)[number];

/** `status` values of `effect_claim`. */
export const EFFECT_STATUSES = ["claimed", "reclaimed", "done", "busy"] as const;
export type EffectStatus = (typeof EFFECT_STATUSES)[number];

/** `metric` values of `stats()` besides the state names. */
export const STATS_EVENT_METRICS = [
  "deduplicated",
  "rejected",
  "conflict",
  "guard_duplicate",
  "lease_expired",
  "oldest_runnable_seconds",
] as const;
export type StatsMetric = JobState | (typeof STATS_EVENT_METRICS)[number];

/** NOTIFY channel on which a runnable job is announced (payload: queue name). */
export const NOTIFY_CHANNEL = "idemq_jobs";

// ------------------------------------------------------------ error codes

/** The SQLSTATEs idemq raises, with their meaning (docs/design.md, "Error codes"). */
export const ERROR_CODES = {
  IQ400: "bad argument",
  IQ404: "no such job",
  IQ409: "enqueue rejected by the duplicate policy",
  IQ410: "lease lost: this (job_id, attempt, lease_token) no longer holds the job, or an effect claim is not this owner's",
  IQ412: "the job's state does not allow this operation",
  IQ422: "idempotency key reused for different work while its job is active",
} as const;
export type IdemqErrorCode = keyof typeof ERROR_CODES;

/** PostgreSQL's own class of data exceptions, also treated as a bad argument. */
export const BAD_ARGUMENT_SQLSTATE_CLASS = "22";

// ------------------------------------------------- client-side defaults

/**
 * Defaults that exist only on the client side (timers, page sizes). Anything
 * SQL has a DEFAULT for is deliberately absent: e.g. a worker with no key
 * retention configured calls `prune_keys()` without `older_than`, so the
 * 14 days live only in SQL.
 */
export const CLIENT_DEFAULTS = {
  /** Rows returned by `Client.listJobs` when no limit is given. */
  listLimit: 100,
} as const;

// -------------------------------------------------------------- durations

/**
 * A duration: a number of milliseconds, or a string such as "250ms", "2s",
 * "5m", "1h", "2 days", "1h30m", "1 hour 30 minutes", or PostgreSQL's own interval
 * output ("00:00:30", "1 day 02:00:00").
 */
export type Duration = number | string;

interface UnitInfo {
  readonly pg: string;
  /** Milliseconds per unit; undefined for calendar units of varying length. */
  readonly ms: number | undefined;
}

const MS: UnitInfo = { pg: "millisecond", ms: 1 };
const US: UnitInfo = { pg: "microsecond", ms: 0.001 };
const SEC: UnitInfo = { pg: "second", ms: 1000 };
const MIN: UnitInfo = { pg: "minute", ms: 60_000 };
const HOUR: UnitInfo = { pg: "hour", ms: 3_600_000 };
const DAY: UnitInfo = { pg: "day", ms: 86_400_000 };
const WEEK: UnitInfo = { pg: "week", ms: 604_800_000 };
const MONTH: UnitInfo = { pg: "month", ms: undefined };
const YEAR: UnitInfo = { pg: "year", ms: undefined };

const UNITS: ReadonlyMap<string, UnitInfo> = new Map([
  ...["us", "usec", "usecs", "microsecond", "microseconds"].map((u) => [u, US] as const),
  ...["ms", "msec", "msecs", "millisecond", "milliseconds"].map((u) => [u, MS] as const),
  ...["s", "sec", "secs", "second", "seconds"].map((u) => [u, SEC] as const),
  ...["m", "min", "mins", "minute", "minutes"].map((u) => [u, MIN] as const),
  ...["h", "hr", "hrs", "hour", "hours"].map((u) => [u, HOUR] as const),
  ...["d", "day", "days"].map((u) => [u, DAY] as const),
  ...["w", "week", "weeks"].map((u) => [u, WEEK] as const),
  ...["mon", "mons", "month", "months"].map((u) => [u, MONTH] as const),
  ...["y", "yr", "yrs", "year", "years"].map((u) => [u, YEAR] as const),
]);

const DURATION_HINT =
  'Use a number of milliseconds or a string such as "250ms", "2s", "5m", "1h", "2 days" or "1h 30m".';

type DurationPart = { value: number; unit: UnitInfo } | { clock: string; ms: number };

// A quantity with a unit ("2s", "2 seconds", "1.5h") or a clock ("01:30:00").
const TOKEN = /(\d+(?:\.\d+)?)\s*([a-z]+)|(\d+):(\d{2})(?::(\d{2}(?:\.\d+)?))?/y;
const SEPARATOR = /[\s,]*/y;

function badDuration(duration: unknown, why: string): BadArgumentError {
  return new BadArgumentError(`invalid duration ${JSON.stringify(duration) ?? String(duration)}: ${why}`, {
    hint: DURATION_HINT,
  });
}

function parseDuration(duration: Duration): DurationPart[] {
  if (typeof duration === "number") {
    if (!Number.isFinite(duration) || duration < 0) {
      throw badDuration(duration, "a number of milliseconds must be finite and not negative");
    }
    return [{ value: duration, unit: MS }];
  }
  if (typeof duration !== "string") {
    throw badDuration(duration, `expected a string or a number, got ${typeof duration}`);
  }
  const text = duration.trim().toLowerCase();
  if (text === "") throw badDuration(duration, "it is empty");
  if (/^\d+(\.\d+)?$/.test(text)) {
    // PostgreSQL reads '500' as seconds, JavaScript habit says milliseconds.
    throw badDuration(duration, "a bare number in a string is ambiguous; add a unit or pass a number of milliseconds");
  }
  const parts: DurationPart[] = [];
  let pos = 0;
  while (pos < text.length) {
    TOKEN.lastIndex = pos;
    const m = TOKEN.exec(text);
    if (m === null) throw badDuration(duration, `cannot read "${text.slice(pos)}"`);
    if (m[1] !== undefined && m[2] !== undefined) {
      const unit = UNITS.get(m[2]);
      if (unit === undefined) throw badDuration(duration, `unknown unit "${m[2]}"`);
      parts.push({ value: Number(m[1]), unit });
    } else {
      const [h, min, s] = [Number(m[3]), Number(m[4]), Number(m[5] ?? 0)];
      if (min >= 60 || s >= 60) throw badDuration(duration, `"${m[0]}" is not a valid hh:mm[:ss] time`);
      parts.push({ clock: m[0], ms: ((h * 60 + min) * 60 + s) * 1000 });
    }
    // Quantities may be glued together, Go style ("1h30m").
    SEPARATOR.lastIndex = TOKEN.lastIndex;
    SEPARATOR.exec(text);
    pos = SEPARATOR.lastIndex;
  }
  return parts;
}

/**
 * Converts a duration to a PostgreSQL interval literal ("2s" -> "2 seconds",
 * 250 -> "250 milliseconds"). Throws a BadArgumentError for anything else.
 */
export function toPgInterval(duration: Duration): string {
  return parseDuration(duration)
    .map((p) => ("clock" in p ? p.clock : `${p.value} ${p.unit.pg}${p.value === 1 ? "" : "s"}`))
    .join(" ");
}

/**
 * Converts a duration to milliseconds, for client-side timers. Months and
 * years have no fixed length and are refused here (SQL accepts them).
 */
export function toMilliseconds(duration: Duration): number {
  let total = 0;
  for (const p of parseDuration(duration)) {
    if ("clock" in p) {
      total += p.ms;
    } else if (p.unit.ms === undefined) {
      throw badDuration(duration, `a ${p.unit.pg} has no fixed length in milliseconds`);
    } else {
      total += p.value * p.unit.ms;
    }
  }
  return total;
}

// ---------------------------------------------------------------- backoff

export const BACKOFF_KINDS = ["polynomial", "exponential", "fixed"] as const;
export type BackoffKind = (typeof BACKOFF_KINDS)[number];

/** The fields each backoff kind takes (_backoff_problem's lists; test/contract/contract.test.ts holds them equal). */
export const BACKOFF_FIELDS = {
  polynomial: ["kind"],
  exponential: ["kind", "initial", "factor", "max", "jitter"],
  fixed: ["kind", "delays"],
} as const satisfies Record<BackoffKind, readonly string[]>;

/** The retry schedule of a job (`backoff` jsonb); leave it out for the SQL default. */
export type Backoff =
  | { kind: "polynomial" }
  | { kind: "exponential"; initial: Duration; factor?: number; max?: Duration; jitter?: number }
  | { kind: "fixed"; delays: readonly [Duration, ...Duration[]] | readonly Duration[] };

/** The jsonb form of a backoff, as `idemq.enqueue(backoff => ...)` takes it. */
export type BackoffJson =
  | { kind: "polynomial" }
  | { kind: "exponential"; initial: string; factor?: number; max?: string; jitter?: number }
  | { kind: "fixed"; delays: string[] };

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
