// Work: calls of the work functions (claim, complete, fail, snooze,
// heartbeat, rescue) by named parameters, the clock hands tests move directly
// (tests may write SQL; the functions under test may not be bypassed for what
// they prove), and jobIn/driveTo, which bring a job into a state through those
// functions. One of two modules: making and reading jobs (enqueue, the job
// factory, jobRow, stateOf, the NOTIFY listener) is in jobs.ts, which this one
// builds on.
import { expect } from "vitest";
import {
  enqueue,
  jobRow,
  namedArgs,
  Sql,
  stateOf,
  unique,
  type ActiveState,
  type EnqueueArgs,
  type Queryable,
  type TerminalState,
} from "./jobs.ts";

export interface ClaimedJob {
  job_id: string;
  task: string;
  queue: string;
  payload: unknown;
  attempt: number;
  max_attempts: number;
  idempotency_key: string | null;
  lease_expires_at: Date;
  reclaimed: boolean;
  traceparent: string | null;
}

/** claim() arguments; a Sql value (e.g. sql("NULL")) is inlined. */
export interface ClaimArgs {
  worker_id?: string | Sql;
  queues?: string[] | null | Sql;
  batch_size?: number | Sql;
  lease?: string | Sql;
  tasks?: string[] | null | Sql;
}

/** idemq.claim(...) as worker "w1" unless given, rows in the order claim returns them. */
export async function claim(db: Queryable, args: ClaimArgs = {}): Promise<ClaimedJob[]> {
  const values: unknown[] = [];
  const list = namedArgs({ worker_id: "w1", ...args }, { worker_id: "text", queues: "text[]", batch_size: "int", lease: "interval", tasks: "text[]" }, values);
  const { rows } = await db.query<ClaimedJob & { id?: string }>(`SELECT * FROM idemq.claim(${list})`, values);
  // A database at 0001 (install/upgrade.test.ts builds its zoo there) names the job's id `id`; 0.2.0 renamed it job_id.
  return rows.map(({ id, ...row }) => (id === undefined ? row : { ...row, job_id: id }));
}

/** Claims exactly one job and returns it; throws when there is none. */
export async function claimOne(db: Queryable, args: ClaimArgs = {}): Promise<ClaimedJob> {
  const rows = await claim(db, { ...args, batch_size: 1 });
  if (rows.length !== 1) throw new Error(`expected to claim one job, claimed ${rows.length}`);
  return rows[0]!;
}

/**
 * Claims job `id` (as worker "test-worker"), which must be the only runnable
 * job of its queue (give each job a unique() queue). Returns its attempt.
 */
export async function claimJob(db: Queryable, id: string): Promise<number> {
  const { queue } = await jobRow(db, id);
  const rows = await claim(db, { worker_id: "test-worker", queues: [queue] });
  expect(rows.map((r) => r.job_id), `claim of job ${id} in queue ${queue}`).toEqual([id]);
  return rows[0]!.attempt;
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

/**
 * Moves job `id` (runnable now, alone in its queue) into `state` through the
 * real functions: claim + complete, claim + fail (not retryable), cancel, or
 * an expires_at in the past + rescue.
 */
export async function driveTo(db: Queryable, id: string, state: TerminalState | "processing"): Promise<void> {
  switch (state) {
    case "processing":
      await claimJob(db, id);
      break;
    case "succeeded":
      await complete(db, id, await claimJob(db, id));
      break;
    case "failed": {
      // A plain SELECT idemq.fail(...), not failRow(): jobIn also drives jobs
      // on a database at 0001 (install/upgrade.test.ts), whose fail() returns
      // the new state rather than a row.
      const attempt = await claimJob(db, id);
      await db.query(
        `SELECT idemq.fail(job_id => $1, attempt => $2, error => '{"class": "TestError", "message": "boom"}', retryable => false)`,
        [id, attempt],
      );
      break;
    }
    case "cancelled":
      await db.query("SELECT idemq.cancel(job_id => $1)", [id]);
      break;
    case "expired":
      // A deadline not yet past is moved into the past (direct SQL is allowed
      // in tests); then rescue expires the job.
      await db.query(
        "UPDATE idemq.jobs SET expires_at = now() - interval '1 second' WHERE id = $1 AND (expires_at IS NULL OR expires_at > now())",
        [id],
      );
      await db.query("SELECT idemq.rescue()");
      break;
  }
  expect(await stateOf(db, id), `job ${id} driven to ${state}`).toBe(state);
}

/**
 * Enqueues a job (in a queue of its own unless given) and brings it into
 * `state`: any terminal state, or an active one (scheduled: run_at tomorrow;
 * processing: claimed; awaiting: after a parent that is still enqueued).
 */
export async function jobIn(
  db: Queryable,
  state: TerminalState | ActiveState,
  args: EnqueueArgs = {},
): Promise<string> {
  const queue = args.queue ?? unique("q");
  if (state === "scheduled") {
    const { job_id } = await enqueue(db, { ...args, queue, run_at: new Date(Date.now() + 86_400_000) });
    expect(await stateOf(db, job_id)).toBe("scheduled");
    return job_id;
  }
  if (state === "awaiting") {
    const parent = await enqueue(db, { task: "parent_task", queue: unique("q") });
    const { job_id } = await enqueue(db, { ...args, queue, after: [parent.job_id] });
    expect(await stateOf(db, job_id)).toBe("awaiting");
    return job_id;
  }
  // An expired job is enqueued with its deadline already past (enqueue accepts it).
  const expires_at = state === "expired" ? (args.expires_at ?? "2000-01-01T00:00:00Z") : args.expires_at;
  const { job_id } = await enqueue(db, { ...args, queue, ...(expires_at === undefined ? {} : { expires_at }) });
  if (state !== "enqueued") await driveTo(db, job_id, state);
  expect(await stateOf(db, job_id)).toBe(state);
  return job_id;
}
