// The job factory, and fixtures for tests of enqueue, duplicate policies,
// continuations and retention: the enqueue call (named parameters, unset
// options left out, so the SQL defaults are what is tested), makeJob/makeJobs
// (a job to test something else with), jobIn (a job brought into a given state
// through the real functions), and a NOTIFY listener whose "nothing arrived"
// checks wait for a sentinel notification instead of sleeping.
import { randomBytes } from "node:crypto";
import type pg from "pg";
import { expect } from "vitest";

export type Queryable = pg.Pool | pg.ClientBase;

// The state and policy lists come from the one definition (src/contract.ts,
// itself checked against the catalog by test/contract/contract.test.ts).
export { ACTIVE_STATES, TERMINAL_STATES, DUPLICATE_POLICIES as POLICIES } from "../../src/contract.ts";
import type { ActiveState, DuplicatePolicy as Policy, TerminalState } from "../../src/contract.ts";
export type { ActiveState, Policy, TerminalState };

/** A name no other test uses (queues, keys, tasks), so claims and counts stay targeted. */
export function unique(prefix: string): string {
  return `${prefix}-${randomBytes(5).toString("hex")}`;
}

/** A SQL expression inlined as is, e.g. sql("now() - interval '1 second'"). */
export class Sql {
  constructor(readonly text: string) {}
}
export const sql = (text: string): Sql => new Sql(text);

/**
 * A named-parameter argument list ("name => $n::cast, ..."): Sql values are
 * inlined, undefined ones left out (so the SQL default applies), jsonb values
 * sent as JSON text, others bound with their cast (text when not in `casts`).
 */
export function namedArgs(args: Record<string, unknown>, casts: Record<string, string>, values: unknown[]): string {
  return Object.entries(args)
    .filter(([, value]) => value !== undefined)
    .map(([name, value]) => {
      if (value instanceof Sql) return `${name} => ${value.text}`;
      const bound = casts[name] === "jsonb" ? JSON.stringify(value) : value;
      values.push(bound);
      return `${name} => $${values.length}::${casts[name] ?? "text"}`;
    })
    .join(", ");
}

const ENQUEUE_CASTS: Record<string, string> = {
  task: "text",
  payload: "jsonb",
  queue: "text",
  run_at: "timestamptz",
  priority: "int",
  max_attempts: "int",
  idempotency_key: "text",
  duplicate_policy: "idemq.duplicate_policy",
  backoff: "jsonb",
  expires_at: "timestamptz",
  after: "bigint[]",
};

/** idemq.enqueue's arguments; any of them may be a Sql expression. */
export interface EnqueueArgs {
  task?: string | Sql;
  payload?: unknown;
  /** Raw jsonb text for the payload (to test key order and whitespace). */
  payloadText?: string;
  queue?: string | Sql;
  run_at?: string | Date | Sql;
  priority?: number | Sql;
  max_attempts?: number | Sql;
  idempotency_key?: string | Sql;
  duplicate_policy?: Policy | Sql;
  backoff?: unknown;
  expires_at?: string | Date | Sql;
  after?: (string | number)[] | Sql;
}

export interface Enqueued {
  job_id: string;
  deduplicated: boolean;
}

/** SELECT * FROM idemq.enqueue(...) with only the given arguments, by name (task "test_task" unless given). */
export async function enqueue(db: Queryable, args: EnqueueArgs = {}): Promise<Enqueued> {
  const { payloadText, ...named } = args;
  const values: unknown[] = [];
  let list = namedArgs({ task: "test_task", ...named }, ENQUEUE_CASTS, values);
  if (payloadText !== undefined) {
    values.push(payloadText);
    list += `, payload => $${values.length}::jsonb`;
  }
  const { rows } = await db.query<Enqueued>(`SELECT * FROM idemq.enqueue(${list})`, values);
  expect(rows).toHaveLength(1);
  return rows[0]!;
}

/** The job factory: a new job (enqueue with `args`), by id. */
export async function makeJob(db: Queryable, args: EnqueueArgs = {}): Promise<string> {
  return (await enqueue(db, args)).job_id;
}

export interface ManyRow {
  ordinal: number;
  job_id: string | null;
  outcome: "created" | "deduplicated" | "rejected" | "conflict";
}

/** SELECT * FROM idemq.enqueue_many($1) in ordinal order. */
export async function enqueueMany(db: Queryable, jobs: unknown): Promise<ManyRow[]> {
  const { rows } = await db.query<ManyRow>("SELECT * FROM idemq.enqueue_many($1::jsonb) ORDER BY ordinal", [
    JSON.stringify(jobs),
  ]);
  return rows;
}

/** `n` new jobs in one enqueue_many call (payload {i}, then `job`'s fields), their ids in order. */
export async function makeJobs(db: Queryable, n: number, job: Record<string, unknown> = {}): Promise<string[]> {
  const rows = await enqueueMany(db, Array.from({ length: n }, (_, i) => ({ task: "test_task", payload: { i }, ...job })));
  return rows.map((row) => row.job_id!);
}

export interface JobRow {
  id: string;
  task: string;
  queue: string;
  payload: unknown;
  state: string;
  priority: number;
  run_at: Date;
  attempt: number;
  max_attempts: number;
  idempotency_key: string | null;
  errors: Array<Record<string, unknown>>;
  created_at: Date;
  finished_at: Date | null;
  expires_at: Date | null;
  backoff: unknown;
}

export async function job(db: Queryable, id: string | number): Promise<JobRow> {
  const { rows } = await db.query<JobRow>("SELECT * FROM idemq.jobs WHERE id = $1", [String(id)]);
  if (rows.length !== 1) throw new Error(`job ${id} not found`);
  return rows[0]!;
}

export async function stateOf(db: Queryable, id: string | number): Promise<string> {
  return (await job(db, id)).state;
}

/** The key ledger row of `key`, or undefined. */
export async function keyRow(
  db: Queryable,
  key: string,
): Promise<{ job_id: string; finished_state: string | null; finished_at: Date | null } | undefined> {
  const { rows } = await db.query("SELECT job_id, finished_state, finished_at FROM idemq.keys WHERE key = $1", [key]);
  return rows[0];
}

export async function count(db: Queryable, sql: string, values: unknown[] = []): Promise<number> {
  const { rows } = await db.query<{ n: string }>(`SELECT count(*) AS n FROM (${sql}) s`, values);
  return Number(rows[0]!.n);
}

/**
 * Claims job `id`, which must be the only runnable job of its queue (give each
 * job a unique() queue). Returns its attempt.
 */
export async function claimJob(db: Queryable, id: string): Promise<number> {
  const { queue } = await job(db, id);
  const { rows } = await db.query<{ id: string; attempt: number }>(
    "SELECT id, attempt FROM idemq.claim(worker_id => 'test-worker', queues => ARRAY[$1::text])",
    [queue],
  );
  expect(rows.map((r) => r.id), `claim of job ${id} in queue ${queue}`).toEqual([id]);
  return rows[0]!.attempt;
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
    case "succeeded": {
      const attempt = await claimJob(db, id);
      await db.query("SELECT idemq.complete(job_id => $1, attempt => $2)", [id, attempt]);
      break;
    }
    case "failed": {
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

/**
 * Declares `client` a session waiting for jobs of `queues` (NULL: all) and
 * returns once idemq.wait_for_jobs reports every enqueue that skipped its
 * NOTIFY has ended (it says false while one is still open).
 */
export async function waitForJobs(client: Queryable, queues: string[] | null = null): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const { rows } = await client.query<{ ready: boolean }>("SELECT idemq.wait_for_jobs($1::text[]) AS ready", [queues]);
    if (rows[0]!.ready) return;
    if (Date.now() > deadline) throw new Error("idemq.wait_for_jobs kept returning false for 10 s: a transaction that enqueued is still open");
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/**
 * Collects notifications on a connection of its own. `quiet()` proves that
 * nothing else arrived: it sends a sentinel through `sender` and waits for it;
 * notifications are delivered in commit order, so anything committed before
 * the sentinel has arrived by then.
 */
export class Listener {
  readonly received: Array<{ channel: string; payload: string }> = [];
  private waiters: Array<() => void> = [];

  private constructor(private readonly client: pg.Client) {
    client.on("notification", (msg) => {
      this.received.push({ channel: msg.channel, payload: msg.payload ?? "" });
      for (const wake of this.waiters.splice(0)) wake();
    });
  }

  /**
   * LISTENs on idemq_jobs and declares the session waiting for every queue
   * (idemq.wait_for_jobs): enqueues notify only while a session waits.
   * `{ waiting: false }` only listens: it hears what other waiters cause.
   */
  static async start(client: pg.Client, options: { waiting?: boolean } = {}): Promise<Listener> {
    await client.query("LISTEN idemq_jobs");
    if (options.waiting ?? true) await waitForJobs(client);
    return new Listener(client);
  }

  /** Payloads received so far on idemq_jobs. */
  payloads(): string[] {
    return this.received.filter((n) => n.channel === "idemq_jobs").map((n) => n.payload);
  }

  /** Waits until a notification with `payload` has arrived (fails after timeoutMs). */
  async waitFor(payload: string, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!this.received.some((n) => n.payload === payload)) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`notification "${payload}" did not arrive within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Sends a sentinel on idemq_jobs through `sender` (autocommit) and waits for it to arrive. */
  async sync(sender: Queryable): Promise<void> {
    const sentinel = unique("sentinel");
    await sender.query("SELECT pg_notify('idemq_jobs', $1)", [sentinel]);
    await this.waitFor(sentinel);
  }

  async stop(): Promise<void> {
    await this.client.query("UNLISTEN *");
  }
}
