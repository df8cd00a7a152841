// Durable steps (docs/design.md, "Durable steps"): a held job's step ledger
// (step_record, steps), its sleeps and event waits (sleep, await_event, which
// park the job), and emit.

import type pg from "pg";
import type { Duration, StepKind, StepStatus } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import { instant, integer, jsonb, leaseToken, requiredText, text, toJobId, type Instant, type JobIdInput } from "../encode.ts";
import type { JobAttempt } from "./attempts.ts";
import { call, callInline, fromNow, scalar, type Queryable } from "./call.ts";

/** One row of a job's step ledger (idemq.steps). */
export interface StepRow {
  name: string;
  kind: StepKind;
  status: StepStatus;
  /** The step's result, or a received event's payload; null for none. */
  result: unknown;
  attempt: number;
  recordedAt: Date;
  wakeAt: Date | null;
  event: string | null;
  eventKey: string | null;
  /** A replay passes it without a call (done, received, timed out, or a sleep whose time has come). */
  over: boolean;
}

function attemptArgs(a: JobAttempt) {
  return { job_id: toJobId(a.jobId), attempt: integer(a.attempt, "attempt"), lease_token: leaseToken(a.leaseToken) };
}

/** Records a completed step with its result, fenced like complete(); in the transaction of the step's writes. */
export async function stepRecord(db: Queryable, a: JobAttempt, name: string, result: unknown): Promise<void> {
  await call(db, "step_record", { ...attemptArgs(a), name: requiredText(name, "name"), result: jsonb(result, "result") ?? null });
}

/**
 * step_record() and COMMIT in one round trip, on the connection whose
 * transaction holds the step's writes (beginWithEffectDone); `before`, e.g.
 * a SAVEPOINT the caller rolls back to when the record is refused.
 */
export async function stepRecordAndCommit(client: pg.ClientBase, a: JobAttempt, name: string, result: unknown, before?: string): Promise<void> {
  await callInline(
    client,
    "step_record",
    { ...attemptArgs(a), name: requiredText(name, "name"), result: jsonb(result, "result") ?? null },
    before === undefined ? { after: "COMMIT" } : { before, after: "COMMIT" },
  );
}

/** A job's step ledger, oldest first. */
export async function steps(db: Queryable, jobId: JobIdInput): Promise<StepRow[]> {
  const rows = await call<"steps", {
    name: string;
    kind: StepKind;
    status: StepStatus;
    result: unknown;
    attempt: number;
    recorded_at: Date;
    wake_at: Date | null;
    event: string | null;
    event_key: string | null;
    over: boolean;
  }>(db, "steps", { job_id: toJobId(jobId) });
  return rows.map((r) => ({
    name: r.name,
    kind: r.kind,
    status: r.status,
    result: r.result,
    attempt: r.attempt,
    recordedAt: r.recorded_at,
    wakeAt: r.wake_at,
    event: r.event,
    eventKey: r.event_key,
    over: r.over,
  }));
}

/**
 * A durable sleep: `parked` true means the job is parked until runAt and the
 * attempt is over; false means the sleep's time has come. The wake time is
 * the database clock's now + delay, or the instant given; the first call's
 * time is kept.
 */
export async function sleep(
  db: Queryable,
  a: JobAttempt,
  name: string,
  when: { delay: Duration } | { wakeAt: Instant },
): Promise<{ parked: boolean; runAt: Date }> {
  const wakeAt = "delay" in when ? fromNow(toPgInterval(when.delay)) : instant(when.wakeAt, "wakeAt");
  const rows = await call<"sleep", { parked: boolean; run_at: Date }>(db, "sleep", {
    ...attemptArgs(a),
    name: requiredText(name, "name"),
    wake_at: wakeAt,
  });
  return { parked: rows[0]!.parked, runAt: rows[0]!.run_at };
}

export type AwaitEventStatus = "received" | "timed_out" | "waiting";

/** A wait for (event, key): received (with the payload), timed_out, or waiting (the job is parked; the attempt is over). */
export async function awaitEvent(
  db: Queryable,
  a: JobAttempt,
  name: string,
  event: string,
  key: string | null,
  timeout: Duration,
): Promise<{ status: AwaitEventStatus; payload: unknown }> {
  const rows = await call<"await_event", { status: AwaitEventStatus; payload: unknown }>(db, "await_event", {
    ...attemptArgs(a),
    name: requiredText(name, "name"),
    event: requiredText(event, "event"),
    key: key ?? null,
    timeout: toPgInterval(timeout),
  });
  return rows[0]!;
}

/** Emits (event, key) with a payload; returns how many waiting jobs it woke. */
export function emit(db: Queryable, event: string, opts: { key?: string | undefined; payload?: unknown } = {}): Promise<number> {
  return scalar(db, "emit", {
    event: requiredText(event, "event"),
    key: text(opts.key, "key"),
    payload: jsonb(opts.payload, "payload") ?? undefined,
  });
}
