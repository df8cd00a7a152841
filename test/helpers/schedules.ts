// Schedules: calls of schedule(), schedule_next(), tick() and the clocked
// _tick(at) by named parameters (unset options left out, so the SQL defaults
// are what is tested), and readers of a schedule's row and of its jobs.
import { namedArgs, type Queryable, type Sql } from "./jobs.ts";

const SCHEDULE_CASTS: Record<string, string> = {
  name: "text",
  cron: "text",
  task: "text",
  payload: "jsonb",
  queue: "text",
  timezone: "text",
  overlap: "idemq.schedule_overlap",
  misfire: "idemq.schedule_misfire",
  misfire_grace: "interval",
  priority: "int",
  max_attempts: "int",
};

export interface ScheduleArgs {
  name?: string | Sql;
  cron?: string | Sql;
  task?: string | Sql;
  payload?: unknown;
  queue?: string | Sql;
  timezone?: string | Sql;
  overlap?: "skip" | "allow" | "queue_one" | Sql;
  misfire?: "once" | "skip" | "all" | Sql;
  misfire_grace?: string | Sql;
  priority?: number | Sql;
  max_attempts?: number | Sql;
}

/** idemq.schedule(...) with task "report" unless given; returns the next slot it reports. */
export async function schedule(db: Queryable, args: ScheduleArgs): Promise<Date> {
  const values: unknown[] = [];
  const list = namedArgs({ task: "report", ...args }, SCHEDULE_CASTS, values);
  const { rows } = await db.query<{ next_at: Date }>(`SELECT idemq.schedule(${list}) AS next_at`, values);
  return rows[0]!.next_at;
}

/** idemq.schedule_next(cron, timezone, after, count) as ISO strings. */
export async function nextSlots(db: Queryable, cron: string, timezone: string, after: string, count: number): Promise<string[]> {
  const { rows } = await db.query<{ at: Date }>(
    "SELECT s AS at FROM idemq.schedule_next(cron => $1, timezone => $2, after => $3::timestamptz, count => $4) s",
    [cron, timezone, after, count],
  );
  return rows.map((r) => r.at.toISOString());
}

/** idemq._tick(at): tick() on a clock the test sets. Returns the jobs created. */
export async function tickAt(db: Queryable, at: string): Promise<number> {
  const { rows } = await db.query<{ n: number }>("SELECT idemq._tick(at => $1::timestamptz) AS n", [at]);
  return rows[0]!.n;
}

/** Moves a schedule's next slot (a simulated downtime, or a replay). */
export async function setNextAt(db: Queryable, name: string, at: string): Promise<void> {
  const { rowCount } = await db.query("UPDATE idemq.schedules SET next_at = $2::timestamptz WHERE name = $1", [name, at]);
  if (rowCount !== 1) throw new Error(`no schedule ${name}`);
}

export interface ScheduleRow {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  queue: string;
  payload: unknown;
  priority: number;
  max_attempts: number;
  overlap: string;
  misfire: string;
  misfire_grace: string;
  next_at: Date;
  last_slot_at: Date | null;
  last_job_id: string | null;
  last_job_state: string | null;
  skipped: string;
  last_error: string | null;
  last_error_at: Date | null;
}

/** The row idemq.schedules() returns for `name`, or undefined. */
export async function scheduleRow(db: Queryable, name: string): Promise<ScheduleRow | undefined> {
  const { rows } = await db.query<ScheduleRow>("SELECT *, misfire_grace::text AS misfire_grace FROM idemq.schedules() WHERE name = $1", [name]);
  return rows[0];
}

/** The jobs of schedule `name`: the slot of each (from its key), its state and id, in slot order. */
export async function slotJobs(db: Queryable, name: string): Promise<Array<{ slot: string; state: string; id: string }>> {
  const prefix = `schedule:${name}:`;
  const { rows } = await db.query<{ slot: string; state: string; id: string }>(
    `SELECT substr(idempotency_key, length($1) + 1) AS slot, state::text AS state, id::text AS id
       FROM idemq.jobs WHERE starts_with(idempotency_key, $1) ORDER BY idempotency_key, id`,
    [prefix],
  );
  return rows;
}
