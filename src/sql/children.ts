// Fan-out, fan-in and results: spawn, wait_for_children, children,
// enqueue_batch, job_result (sql/functions/children/, results/).

import type { EnqueueOutcome, JobState } from "../contract.ts";
import { bad, leaseToken, integer, jsonb, toJobId, type JobIdInput } from "../encode.ts";
import { call, scalar, type Queryable } from "./call.ts";
import { encodeJobs, type EnqueueManyJob, type EnqueueManyResult } from "./enqueue.ts";

/** A job's outcome as job_result() returns it. */
export interface JobOutcome {
  state: JobState;
  /** What complete() stored (a handler's return value), once the job succeeded; null otherwise. */
  result: unknown;
  /** The latest entry of the job's errors once it failed, expired or was cancelled; null otherwise. */
  lastError: Record<string, unknown> | null;
  finishedAt: Date | null;
}

interface OutcomeRow {
  state: JobState;
  result: unknown;
  last_error: Record<string, unknown> | null;
  finished_at: Date | null;
}

/** job_result(): undefined when there is no such job; `notify` marks an active job to NOTIFY idemq_results when it finishes. */
export async function jobResult(db: Queryable, jobId: JobIdInput, notify?: boolean): Promise<JobOutcome | undefined> {
  const rows = await call<"job_result", OutcomeRow>(db, "job_result", { job_id: toJobId(jobId), notify });
  const row = rows[0];
  return row === undefined ? undefined : { state: row.state, result: row.result, lastError: row.last_error, finishedAt: row.finished_at };
}

/** One child of a job, as spawn() and children() return it. */
export interface ChildOutcome {
  /** The name its parent gave it (a batch's jobs: their ordinal, "1", "2", ...). */
  name: string;
  jobId: string;
  /** Its live state while it runs, its terminal state once it finished. */
  state: JobState;
  /** Its result once it succeeded; null otherwise. */
  result: unknown;
  /** Its latest error entry once it failed, expired or was cancelled; null otherwise. */
  lastError: Record<string, unknown> | null;
}

/** A child to spawn: a unique `name` (1..200 characters; a replay finds it by it) and enqueue_many's fields. */
export type ChildJob<Payloads extends object = Record<string, unknown>> = EnqueueManyJob<Payloads> & { name: string };

export interface SpawnedChild extends ChildOutcome {
  /** What this call did with it: created, deduplicated (onto its key's active job), or existing (linked before). */
  outcome: "created" | "deduplicated" | "existing";
}

interface ChildRow {
  name: string;
  child_job_id: string;
  state: JobState;
  result: unknown;
  last_error: Record<string, unknown> | null;
}

const child = (r: ChildRow): ChildOutcome => ({ name: r.name, jobId: r.child_job_id, state: r.state, result: r.result, lastError: r.last_error });

/** spawn(): the held job enqueues (or finds, by name) its children; one row per child, in order. */
export async function spawn(
  db: Queryable,
  jobId: JobIdInput,
  attempt: number,
  token: string | null,
  children: readonly ChildJob[],
  opts: { failFast?: boolean | undefined } = {},
): Promise<SpawnedChild[]> {
  const json = encodeJobs(children, "children", (c, i) => {
    if (typeof c.name !== "string" || c.name === "") throw bad(`children[${i}].name must be a non-empty string`, "A replay finds each child by its name.");
    return { name: c.name };
  });
  const rows = await call<"spawn", ChildRow & { outcome: SpawnedChild["outcome"] }>(db, "spawn", {
    job_id: toJobId(jobId),
    attempt: integer(attempt, "attempt"),
    children: json,
    lease_token: leaseToken(token),
    fail_fast: opts.failFast,
  });
  return rows.map((r) => ({ ...child(r), outcome: r.outcome }));
}

/** wait_for_children(): true when the job is parked until its children finish (the attempt ended, not spent). */
export async function waitForChildren(db: Queryable, jobId: JobIdInput, attempt: number, token: string | null): Promise<boolean> {
  return scalar<"wait_for_children", boolean>(db, "wait_for_children", {
    job_id: toJobId(jobId),
    attempt: integer(attempt, "attempt"),
    lease_token: leaseToken(token),
  });
}

/** children(): a job's children with their outcomes, in the order they were linked. */
export async function children(db: Queryable, jobId: JobIdInput): Promise<ChildOutcome[]> {
  const rows = await call<"children", ChildRow>(db, "children", { job_id: toJobId(jobId) });
  return rows.map(child);
}

/** enqueue_batch(): ordinal 0 is the callback, 1..N the jobs. */
export async function enqueueBatch(
  db: Queryable,
  jobs: readonly EnqueueManyJob[],
  callback: EnqueueManyJob,
  opts: { failFast?: boolean | undefined } = {},
): Promise<{ callback: EnqueueManyResult; jobs: EnqueueManyResult[] }> {
  const callbackJson = encodeJobs([callback], "callback");
  const rows = await call<"enqueue_batch", { ordinal: number; job_id: string | null; outcome: EnqueueOutcome }>(db, "enqueue_batch", {
    jobs: encodeJobs(jobs, "jobs"),
    callback: jsonb(JSON.parse(callbackJson)[0], "callback"),
    fail_fast: opts.failFast,
  });
  const results = rows.map((r) => ({ ordinal: r.ordinal, jobId: r.job_id, outcome: r.outcome }));
  return { callback: results.find((r) => r.ordinal === 0)!, jobs: results.filter((r) => r.ordinal > 0).sort((a, b) => a.ordinal - b.ordinal) };
}
