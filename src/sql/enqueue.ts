// enqueue() and enqueue_many(): how jobs come in.

import { randomUUID } from "node:crypto";
import type { Backoff, Duration, DuplicatePolicy, EnqueueOutcome } from "../contract.ts";
import {
  bad,
  instant,
  integer,
  interval,
  jsonb,
  optionalJobIds,
  policy,
  requiredText,
  text,
  toBackoffJson,
  type Instant,
  type JobIdInput,
} from "../encode.ts";
import { call, fromNow, type Queryable } from "./call.ts";

export interface EnqueueOptions {
  queue?: string | undefined;
  /** When the job becomes runnable; exclusive with `delay`. */
  runAt?: Instant | undefined;
  /** Runnable after this long, measured by the database clock; exclusive with `runAt`. */
  delay?: Duration | undefined;
  /** Higher runs first. */
  priority?: number | undefined;
  maxAttempts?: number | undefined;
  idempotencyKey?: string | undefined;
  duplicatePolicy?: DuplicatePolicy | undefined;
  backoff?: Backoff | undefined;
  expiresAt?: Instant | undefined;
  /** Parent jobs: this job waits in `awaiting` until they finish. */
  after?: readonly JobIdInput[] | undefined;
  /**
   * With a key: how long the key stays held after its job finished (SQL default 14 days);
   * prune_keys never releases it sooner, whatever its own olderThan.
   */
  keyRetention?: Duration | undefined;
  /**
   * The W3C traceparent to store on the job (the worker's attempt spans
   * continue its trace). With tracing on (@opentelemetry/api installed, the
   * Client's default) the enqueue span's own is stored, a child of this one
   * when given, else of the active context; leave it out.
   */
  traceparent?: string | undefined;
  /**
   * Flow control: jobs with the same key run at most K at a time (K = 1 unless the
   * queue's or task's `perKey` limit says more), in the order they would otherwise be
   * claimed; a job beyond them waits in `awaiting` (job().waitingFor "concurrency_key").
   * Non-empty, at most key_bytes bytes. E.g. the customer id.
   */
  concurrencyKey?: string | undefined;
  /**
   * How long one attempt may run (e.g. "30s"): past it the worker aborts
   * ctx.signal with a TimeoutError and fails the attempt (retried by the
   * policy), and no lease is extended past it, so a SQL consumer's job is
   * rescued after it. The task's own `timeout` applies too: the shorter wins.
   */
  timeout?: Duration | undefined;
}

export interface EnqueueResult {
  jobId: string;
  deduplicated: boolean;
}

export async function enqueue(
  db: Queryable,
  task: string,
  payload?: unknown,
  opts: EnqueueOptions = {},
): Promise<EnqueueResult> {
  const { jobId, deduplicated } = await enqueueTraced(db, task, payload, opts);
  return { jobId, deduplicated };
}

/** enqueue(), with the trace context stored on the job returned (a duplicate's: the existing job's). */
export async function enqueueTraced(
  db: Queryable,
  task: string,
  payload?: unknown,
  opts: EnqueueOptions = {},
): Promise<EnqueueResult & { jobTraceparent: string | null }> {
  if (opts.runAt !== undefined && opts.delay !== undefined) throw bad("give either runAt or delay, not both");
  const delay = interval(opts.delay);
  const rows = await call<"enqueue", { job_id: string; deduplicated: boolean; job_traceparent: string | null }>(db, "enqueue", {
    task: requiredText(task, "task"),
    payload: jsonb(payload, "payload"),
    queue: text(opts.queue, "queue"),
    // The database clock, not this process's, so app/DB clock skew cannot shift the delay.
    run_at:
      delay === undefined
        ? instant(opts.runAt, "runAt")
        : fromNow(delay),
    priority: integer(opts.priority, "priority"),
    max_attempts: integer(opts.maxAttempts, "maxAttempts"),
    idempotency_key: text(opts.idempotencyKey, "idempotencyKey"),
    duplicate_policy: policy(opts.duplicatePolicy),
    backoff: opts.backoff === undefined ? undefined : JSON.stringify(toBackoffJson(opts.backoff)),
    expires_at: instant(opts.expiresAt, "expiresAt"),
    after: optionalJobIds(opts.after, "after"),
    key_retention: interval(opts.keyRetention),
    traceparent: text(opts.traceparent, "traceparent"),
    concurrency_key: text(opts.concurrencyKey, "concurrencyKey"),
    timeout: interval(opts.timeout),
  });
  const row = rows[0]!;
  return { jobId: row.job_id, deduplicated: row.deduplicated, jobTraceparent: row.job_traceparent };
}

/**
 * Payload type by task name, e.g. `{ credit: { orderId: number } }`. The
 * untyped default: any task name, any payload.
 */
export type PayloadMap = Record<string, unknown>;

/** `payload` as a job's field: optional only when the payload type admits undefined (as `unknown` does). */
export type PayloadField<P> = undefined extends P ? { payload?: P } : { payload: P };

/**
 * One job of a bulk enqueue. No `delay` here: `enqueue_many` takes run_at
 * only. With a payload map, a union over its tasks: each element's payload
 * is checked against its own task.
 */
export type EnqueueManyJob<Payloads extends object = PayloadMap> = {
  [K in keyof Payloads & string]: Omit<EnqueueOptions, "delay"> & { task: K } & PayloadField<Payloads[K]>;
}[keyof Payloads & string];

export interface EnqueueManyResult {
  /** Position of the job in the input array, as `enqueue_many` numbers it. */
  ordinal: number;
  /** The created or existing job; null when SQL reports none (e.g. a rejection). */
  jobId: string | null;
  outcome: EnqueueOutcome;
}

export async function enqueueMany(db: Queryable, jobs: readonly EnqueueManyJob[]): Promise<EnqueueManyResult[]> {
  const json = encodeJobs(jobs, "jobs");
  const rows = await call<"enqueue_many", { ordinal: number; job_id: string | null; outcome: EnqueueOutcome }>(
    db,
    "enqueue_many",
    { jobs: json },
    " ORDER BY r.ordinal",
  );
  return rows.map((r) => ({ ordinal: r.ordinal, jobId: r.job_id, outcome: r.outcome }));
}

/**
 * enqueue_many's jsonb array from `jobs` (each checked, `what[i]` naming
 * it); `extra(job, i)` adds fields of the caller's own (spawn's name).
 */
export function encodeJobs<J extends EnqueueManyJob>(
  jobs: readonly J[],
  what: string,
  extra?: (job: J, i: number) => Record<string, unknown>,
): string {
  if (!Array.isArray(jobs)) throw bad(`${what} must be an array`);
  // Ids go into the JSON as exact numbers (not strings, not rounded floats):
  // marked as strings for JSON.stringify, unquoted afterwards.
  const marker = `idemq-id-${randomUUID()}:`;
  const elements = jobs.map((job, i) => {
    const at = `${what}[${i}]`;
    if (job === null || typeof job !== "object") throw bad(`${at} must be an object`);
    if ("delay" in job) throw bad(`${at}.delay is not supported in bulk; give runAt`);
    const el: Record<string, unknown> = {
      ...extra?.(job, i),
      task: requiredText(job.task, `${at}.task`),
      payload: job.payload,
      queue: text(job.queue, `${at}.queue`),
      run_at: instant(job.runAt, `${at}.runAt`),
      priority: integer(job.priority, `${at}.priority`),
      max_attempts: integer(job.maxAttempts, `${at}.maxAttempts`),
      idempotency_key: text(job.idempotencyKey, `${at}.idempotencyKey`),
      duplicate_policy: policy(job.duplicatePolicy),
      backoff: job.backoff === undefined ? undefined : toBackoffJson(job.backoff),
      expires_at: instant(job.expiresAt, `${at}.expiresAt`),
      after: optionalJobIds(job.after, `${at}.after`)?.map((id) => marker + id),
      key_retention: interval(job.keyRetention),
      traceparent: text(job.traceparent, `${at}.traceparent`),
      concurrency_key: text(job.concurrencyKey, `${at}.concurrencyKey`),
      timeout: interval(job.timeout),
    };
    return el; // undefined fields vanish in JSON.stringify, so SQL defaults apply
  });
  return jsonb(elements, what)!.replace(new RegExp(`"${marker}(-?\\d+)"`, "g"), "$1");
}
