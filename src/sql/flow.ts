// Flow control: a queue's or a task's limits and pause (set_limit,
// clear_limit, pause, resume) and their reading with current use (limits()).
// claim() obeys them; nothing here runs at claim time.

import type { Duration } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import type { RateLimitScope } from "../errors.ts";
import { integer, interval, leaseToken, text, toJobId, type JobIdInput } from "../encode.ts";
import { call, fromNow, INTERVAL_AS_TEXT, scalar, type Queryable } from "./call.ts";

/** One queue or one task (exactly one: SQL refuses both or neither with 22023). */
export interface LimitScope {
  queue?: string | undefined;
  task?: string | undefined;
}

export interface LimitSettings {
  /** At most this many jobs of the scope processing at once (1..10000). */
  concurrency?: number | undefined;
  /** At most `rate` starts (claims, retries included) per `per` (at least a second); give both. */
  rate?: number | undefined;
  per?: Duration | undefined;
  /** K of the concurrency keys (enqueue's concurrencyKey): at most this many jobs of one key admitted at once (default 1). */
  perKey?: number | undefined;
}

/** Sets a queue's or a task's limits (set_limit); fields left undefined keep their value. */
export async function setLimit(db: Queryable, opts: LimitScope & LimitSettings): Promise<void> {
  await call(db, "set_limit", {
    queue: text(opts.queue, "queue"),
    task: text(opts.task, "task"),
    concurrency: integer(opts.concurrency, "concurrency"),
    rate: integer(opts.rate, "rate"),
    per: interval(opts.per),
    per_key: integer(opts.perKey, "perKey"),
  });
}

/** Removes a queue's or a task's limits (clear_limit); a pause stays. True when it had one. */
export function clearLimit(db: Queryable, opts: LimitScope): Promise<boolean> {
  return scalar(db, "clear_limit", { queue: text(opts.queue, "queue"), task: text(opts.task, "task") });
}

/** Pauses a queue or a task: claims hand out none of its jobs until resume. True when it was not paused. */
export function pause(db: Queryable, opts: LimitScope): Promise<boolean> {
  return scalar(db, "pause", { queue: text(opts.queue, "queue"), task: text(opts.task, "task") });
}

/** Ends a pause. True when the scope was paused. */
export function resume(db: Queryable, opts: LimitScope): Promise<boolean> {
  return scalar(db, "resume", { queue: text(opts.queue, "queue"), task: text(opts.task, "task") });
}

/**
 * Back-pressure (hold()): snoozes the held job for `delay` without spending
 * an attempt and holds back its queue, task or concurrency key from every
 * claim until then (22023 for scope "key" on a job without a key),
 * timed by the database's clock. Returns the scope's held_until (the later
 * of an earlier hold and this one). IQ410 when the attempt no longer holds
 * the job.
 */
export function hold(
  db: Queryable,
  jobId: JobIdInput,
  attempt: number,
  token: string | null,
  scope: RateLimitScope,
  delay: Duration,
): Promise<Date> {
  return scalar(db, "hold", {
    job_id: toJobId(jobId),
    attempt: integer(attempt, "attempt"),
    scope,
    until: fromNow(toPgInterval(delay)),
    lease_token: leaseToken(token),
  });
}

export interface LimitRow {
  queue: string | null;
  task: string | null;
  concurrency: number | null;
  rate: number | null;
  /** The period of `rate`, as PostgreSQL prints an interval (e.g. "00:01:00"). */
  per: string | null;
  perKey: number | null;
  paused: boolean;
  /** When a hold (hold(): a 429's Retry-After) still to come ends; null when not held. */
  heldUntil: Date | null;
  /** Slots held now (jobs processing under the concurrency limit); null without one. */
  running: number | null;
  /** Starts within the last `per`; null without a rate limit. */
  started: number | null;
  updatedAt: Date;
}

/** Every queue and task with a limit, a pause or a hold, and its use now (limits()). */
export async function limits(db: Queryable): Promise<LimitRow[]> {
  const rows = await call<
    "limits",
    {
      queue: string | null;
      task: string | null;
      concurrency: number | null;
      rate: number | null;
      per: string | null;
      per_key: number | null;
      paused: boolean;
      held_until: Date | null;
      running: number | null;
      started: number | null;
      updated_at: Date;
    }
  >(db, "limits", {}, "", INTERVAL_AS_TEXT);
  return rows.map((r) => ({
    queue: r.queue,
    task: r.task,
    concurrency: r.concurrency,
    rate: r.rate,
    per: r.per,
    perKey: r.per_key,
    paused: r.paused,
    heldUntil: r.held_until,
    running: r.running,
    started: r.started,
    updatedAt: r.updated_at,
  }));
}

/** A concurrency key held back now (hold(..., scope => 'key')), and until when. */
export interface HeldKeyRow {
  concurrencyKey: string;
  heldUntil: Date;
}

/** The concurrency keys held back now, by the end of their hold (held_keys()). */
export async function heldKeys(db: Queryable): Promise<HeldKeyRow[]> {
  const rows = await call<"held_keys", { concurrency_key: string; held_until: Date }>(db, "held_keys", {});
  return rows.map((r) => ({ concurrencyKey: r.concurrency_key, heldUntil: r.held_until }));
}

export interface DeclaredLimit {
  /** The task's limits stored after the call (null: not set). */
  concurrency: number | null;
  rate: number | null;
  per: string | null;
  /** True when the call wrote (the declared limit was lower, or none was stored). */
  applied: boolean;
}

/**
 * A worker's declared limits of one task (declare_limit): each is set when
 * none is stored or the stored one is higher, never raised; the worker role may call it.
 */
export async function declareLimit(
  db: Queryable,
  opts: { task: string; concurrency?: number | undefined; rate?: number | undefined; per?: Duration | undefined },
): Promise<DeclaredLimit> {
  const rows = await call<
    "declare_limit",
    { stored_concurrency: number | null; stored_rate: number | null; stored_per: string | null; applied: boolean }
  >(
    db,
    "declare_limit",
    {
      task: text(opts.task, "task"),
      concurrency: integer(opts.concurrency, "concurrency"),
      rate: integer(opts.rate, "rate"),
      per: interval(opts.per),
    },
    "",
    INTERVAL_AS_TEXT,
  );
  const r = rows[0]!;
  return { concurrency: r.stored_concurrency, rate: r.stored_rate, per: r.stored_per, applied: r.applied };
}
