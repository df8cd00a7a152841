// Call helpers for the work-function tests (claim, complete, fail, snooze,
// heartbeat, rescue): the SQL API by named parameters (the jobs to work on come
// from the factory in jobs.ts), read a job back, and move its clock hands
// directly (tests may write SQL; the functions under test may not be bypassed
// for what they prove).
import { namedArgs, Sql, type Queryable } from "./jobs.ts";

export interface ClaimedJob {
  id: string;
  task: string;
  queue: string;
  payload: unknown;
  attempt: number;
  max_attempts: number;
  idempotency_key: string | null;
  lease_expires_at: Date;
  reclaimed: boolean;
}

/** claim() arguments; a Sql value (e.g. sql("NULL")) is inlined. */
export interface ClaimArgs {
  worker_id?: string | Sql;
  queues?: string[] | null | Sql;
  batch_size?: number | Sql;
  lease?: string | Sql;
}

/** idemq.claim(...) as worker "w1" unless given, rows in the order claim returns them. */
export async function claim(db: Queryable, args: ClaimArgs = {}): Promise<ClaimedJob[]> {
  const values: unknown[] = [];
  const list = namedArgs({ worker_id: "w1", ...args }, { worker_id: "text", queues: "text[]", batch_size: "int", lease: "interval" }, values);
  const { rows } = await db.query<ClaimedJob>(`SELECT * FROM idemq.claim(${list})`, values);
  return rows;
}

/** Claims exactly one job and returns it; throws when there is none. */
export async function claimOne(db: Queryable, args: ClaimArgs = {}): Promise<ClaimedJob> {
  const rows = await claim(db, { ...args, batch_size: 1 });
  if (rows.length !== 1) throw new Error(`expected to claim one job, claimed ${rows.length}`);
  return rows[0]!;
}

export interface JobRow {
  id: string;
  task: string;
  queue: string;
  state: string;
  priority: number;
  attempt: number;
  max_attempts: number;
  locked_by: string | null;
  lease_expires_at: Date | null;
  errors: Array<Record<string, unknown>>;
  result: unknown;
  finished_at: Date | null;
  expires_at: Date | null;
  /** run_at - now() in seconds (now() of the reading transaction). */
  run_in: number;
  /** lease_expires_at - now() in seconds, or null without a lease. */
  lease_in: number | null;
  /** finished_at = now() (of the reading transaction). */
  finished_now: boolean;
}

/** The job as idemq.jobs shows it, plus its times relative to now(). */
export async function jobRow(db: Queryable, id: string): Promise<JobRow> {
  const { rows } = await db.query<JobRow>(
    `SELECT j.id, j.task, j.queue, j.state::text AS state, j.priority, j.attempt, j.max_attempts,
            j.locked_by, j.lease_expires_at, j.errors, j.result, j.finished_at, j.expires_at,
            extract(epoch FROM j.run_at - now())::float8 AS run_in,
            extract(epoch FROM j.lease_expires_at - now())::float8 AS lease_in,
            coalesce(j.finished_at = now(), false) AS finished_now
     FROM idemq.jobs j WHERE j.id = $1`,
    [id],
  );
  if (rows.length !== 1) throw new Error(`job ${id} not found`);
  return rows[0]!;
}

/** state of each job, keyed by id. */
export async function states(db: Queryable, ids: readonly string[]): Promise<Record<string, string>> {
  const { rows } = await db.query<{ id: string; state: string }>(
    "SELECT id, state::text AS state FROM idemq.jobs WHERE id = ANY($1::bigint[])",
    [ids],
  );
  return Object.fromEntries(rows.map((row) => [row.id, row.state]));
}

/** Sets a scheduled job's run_at to now() (of this transaction) so claim may take it. */
export async function makeDue(db: Queryable, id: string): Promise<void> {
  await db.query("UPDATE idemq.jobs SET run_at = now() WHERE id = $1", [id]);
}

/** Moves a held job's lease into the past (by `ago`, default one second) without rescuing it. */
export async function expireLease(db: Queryable, id: string, ago = "1 second"): Promise<void> {
  const { rowCount } = await db.query(
    "UPDATE idemq.jobs SET lease_expires_at = now() - $2::interval WHERE id = $1 AND state = 'processing'",
    [id, ago],
  );
  if (rowCount !== 1) throw new Error(`job ${id} is not processing`);
}

export async function complete(db: Queryable, id: string, attempt: number, result?: unknown): Promise<void> {
  if (result === undefined) await db.query("SELECT idemq.complete(job_id => $1, attempt => $2)", [id, attempt]);
  else
    await db.query("SELECT idemq.complete(job_id => $1, attempt => $2, result => $3::jsonb)", [
      id,
      attempt,
      JSON.stringify(result),
    ]);
}

export interface FailArgs {
  retryable?: boolean;
  retry_at?: Sql | string;
  backoff?: Record<string, unknown>;
  max_attempts?: number;
}

/** idemq.fail(...); returns the job's new state. */
export async function fail(...call: Parameters<typeof failRow>): Promise<string> {
  return (await failRow(...call)).state;
}

/** idemq.fail(...)'s row: the new state and the retry's run_at as text, to the microsecond (null when the job failed). */
export async function failRow(
  db: Queryable,
  id: string,
  attempt: number,
  error: unknown = { class: "Boom", message: "boom" },
  args: FailArgs = {},
): Promise<{ state: string; run_at: string | null }> {
  const values: unknown[] = [id, attempt, JSON.stringify(error)];
  const extra = namedArgs(args as Record<string, unknown>, { retryable: "boolean", retry_at: "timestamptz", backoff: "jsonb", max_attempts: "int" }, values);
  const { rows } = await db.query<{ state: string; run_at: string | null }>(
    `SELECT f.state::text AS state, f.run_at::text AS run_at FROM idemq.fail(job_id => $1, attempt => $2, error => $3::jsonb${extra ? `, ${extra}` : ""}) f`,
    values,
  );
  return rows[0]!;
}

export async function snooze(db: Queryable, id: string, attempt: number, runAt: Sql | string): Promise<void> {
  const at = runAt instanceof Sql ? runAt.text : "$3::timestamptz";
  await db.query(
    `SELECT idemq.snooze(job_id => $1, attempt => $2, run_at => ${at})`,
    runAt instanceof Sql ? [id, attempt] : [id, attempt, runAt],
  );
}

export async function heartbeat(
  db: Queryable,
  jobs: ReadonlyArray<{ id: string; attempt: number }>,
  lease?: string,
): Promise<string[]> {
  const values: unknown[] = [jobs.map((j) => j.id), jobs.map((j) => j.attempt)];
  if (lease !== undefined) values.push(lease);
  const { rows } = await db.query<{ id: string }>(
    `SELECT id FROM idemq.heartbeat(job_ids => $1::bigint[], attempts => $2::int[]${
      lease !== undefined ? ", lease => $3::interval" : ""
    }) AS id ORDER BY id`,
    values,
  );
  return rows.map((row) => row.id);
}

export async function rescue(db: Queryable): Promise<number> {
  const { rows } = await db.query<{ n: number }>("SELECT idemq.rescue() AS n");
  return rows[0]!.n;
}

/** Sorts numeric id strings numerically (ids are bigint, read as strings). */
export function byId(a: string, b: string): number {
  return Number(BigInt(a) - BigInt(b));
}
