// Human-readable output shared by the CLI commands: aligned tables, times and
// ages, a job's summary, and the timeline of its attempts.
import type { WaitingReason } from "../contract.ts";
import { attemptsText, stepPhrase, waitingFor, waitingSentence, type Job } from "../job-reads.ts";
import type { ChildOutcome, StepRow } from "../sql/index.ts";
import { printable } from "./terminal-text.ts";

/** Columns separated by two spaces; numeric columns right-aligned. Cells are shown printable() (no control characters reach the terminal). */
export function table(headers: readonly string[], cellRows: readonly (readonly string[])[], numeric: readonly number[] = []): string[] {
  const rows = cellRows.map((row) => row.map(printable));
  const widths = headers.map((header, i) => Math.max(header.length, ...rows.map((row) => (row[i] ?? "").length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((cell, i) => (numeric.includes(i) ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd();
  return [line(headers), ...rows.map(line)];
}

/** 2026-11-29T10:15:03Z (UTC, whole seconds). */
export function instant(date: Date | string | null | undefined): string {
  if (date === null || date === undefined) return "-";
  const d = typeof date === "string" ? new Date(date) : date;
  if (Number.isNaN(d.getTime())) return String(date);
  return d.toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** 45s, 3m 20s, 2h 5m, 3d 4h. */
export function age(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 === 0 ? `${m}m` : `${m}m ${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return m % 60 === 0 ? `${h}h` : `${h}h ${m % 60}m`;
  const d = Math.floor(h / 24);
  return h % 24 === 0 ? `${d}d` : `${d}d ${h % 24}h`;
}

/** "in 5m" or "3m ago", relative to now. */
export function relative(date: Date | null | undefined, now = Date.now()): string {
  if (date === null || date === undefined) return "-";
  const delta = date.getTime() - now;
  return delta > 0 ? `in ${age(delta)}` : `${age(-delta)} ago`;
}

/** `text` made printable(), then cut to `max` characters. */
function truncate(text: string, max: number): string {
  const shown = printable(text);
  return shown.length <= max ? shown : `${shown.slice(0, max - 1)}…`;
}

// ---------------------------------------------------------------- jobs

/** The job row for `idemq jobs`. */
export const JOB_COLUMNS = ["ID", "STATE", "WAITING FOR", "QUEUE", "TASK", "ATTEMPT", "RUN AT", "KEY", "CREATED"] as const;

/** The WAITING FOR column's word for each of job()'s waiting_for values. */
const WAITING_WORDS: Record<WaitingReason, string> = {
  parents: "parents",
  concurrency_key: "key",
  children: "children",
  paused: "paused",
  held: "held",
  concurrency: "concurrency",
  rate: "rate",
};

/** The WAITING FOR cell: job()'s reason, "worker" for a runnable job nothing holds back, else "-". */
export function waitingWord(job: Job, now = Date.now()): string {
  const waiting = waitingFor(job, now);
  return waiting === null ? "-" : waiting === "worker" ? "worker" : (WAITING_WORDS[waiting] ?? waiting);
}

/** A table row of `idemq jobs`; ATTEMPT is the counted attempts of their limit (Job.countedAttempts, Job.attemptLimit). */
export function jobRow(job: Job, now = Date.now()): string[] {
  const runAt =
    job.state === "scheduled" || job.state === "enqueued" || job.state === "awaiting"
      ? relative(job.runAt, now)
      : job.state === "processing"
        ? `lease ${relative(job.leaseExpiresAt, now)}`
        : `done ${relative(job.finishedAt, now)}`;
  return [
    job.id,
    job.state,
    waitingWord(job, now),
    truncate(job.queue, 24),
    truncate(job.task, 32),
    `${job.countedAttempts}/${job.attemptLimit}`,
    runAt,
    truncate(job.idempotencyKey ?? "-", 32),
    relative(job.createdAt, now),
  ];
}

/** One line about a job, e.g. for an enqueue's answer. */
export function jobLine(job: Job): string {
  const key = job.idempotencyKey === null ? "" : `, key ${printable(job.idempotencyKey)}`;
  return `job ${job.id} (${printable(job.task)}, queue ${printable(job.queue)}${key}): ${job.state}, attempt ${job.countedAttempts}/${job.attemptLimit}`;
}

// ------------------------------------------------------------- timeline

/** An operator's retry, from the entry retry() records (class "Retried"). */
export interface RetryEntry {
  /** The last attempt before the retry. */
  afterAttempt: number;
  /** failed, cancelled or expired: how that run had ended. */
  previousState: string | null;
  /** When that run had ended. */
  finishedAt: string | null;
  retriedAt: string | null;
}

export interface AttemptEntry {
  attempt: number;
  /** When a worker claimed it (null when nothing recorded it). */
  claimedAt: string | null;
  worker: string | null;
  /** failed, lease_expired, cancelled, running, succeeded, snoozed, or unrecorded. */
  outcome: string;
  endedAt: string | null;
  error: { class: string | null; message: string | null } | null;
}

interface ErrorEntry {
  attempt?: unknown;
  started_at?: unknown;
  failed_at?: unknown;
  worker?: unknown;
  class?: unknown;
  message?: unknown;
  stack?: unknown;
  previous_state?: unknown;
  finished_at?: unknown;
  retried_at?: unknown;
}

/** The class of the entry retry() records: an operator's action, not an attempt's end. */
const RETRIED = "Retried";

const str = (value: unknown): string | null => (typeof value === "string" ? value : value == null ? null : String(value));
const iso = (date: Date | null): string | null => (date === null ? null : date.toISOString());
/** A timestamp from the errors JSON ("2026-11-29T11:53:26.114419+00:00") in the ISO form Job dates have. */
const isoText = (value: unknown): string | null => {
  const text = str(value);
  if (text === null) return null;
  const date = new Date(text);
  return Number.isNaN(date.getTime()) ? text : date.toISOString();
};

/**
 * Every attempt the job had, from its errors array (one entry per failed,
 * lost or cancelled attempt) and its current row (the attempt that is
 * running, succeeded, or was snoozed). Attempt numbers with no record were
 * snoozed (a snooze records nothing).
 */
export function timeline(job: Job): AttemptEntry[] {
  const byAttempt = new Map<number, AttemptEntry>();
  for (const raw of job.errors as ErrorEntry[]) {
    const attempt = Number(raw?.attempt);
    if (!Number.isInteger(attempt)) continue;
    const errorClass = str(raw.class);
    if (errorClass === RETRIED) continue;
    byAttempt.set(attempt, {
      attempt,
      claimedAt: isoText(raw.started_at),
      worker: str(raw.worker),
      outcome: errorClass === "LeaseExpired" ? "lease_expired" : errorClass === "Cancelled" ? "cancelled" : "failed",
      endedAt: isoText(raw.failed_at),
      error: { class: errorClass, message: str(raw.message) },
    });
  }
  const entries: AttemptEntry[] = [];
  for (let attempt = 1; attempt <= job.attempt; attempt++) {
    const recorded = byAttempt.get(attempt);
    if (recorded !== undefined) {
      entries.push(recorded);
      continue;
    }
    const current = attempt === job.attempt;
    if (!current) {
      entries.push({ attempt, claimedAt: null, worker: null, outcome: "snoozed", endedAt: null, error: null });
      continue;
    }
    const claimedAt = iso(job.lockedAt);
    switch (job.state) {
      case "processing":
        entries.push({ attempt, claimedAt, worker: job.lockedBy, outcome: "running", endedAt: null, error: null });
        break;
      case "succeeded":
        entries.push({ attempt, claimedAt, worker: null, outcome: "succeeded", endedAt: iso(job.finishedAt), error: null });
        break;
      case "scheduled":
      case "enqueued":
        entries.push({ attempt, claimedAt, worker: null, outcome: "snoozed", endedAt: null, error: null });
        break;
      default:
        entries.push({ attempt, claimedAt, worker: null, outcome: "unrecorded", endedAt: null, error: null });
    }
  }
  return entries;
}

/** The operator's retries the error history records, oldest first. */
export function retries(job: Job): RetryEntry[] {
  return (job.errors as ErrorEntry[])
    .filter((raw) => str(raw?.class) === RETRIED && Number.isInteger(Number(raw.attempt)))
    .map((raw) => ({
      afterAttempt: Number(raw.attempt),
      previousState: str(raw.previous_state),
      finishedAt: isoText(raw.finished_at),
      retriedAt: isoText(raw.retried_at),
    }));
}

/** Each attempt's recorded stack trace, by attempt number. */
function stacks(job: Job): Map<number, string> {
  const byAttempt = new Map<number, string>();
  for (const raw of job.errors as ErrorEntry[]) {
    const stack = str(raw?.stack);
    if (stack !== null && str(raw.class) !== RETRIED) byAttempt.set(Number(raw.attempt), stack);
  }
  return byAttempt;
}

const OUTCOME_WORDS: Record<string, string> = {
  failed: "failed",
  lease_expired: "lost its lease",
  cancelled: "cancelled while running",
  running: "running",
  succeeded: "succeeded",
  snoozed: "snoozed (no error recorded)",
  unrecorded: "ended without a record",
};

export interface RenderJobOptions {
  retries: readonly RetryEntry[];
  /** Print each failed attempt's stack trace under it. */
  stack?: boolean;
  now?: number;
}

export function renderJob(job: Job, attempts: readonly AttemptEntry[], options: RenderJobOptions): string[] {
  const now = options.now ?? Date.now();
  const stackOf = options.stack ? stacks(job) : new Map<number, string>();
  const lines = [
    `job ${job.id}  ${printable(job.task)}  (queue ${printable(job.queue)})`,
    `  state      ${job.state}${job.finishedAt ? ` since ${instant(job.finishedAt)}` : ""}`,
    `  attempts   ${attemptsText(job)}`,
    `  key        ${printable(job.idempotencyKey ?? "-")}`,
    ...(job.concurrencyKey === null ? [] : [`  conc. key  ${printable(job.concurrencyKey)}`]),
    ...(waitingFor(job, now) === null ? [] : [`  waiting    for ${waitingSentence(job, now)}`]),
    ...(job.progress === null ? [] : [`  progress   ${job.progress} %${job.state === "processing" ? "" : " (as the latest attempt last reported it)"}`]),
    `  priority   ${job.priority}`,
    `  run at     ${instant(job.runAt)}${job.runAt ? ` (${relative(job.runAt, now)})` : ""}`,
  ];
  if (job.state === "processing") {
    lines.push(`  lease      ${printable(job.lockedBy ?? "?")} until ${instant(job.leaseExpiresAt)} (${relative(job.leaseExpiresAt, now)})`);
  }
  lines.push(
    `  created    ${instant(job.createdAt)}`,
    `  expires    ${instant(job.expiresAt)}`,
    `  payload    ${truncate(JSON.stringify(job.payload), 200)}`,
    `  result     ${job.result === null || job.result === undefined ? "-" : truncate(JSON.stringify(job.result), 200)}`,
    "timeline",
    `  ${instant(job.createdAt)}  enqueued`,
  );
  // How each run an operator retried had ended (a cancel included), and the retry.
  const retryLines = (afterAttempt: number): void => {
    for (const retry of options.retries.filter((r) => r.afterAttempt === afterAttempt)) {
      if (retry.finishedAt !== null) lines.push(`  ${instant(retry.finishedAt)}  ${printable(retry.previousState ?? "finished")}`);
      lines.push(`  ${instant(retry.retriedAt)}  retried by an operator (fresh attempts)`);
    }
  };
  retryLines(0); // a job cancelled before it ever ran, then retried
  for (const entry of attempts) {
    const claimed = entry.claimedAt === null ? "" : `claimed ${instant(entry.claimedAt)}`;
    const by = entry.worker === null ? "" : ` by ${printable(entry.worker)}`;
    const took =
      entry.claimedAt !== null && entry.endedAt !== null
        ? ` after ${age(new Date(entry.endedAt).getTime() - new Date(entry.claimedAt).getTime())}`
        : "";
    const error =
      entry.error === null ? "" : `: ${truncate(entry.error.class ?? "Error", 80)}: ${truncate((entry.error.message ?? "").replace(/\s+/g, " "), 160)}`;
    const head = `  #${entry.attempt}`;
    lines.push(`${head}  ${[claimed + by, `${OUTCOME_WORDS[entry.outcome] ?? entry.outcome}${took}${error}`].filter((part) => part !== "").join(", ")}`);
    const stack = stackOf.get(entry.attempt);
    // Each line of the trace escaped on its own (printable), indented under its attempt.
    if (stack !== undefined) for (const line of stack.split(/\r?\n/)) if (line.trim() !== "") lines.push(`      ${printable(line.trimEnd())}`);
    retryLines(entry.attempt);
  }
  if (job.finishedAt !== null) lines.push(`  ${instant(job.finishedAt)}  ${job.state}`);
  return lines;
}

// ---------------------------------------------------------------- steps and children

/** stepPhrase() for `jobs show`: the event as "event NAME key KEY", an instant with its distance from now. */
function stepDetail(step: StepRow, now: number): string {
  return stepPhrase(step)
    .map((part) =>
      typeof part === "string" ? part
      : "at" in part ? `${instant(part.at)} (${relative(part.at, now)})`
      : part.event === null ? ""
      : `event ${printable(part.event)}${part.key === null ? "" : ` key ${printable(part.key)}`}`,
    )
    .join("");
}

/**
 * The lines `jobs show` prints after the timeline: the job's step ledger
 * (when recorded, kind, name, status, a result excerpt) and its spawned
 * children (name, id, state, result or error excerpt). Nothing for a job
 * with neither; one line for a list the login's role may not read (null).
 */
export function renderStepsAndChildren(steps: readonly StepRow[] | null, children: readonly ChildOutcome[] | null, now = Date.now()): string[] {
  const lines: string[] = [];
  if (steps === null) lines.push("steps", "  (not shown: reading a job's steps needs the worker or admin role)");
  else if (steps.length > 0) {
    lines.push("steps");
    for (const step of steps) {
      const result = step.result === null || step.result === undefined ? "" : `  ${truncate(JSON.stringify(step.result), 80)}`;
      lines.push(
        `  ${instant(step.recordedAt)}  ${step.kind.padEnd(5)}  ${printable(step.name)}: ${stepDetail(step, now)} (attempt ${step.attempt})${result}`,
      );
    }
  }
  if (children === null) lines.push("children", "  (not shown: this role may not read a job's children)");
  else if (children.length > 0) {
    lines.push("children");
    for (const child of children) {
      const error = child.lastError as { class?: unknown; message?: unknown } | null;
      const outcome =
        error !== null
          ? `: ${truncate(String(error.class ?? "Error"), 40)}: ${truncate(String(error.message ?? "").replace(/\s+/g, " "), 80)}`
          : child.result === null || child.result === undefined
            ? ""
            : `  ${truncate(JSON.stringify(child.result), 80)}`;
      lines.push(`  ${printable(child.name)}  job ${child.jobId}  ${child.state}${outcome}`);
    }
  }
  return lines;
}
