// Recurring schedules: schedule, unschedule, schedules, schedule_next, and
// tick, which enqueues their due slots.

import { SCHEDULE_MISFIRES, SCHEDULE_OVERLAPS, type Duration, type JobState, type ScheduleMisfire, type ScheduleOverlap } from "../contract.ts";
import { bad, instant, integer, interval, jsonb, oneOf, requiredText, text, type Instant } from "../encode.ts";
import { call, INTERVAL_AS_TEXT, scalar, type Args, type ParamOf, type Queryable } from "./call.ts";
import type { PayloadField, PayloadMap } from "./enqueue.ts";

/** The fields of a schedule besides its task and payload (typed together in ScheduleDefinition). */
interface ScheduleFields {
  /** Names the schedule (upsert by name) and each slot's idempotency key, schedule:<name>:<slot>. */
  name: string;
  /** 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first), or @hourly, @daily, ..., @every <interval>. */
  cron: string;
  queue?: string | undefined;
  /** An IANA time zone (slots are local times there); SQL default UTC. */
  timezone?: string | undefined;
  /** While the latest job is active: skip (SQL default), allow, or queue_one. */
  overlap?: ScheduleOverlap | undefined;
  /** Slots missed while tick() was not called: once (SQL default), skip, or all. */
  misfire?: ScheduleMisfire | undefined;
  /** How late a slot may run and still be on time; SQL default 1 minute. */
  misfireGrace?: Duration | undefined;
  priority?: number | undefined;
  maxAttempts?: number | undefined;
}

/**
 * A recurring schedule as schedule() takes it: every option left undefined
 * takes schedule()'s SQL default. With a payload map, a union over its tasks
 * (each payload checked against its task), as EnqueueManyJob.
 */
export type ScheduleDefinition<Payloads extends object = PayloadMap> = {
  [K in keyof Payloads & string]: ScheduleFields & { task: K } & PayloadField<Payloads[K]>;
}[keyof Payloads & string];

/**
 * Each ScheduleDefinition field's schedule() parameter, in declaration order:
 * the one list of them (test/contract holds the values equal to schedule()'s
 * parameters, and the compiler holds the keys equal to the fields).
 */
export const SCHEDULE_PARAMETERS = {
  name: "name",
  cron: "cron",
  task: "task",
  payload: "payload",
  queue: "queue",
  timezone: "timezone",
  overlap: "overlap",
  misfire: "misfire",
  misfireGrace: "misfire_grace",
  priority: "priority",
  maxAttempts: "max_attempts",
} as const satisfies { [K in keyof (ScheduleFields & { task: string; payload?: unknown })]-?: ParamOf<"schedule"> };

/** A schedule's row, as idemq.schedules() lists it. */
export interface Schedule {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  queue: string;
  payload: unknown;
  priority: number;
  maxAttempts: number;
  overlap: ScheduleOverlap;
  misfire: ScheduleMisfire;
  /** PostgreSQL's interval text, e.g. "00:01:00". */
  misfireGrace: string;
  /** The first slot not yet handled (due when in the past: the next tick() enqueues it). */
  nextAt: Date;
  lastSlotAt: Date | null;
  lastJobId: string | null;
  /** The latest job's state; null before its first job, or once that job was purged. */
  lastJobState: JobState | null;
  /** Slots the overlap policy dropped. */
  skipped: number;
  createdAt: Date;
  updatedAt: Date;
  /**
   * Why the latest tick() could not enqueue this schedule's job ("<message>
   * (SQLSTATE <code>)", e.g. a payload over a lowered payload_bytes); null
   * once a tick enqueued it. The schedule stays due until then; the others fire.
   */
  lastError: string | null;
  /** When that tick ran; null with lastError. */
  lastErrorAt: Date | null;
}

/** The arguments of schedule(), checked: an unknown field is refused (a misspelt option must not be dropped silently). */
function scheduleArgs(definition: ScheduleDefinition): Args<"schedule"> {
  if (definition === null || typeof definition !== "object" || Array.isArray(definition)) {
    throw bad("a schedule must be an object { name, cron, task, ... }");
  }
  const what = typeof definition.name === "string" ? `schedule ${JSON.stringify(definition.name)}` : "schedule";
  const unknown = Object.keys(definition).find((key) => !Object.hasOwn(SCHEDULE_PARAMETERS, key));
  if (unknown !== undefined) {
    throw bad(`${what}: unknown option ${JSON.stringify(unknown)}`, `the options are ${Object.keys(SCHEDULE_PARAMETERS).join(", ")}`);
  }
  return {
    name: requiredText(definition.name, `${what}: name`),
    cron: requiredText(definition.cron, `${what}: cron`),
    task: requiredText(definition.task, `${what}: task`),
    payload: jsonb(definition.payload, `${what}: payload`),
    queue: text(definition.queue, `${what}: queue`),
    timezone: text(definition.timezone, `${what}: timezone`),
    overlap: oneOf(definition.overlap, SCHEDULE_OVERLAPS, `${what}: overlap`),
    misfire: oneOf(definition.misfire, SCHEDULE_MISFIRES, `${what}: misfire`),
    misfire_grace: interval(definition.misfireGrace),
    priority: integer(definition.priority, `${what}: priority`),
    max_attempts: integer(definition.maxAttempts, `${what}: maxAttempts`),
  };
}

/** Checks a schedule's fields as schedule() will be called with them (no database): throws a BadArgumentError naming the field. */
export function checkSchedule(definition: ScheduleDefinition): void {
  scheduleArgs(definition);
}

/** Creates or replaces (by name) a recurring schedule; returns its next slot. */
export async function schedule(db: Queryable, definition: ScheduleDefinition): Promise<Date> {
  return scalar(db, "schedule", scheduleArgs(definition));
}

/** Removes a schedule; false when there was none of that name. Jobs it enqueued stay. */
export async function unschedule(db: Queryable, name: string): Promise<boolean> {
  return scalar(db, "unschedule", { name: requiredText(name, "name") });
}

interface ScheduleRow {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  queue: string;
  payload: unknown;
  priority: number;
  max_attempts: number;
  overlap: ScheduleOverlap;
  misfire: ScheduleMisfire;
  misfire_grace: string;
  next_at: Date;
  last_slot_at: Date | null;
  last_job_id: string | null;
  last_job_state: JobState | null;
  skipped: string;
  created_at: Date;
  updated_at: Date;
  last_error: string | null;
  last_error_at: Date | null;
}

/** Every schedule, by name. */
export async function schedules(db: Queryable): Promise<Schedule[]> {
  const rows = await call<"schedules", ScheduleRow>(db, "schedules", {}, "", INTERVAL_AS_TEXT);
  return rows.map((r) => ({
    name: r.name,
    cron: r.cron,
    timezone: r.timezone,
    task: r.task,
    queue: r.queue,
    payload: r.payload,
    priority: r.priority,
    maxAttempts: r.max_attempts,
    overlap: r.overlap,
    misfire: r.misfire,
    misfireGrace: r.misfire_grace,
    nextAt: r.next_at,
    lastSlotAt: r.last_slot_at,
    lastJobId: r.last_job_id,
    lastJobState: r.last_job_state,
    // A count, not an id: a number is exact far beyond any realistic count.
    skipped: Number(r.skipped),
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    lastError: r.last_error,
    lastErrorAt: r.last_error_at,
  }));
}

export interface ScheduleNextOptions {
  cron: string;
  /** SQL default UTC. */
  timezone?: string | undefined;
  /** Slots strictly after this instant; SQL default now(). */
  after?: Instant | undefined;
  /** 1 to 1000; SQL default 1. */
  count?: number | undefined;
}

/** The next slots of a cron expression (schedule_next), to check it before scheduling it; validated as schedule() validates. */
export async function scheduleNext(db: Queryable, opts: ScheduleNextOptions): Promise<Date[]> {
  const rows = await call<"schedule_next", { r: Date }>(db, "schedule_next", {
    cron: requiredText(opts?.cron, "cron"),
    timezone: text(opts.timezone, "timezone"),
    after: instant(opts.after, "after"),
    count: integer(opts.count, "count"),
  });
  return rows.map((row) => row.r);
}

/** Enqueues every due schedule slot once; returns the number of jobs created. */
export function tick(db: Queryable): Promise<number> {
  return scalar(db, "tick", {});
}
