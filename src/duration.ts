// Durations as callers write them ("2s", "1h30m", 250, "00:00:30"), read
// once: to a PostgreSQL interval for SQL, which does the arithmetic on its own
// clock, or to milliseconds for the client's own timers. The Duration type is
// the contract's (contract.ts); the reading of it lives here, because it
// needs the error classes and contract.ts imports nothing.

import type { Duration } from "./contract.ts";
import { BadArgumentError } from "./errors.ts";

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
