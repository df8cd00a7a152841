// Worker presence: a worker registers (worker_seen) and leaves
// (worker_stopped); workers() lists them and unserved_jobs() finds the jobs
// that no worker seen lately would claim.

import type { Duration } from "../contract.ts";
import { integer, interval, requiredText, text } from "../encode.ts";
import { call, scalar, type Queryable } from "./call.ts";

export interface WorkerPresence {
  workerId: string;
  /** undefined: every queue. */
  queues?: readonly string[] | undefined;
  /** undefined: any task. */
  tasks?: readonly string[] | undefined;
  host?: string | undefined;
  pid?: number | undefined;
  /** Jobs it runs at once. */
  concurrency?: number | undefined;
  /** How often it calls worker_seen (workers() calls it late after two). */
  refreshEveryMs?: number | undefined;
  /** Database outages it lived through since it started, and their time down. */
  outages?: number | undefined;
  outageMs?: number | undefined;
}

/** Registers or refreshes a worker's row in idemq.workers (worker_seen). */
export async function workerSeen(db: Queryable, presence: WorkerPresence): Promise<void> {
  await call(db, "worker_seen", {
    worker_id: requiredText(presence.workerId, "workerId"),
    queues: presence.queues === undefined ? undefined : [...presence.queues],
    tasks: presence.tasks === undefined ? undefined : [...presence.tasks],
    host: text(presence.host, "host"),
    pid: integer(presence.pid, "pid"),
    concurrency: integer(presence.concurrency, "concurrency"),
    refresh_every: presence.refreshEveryMs === undefined ? undefined : interval(presence.refreshEveryMs),
    outages: integer(presence.outages, "outages"),
    outage_ms: integer(presence.outageMs === undefined ? undefined : Math.round(presence.outageMs), "outageMs"),
  });
}

/** Marks a cleanly stopped worker's row stopped (kept stopped_worker_seconds); true when it had a live one. */
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
  /** null: the worker did not say (a 0.1.0 worker, or a plain SQL client). */
  host: string | null;
  pid: number | null;
  concurrency: number | null;
  refreshEveryMs: number | null;
  /** Two refreshes missed (by the database's clock); null when refreshEvery is not known. */
  late: boolean | null;
  /** Database outages it lived through since it started, their time down, and when the latest ended (within a refresh). */
  outages: number;
  outageMs: number;
  lastOutageAt: Date | null;
  /** When it said it stopped cleanly (worker_stopped): its row is kept a while, stopped; null while live (or stale). */
  stoppedAt: Date | null;
}

/** The workers registered with worker_seen(), live ones first, most recently seen first (stale and recently stopped ones included). */
/** An interval as node-postgres parses it (postgres-interval): only the fields that are not zero. */
interface PgInterval {
  days?: number;
  hours?: number;
  minutes?: number;
  seconds?: number;
  milliseconds?: number;
}

/** A refresh interval in milliseconds (days at most: worker_seen refuses more than duration_days, and months never come from a duration). */
function intervalMs(i: PgInterval): number {
  return (((i.days ?? 0) * 24 + (i.hours ?? 0)) * 60 + (i.minutes ?? 0)) * 60_000 + (i.seconds ?? 0) * 1000 + (i.milliseconds ?? 0);
}

export async function workers(db: Queryable): Promise<WorkerRow[]> {
  const rows = await call<
    "workers",
    {
      worker_id: string;
      queues: string[] | null;
      tasks: string[] | null;
      started_at: Date;
      last_seen_at: Date;
      host: string | null;
      pid: number | null;
      concurrency: number | null;
      refresh_every: PgInterval | null;
      late: boolean | null;
      outages: number;
      outage_ms: string;
      last_outage_at: Date | null;
      stopped_at: Date | null;
    }
  >(db, "workers", {});
  return rows.map((r) => ({
    workerId: r.worker_id,
    queues: r.queues,
    tasks: r.tasks,
    startedAt: r.started_at,
    lastSeenAt: r.last_seen_at,
    host: r.host,
    pid: r.pid,
    concurrency: r.concurrency,
    refreshEveryMs: r.refresh_every === null ? null : intervalMs(r.refresh_every),
    late: r.late,
    outages: r.outages,
    outageMs: Number(r.outage_ms),
    lastOutageAt: r.last_outage_at,
    stoppedAt: r.stopped_at,
  }));
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
