// Jobs: making them and reading them back. One of two modules (work.ts is the
// other, and the only one that imports this one): here the enqueue calls
// (named parameters, unset options left out, so the SQL defaults are what is
// tested), the job factory makeJob/makeJobs (a job to test something else
// with), the one reader of a job row (jobRow, stateOf, states, keyRow), and a
// NOTIFY listener whose "nothing arrived" checks wait for a sentinel
// notification instead of sleeping. Calls of the work functions (claim,
// complete, fail, ...) and jobIn/driveTo, which bring a job into a state
// through them, are in work.ts.
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
  key_retention: "interval",
  traceparent: "text",
  concurrency_key: "text",
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
  key_retention?: string | Sql;
  traceparent?: string | Sql;
  concurrency_key?: string | Sql;
}

export interface Enqueued {
  job_id: string;
  deduplicated: boolean;
}

/** SELECT job_id, deduplicated FROM idemq.enqueue(...) with only the given arguments, by name (task "test_task" unless given). */
export async function enqueue(db: Queryable, args: EnqueueArgs = {}): Promise<Enqueued> {
  const { payloadText, ...named } = args;
  const values: unknown[] = [];
  let list = namedArgs({ task: "test_task", ...named }, ENQUEUE_CASTS, values);
  if (payloadText !== undefined) {
    values.push(payloadText);
    list += `, payload => $${values.length}::jsonb`;
  }
  // The two columns every test compares; job_traceparent has its own tests (test/sql/traceparent.test.ts).
  const { rows } = await db.query<Enqueued>(`SELECT job_id, deduplicated FROM idemq.enqueue(${list})`, values);
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

/** A row of idemq.jobs (every column), plus its times relative to now(). */
export interface JobRow {
  id: string;
  task: string;
  queue: string;
  payload: unknown;
  state: string;
  priority: number;
  run_at: Date;
  attempt: number;
  uncounted: number;
  max_attempts: number;
  idempotency_key: string | null;
  backoff: unknown;
  locked_by: string | null;
  locked_at: Date | null;
  lease_expires_at: Date | null;
  lease_lost: boolean;
  has_children: boolean;
  errors: Array<Record<string, unknown>>;
  result: unknown;
  created_at: Date;
  finished_at: Date | null;
  expires_at: Date | null;
  traceparent: string | null;
  /** run_at - now() in seconds (now() of the reading transaction). */
  run_in: number;
  /** lease_expires_at - now() in seconds, or null without a lease. */
  lease_in: number | null;
  /** finished_at = now() (of the reading transaction). */
  finished_now: boolean;
}

/** The job as idemq.jobs shows it, plus its times relative to now(); throws when there is no such job. */
export async function jobRow(db: Queryable, id: string | number): Promise<JobRow> {
  const { rows } = await db.query<JobRow>(
    `SELECT j.*,
            extract(epoch FROM j.run_at - now())::float8 AS run_in,
            extract(epoch FROM j.lease_expires_at - now())::float8 AS lease_in,
            coalesce(j.finished_at = now(), false) AS finished_now
     FROM idemq.jobs j WHERE j.id = $1`,
    [String(id)],
  );
  if (rows.length !== 1) throw new Error(`job ${id} not found`);
  return rows[0]!;
}

/** The job's state, or undefined when there is no such job (e.g. after purge). */
export async function stateOf(db: Queryable, id: string | number): Promise<string | undefined> {
  const { rows } = await db.query<{ state: string }>("SELECT state::text AS state FROM idemq.jobs WHERE id = $1", [String(id)]);
  return rows[0]?.state;
}

/** state of each job, keyed by id. */
export async function states(db: Queryable, ids: readonly string[]): Promise<Record<string, string>> {
  const { rows } = await db.query<{ id: string; state: string }>(
    "SELECT id, state::text AS state FROM idemq.jobs WHERE id = ANY($1::bigint[])",
    [ids],
  );
  return Object.fromEntries(rows.map((row) => [row.id, row.state]));
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
