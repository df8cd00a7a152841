// Worker presence: a worker registers (worker_seen) and leaves
// (worker_stopped); workers() lists them and unserved_jobs() finds the jobs
// that no worker seen lately would claim.

import type { Duration } from "../contract.ts";
import { interval, requiredText } from "../encode.ts";
import { call, scalar, type Queryable } from "./call.ts";

export interface WorkerPresence {
  workerId: string;
  /** undefined: every queue. */
  queues?: readonly string[] | undefined;
  /** undefined: any task. */
  tasks?: readonly string[] | undefined;
}

/** Registers or refreshes a worker's row in idemq.workers (worker_seen). */
export async function workerSeen(db: Queryable, presence: WorkerPresence): Promise<void> {
  await call(db, "worker_seen", {
    worker_id: requiredText(presence.workerId, "workerId"),
    queues: presence.queues === undefined ? undefined : [...presence.queues],
    tasks: presence.tasks === undefined ? undefined : [...presence.tasks],
  });
}

/** Removes a cleanly stopped worker's row; true when it had one. */
export function workerStopped(db: Queryable, workerId: string): Promise<boolean> {
  return scalar(db, "worker_stopped", { worker_id: requiredText(workerId, "workerId") });
}

export interface WorkerRow {
  workerId: string;
  /** null: every queue. */
  queues: string[] | null;
  /** null: any task. */
  tasks: string[] | null;
  startedAt: Date;
  lastSeenAt: Date;
}

/** The workers registered with worker_seen(), most recently seen first (stale ones included). */
export async function workers(db: Queryable): Promise<WorkerRow[]> {
  const rows = await call<"workers", { worker_id: string; queues: string[] | null; tasks: string[] | null; started_at: Date; last_seen_at: Date }>(
    db,
    "workers",
    {},
  );
  return rows.map((r) => ({ workerId: r.worker_id, queues: r.queues, tasks: r.tasks, startedAt: r.started_at, lastSeenAt: r.last_seen_at }));
}

export interface UnservedJobs {
  queue: string;
  task: string;
  jobs: number;
  oldestRunnableSeconds: number;
  /** When the latest (stale) worker that would claim them was seen; null: none ever registered with this queue and task. */
  lastSeenAt: Date | null;
}

/** Runnable jobs per queue and task that no worker seen within `seenWithin` claims (unserved_jobs). */
export async function unservedJobs(db: Queryable, seenWithin: Duration): Promise<UnservedJobs[]> {
  const rows = await call<"unserved_jobs", { queue: string; task: string; jobs: string; oldest_runnable_seconds: string; last_seen_at: Date | null }>(
    db,
    "unserved_jobs",
    { seen_within: interval(seenWithin) },
  );
  // Counts and ages, not ids: a number is exact far beyond any realistic value.
  return rows.map((r) => ({
    queue: r.queue,
    task: r.task,
    jobs: Number(r.jobs),
    oldestRunnableSeconds: Number(r.oldest_runnable_seconds),
    lastSeenAt: r.last_seen_at,
  }));
}
