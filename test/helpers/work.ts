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
  /** undefined on a database at 0001; NULL for a claim without token => true. */
  lease_token: string | null;
}

/**
 * How a test presents an attempt to complete, fail, snooze or heartbeat:
 * a claim's row (its attempt and lease_token, as a worker presents them; a
 * row claimed at 0001 has no lease_token, and none is passed), or an
 * attempt number alone, presented with the lease token of whichever attempt
 * holds the job now, read from idemq.jobs (HOLDER_TOKEN), for tests not
 * about the token: a stale attempt number is still fenced out by its
 * attempt. Tests of the token pass a row with the token they mean.
 */
export type Attempt = number | { attempt: number; lease_token?: string | null };

/** The lease token of whichever attempt holds job `idParam` now, as SQL (see Attempt). */
export const HOLDER_TOKEN = (idParam: string): string => `(SELECT h.lease_token FROM idemq.jobs h WHERE h.id = ${idParam})`;

/** HOLDER_TOKEN of each id of the bigint[] `idsParam`, in its order, as SQL (complete_many's and heartbeat's lease_tokens). */
export const HOLDER_TOKENS = (idsParam: string): string =>
  `ARRAY(SELECT h.lease_token FROM unnest(${idsParam}::bigint[]) WITH ORDINALITY u(id, n) LEFT JOIN idemq.jobs h ON h.id = u.id ORDER BY u.n)`;

const attemptNumber = (a: Attempt): number => (typeof a === "number" ? a : a.attempt);

/** `, lease_token => ...` for a call on job `idParam` (appended to `values` when given), presenting `a` (see Attempt). */
export function tokenArg(a: Attempt, idParam: string, values: unknown[]): string {
  if (typeof a === "number") return `, lease_token => ${HOLDER_TOKEN(idParam)}`;
  if (a.lease_token === undefined) return "";
  values.push(a.lease_token);
  return `, lease_token => $${values.length}::uuid`;
}

/** claim() arguments; a Sql value (e.g. sql("NULL")) is inlined. */
export interface ClaimArgs {
  worker_id?: string | Sql;
  queues?: string[] | null | Sql;
  batch_size?: number | Sql;
  lease?: string | Sql;
  tasks?: string[] | null | Sql;
  /** true: each job gets a lease token, which later calls must present. */
  token?: boolean | Sql;
}

/** idemq.claim(...) as worker "w1" unless given, rows in the order claim returns them. */
export async function claim(db: Queryable, args: ClaimArgs = {}): Promise<ClaimedJob[]> {
  const values: unknown[] = [];
  const list = namedArgs({ worker_id: "w1", ...args }, { worker_id: "text", queues: "text[]", batch_size: "int", lease: "interval", tasks: "text[]", token: "boolean" }, values);
  const { rows } = await db.query<ClaimedJob & { id?: string }>(`SELECT * FROM idemq.claim(${list})`, values);
  // claim's rows name the job's id `id` (0.1.0) and, from 0.2.0 on, job_id too (the same value); a database at
  // 0001 (install/upgrade.test.ts builds its zoo there) has id only.
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
 * job of its queue (give each job a unique() queue). Returns its claim row.
 */
export async function claimJobRow(db: Queryable, id: string): Promise<ClaimedJob> {
  const { queue } = await jobRow(db, id);
  const rows = await claim(db, { worker_id: "test-worker", queues: [queue] });
  expect(rows.map((r) => r.job_id), `claim of job ${id} in queue ${queue}`).toEqual([id]);
  return rows[0]!;
}

/** claimJobRow(), returning the attempt only. */
export async function claimJob(db: Queryable, id: string): Promise<number> {
  return (await claimJobRow(db, id)).attempt;
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

export async function complete(db: Queryable, id: string, attempt: Attempt, result?: unknown): Promise<void> {
  const values: unknown[] = [id, attemptNumber(attempt)];
  let extra = "";
  if (result !== undefined) {
    values.push(JSON.stringify(result));
    extra = ", result => $3::jsonb";
  }
  extra += tokenArg(attempt, "$1", values);
  await db.query(`SELECT idemq.complete(job_id => $1, attempt => $2${extra})`, values);
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
  attempt: Attempt,
  error: unknown = { class: "Boom", message: "boom" },
  args: FailArgs = {},
): Promise<{ state: string; run_at: string | null }> {
  const values: unknown[] = [id, attemptNumber(attempt), JSON.stringify(error)];
  const extra = namedArgs(args as Record<string, unknown>, { retryable: "boolean", retry_at: "timestamptz", backoff: "jsonb", max_attempts: "int" }, values);
  const token = tokenArg(attempt, "$1", values);
  const { rows } = await db.query<{ state: string; run_at: string | null }>(
    `SELECT f.state::text AS state, f.run_at::text AS run_at FROM idemq.fail(job_id => $1, attempt => $2, error => $3::jsonb${extra ? `, ${extra}` : ""}${token}) f`,
    values,
  );
  return rows[0]!;
}

export async function snooze(db: Queryable, id: string, attempt: Attempt, runAt: Sql | string): Promise<void> {
  const values: unknown[] = [id, attemptNumber(attempt)];
  if (!(runAt instanceof Sql)) values.push(runAt);
  const at = runAt instanceof Sql ? runAt.text : "$3::timestamptz";
  const token = tokenArg(attempt, "$1", values);
  await db.query(`SELECT idemq.snooze(job_id => $1, attempt => $2, run_at => ${at}${token})`, values);
}

/**
 * idemq.heartbeat(...) of `jobs`, each presented as a claim's row (with its
 * lease_token) or as an id and attempt number alone (the holder's token:
 * see Attempt); returns the ids extended, sorted.
 */
export async function heartbeat(
  db: Queryable,
  jobs: ReadonlyArray<{ id: string; attempt: number; lease_token?: string | null }>,
  lease?: string,
): Promise<string[]> {
  const values: unknown[] = [jobs.map((j) => j.id), jobs.map((j) => j.attempt)];
  let extra = "";
  if (lease !== undefined) {
    values.push(lease);
    extra = `, lease => $${values.length}::interval`;
  }
  const given = jobs.filter((j) => j.lease_token !== undefined).length;
  if (given > 0 && given < jobs.length) throw new Error("heartbeat helper: give every job a lease_token, or none");
  if (given > 0) {
    values.push(jobs.map((j) => j.lease_token));
    extra += `, lease_tokens => $${values.length}::uuid[]`;
  } else {
    extra += `, lease_tokens => ${HOLDER_TOKENS("$1")}`;
  }
  const { rows } = await db.query<{ id: string }>(
    `SELECT id FROM idemq.heartbeat(job_ids => $1::bigint[], attempts => $2::int[]${extra}) AS id ORDER BY id`,
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
      // The claim's row: at 0001 (install/upgrade.test.ts drives jobs there too) it has no token to pass.
      await complete(db, id, await claimJobRow(db, id));
      break;
    case "failed": {
      // A plain SELECT idemq.fail(...), not failRow(): jobIn also drives jobs
      // on a database at 0001 (install/upgrade.test.ts), whose fail() returns
      // the new state rather than a row, and whose claim() gives no token.
      const claimed = await claimJobRow(db, id);
      const values: unknown[] = [id, claimed.attempt];
      await db.query(
        `SELECT idemq.fail(job_id => $1, attempt => $2, error => '{"class": "TestError", "message": "boom"}', retryable => false${tokenArg(claimed, "$1", values)})`,
        values,
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
