// The job zoo: one job in each of the 8 states, plus variants
// (a processing job whose lease ran out, a processing job on its last attempt,
// and the scheduled parent the awaiting job waits on), all made through the
// real functions. Direct UPDATEs only move timestamps into the past. Build it
// inside a test's rolled-back transaction; snapshot() before and after an
// operation, and changed() names exactly the rows that moved.
import { expect } from "vitest";
import { enqueue, sql, type EnqueueArgs, type Queryable } from "./jobs.ts";
import { claim, tokenArg, type ClaimedJob } from "./work.ts";

export const ZOO_NAMES = [
  "scheduled",
  "enqueued",
  "processing",
  "awaiting",
  "succeeded",
  "failed",
  "expired",
  "cancelled",
  "leaseExpired",
  "lastAttempt",
  "parent",
] as const;
export type ZooName = (typeof ZOO_NAMES)[number];

export interface ZooJob {
  id: string;
  /** The state it was built in. */
  state: string;
  /** Its own queue ("zoo.<name>"), so a claim can target it. */
  queue: string;
  /** Its idempotency key ("zoo:<name>"). */
  key: string;
  /** The attempt holding it (processing jobs), or the last attempt it had. */
  attempt: number;
}

export type Zoo = Record<ZooName, ZooJob>;

/** Every active zoo job (name and state), for table-driven tests. */
export const ACTIVE_ZOO: readonly ZooName[] = [
  "scheduled",
  "enqueued",
  "processing",
  "awaiting",
  "leaseExpired",
  "lastAttempt",
  "parent",
];
export const TERMINAL_ZOO: readonly ZooName[] = ["succeeded", "failed", "expired", "cancelled"];

/** A zoo job through the job factory: its own queue and key, payload {zoo: name}; `args` adds to them. */
async function enqueueZoo(c: Queryable, name: ZooName, args: EnqueueArgs = {}): Promise<string> {
  const zoo = { task: "zoo_task", payload: { zoo: name }, queue: `zoo.${name}`, idempotency_key: `zoo:${name}` };
  const made = await enqueue(c, { ...zoo, ...args });
  expect(made.deduplicated).toBe(false);
  return made.job_id;
}

async function claimQueue(c: Queryable, name: ZooName): Promise<ClaimedJob> {
  const rows = await claim(c, { worker_id: "zoo-worker", queues: [`zoo.${name}`] });
  expect(rows, `claim of zoo.${name}`).toHaveLength(1);
  return rows[0]!;
}

/** Builds the zoo on `c` (use the transaction of inRollback). */
export async function buildZoo(c: Queryable): Promise<Zoo> {
  const ids = {} as Record<ZooName, string>;
  const attempts = {} as Record<ZooName, number>;

  // First, while no lease has run out: rescue() expires every job past its deadline.
  ids.expired = await enqueueZoo(c, "expired", { expires_at: sql("now() - interval '1 second'") });
  await c.query("SELECT idemq.rescue()");

  ids.scheduled = await enqueueZoo(c, "scheduled", { run_at: sql("now() + interval '1 day'") });
  ids.enqueued = await enqueueZoo(c, "enqueued");
  ids.parent = await enqueueZoo(c, "parent", { run_at: sql("now() + interval '1 day'") });
  ids.awaiting = await enqueueZoo(c, "awaiting", { after: [ids.parent] });

  ids.processing = await enqueueZoo(c, "processing");
  attempts.processing = (await claimQueue(c, "processing")).attempt;

  ids.succeeded = await enqueueZoo(c, "succeeded");
  const succeeded = await claimQueue(c, "succeeded");
  attempts.succeeded = succeeded.attempt;
  // tokenArg passes the claim's lease token, which a zoo built at 0001 (install/upgrade.test.ts) has not.
  const succeededValues: unknown[] = [ids.succeeded, attempts.succeeded];
  await c.query(
    `SELECT idemq.complete(job_id => $1, attempt => $2, result => '{"ok": true}'${tokenArg(succeeded, "$1", succeededValues)})`,
    succeededValues,
  );

  // Failed by exhaustion: one attempt allowed, a retryable error.
  ids.failed = await enqueueZoo(c, "failed", { max_attempts: 1 });
  const failed = await claimQueue(c, "failed");
  attempts.failed = failed.attempt;
  const failedValues: unknown[] = [ids.failed, attempts.failed];
  await c.query(
    `SELECT idemq.fail(job_id => $1, attempt => $2, error => '{"class": "ZooError", "message": "boom"}'${tokenArg(failed, "$1", failedValues)})`,
    failedValues,
  );

  ids.cancelled = await enqueueZoo(c, "cancelled");
  await c.query("SELECT idemq.cancel(job_id => $1)", [ids.cancelled]);

  ids.leaseExpired = await enqueueZoo(c, "leaseExpired");
  attempts.leaseExpired = (await claimQueue(c, "leaseExpired")).attempt;
  await c.query(
    `UPDATE idemq.jobs SET locked_at = now() - interval '31 seconds', lease_expires_at = now() - interval '1 second'
      WHERE id = $1`,
    [ids.leaseExpired],
  );

  // Processing on its last attempt: 2 allowed, the first failed and was retried at once.
  ids.lastAttempt = await enqueueZoo(c, "lastAttempt", { max_attempts: 2 });
  const first = await claimQueue(c, "lastAttempt");
  const firstValues: unknown[] = [first.job_id, first.attempt];
  await c.query(
    `SELECT idemq.fail(job_id => $1, attempt => $2, error => '{"class": "ZooError", "message": "first"}', retry_at => now()${tokenArg(first, "$1", firstValues)})`,
    firstValues,
  );
  attempts.lastAttempt = (await claimQueue(c, "lastAttempt")).attempt;

  for (const name of ["scheduled", "enqueued", "parent", "awaiting", "expired", "cancelled"] as const) attempts[name] = 0;

  const zoo = Object.fromEntries(
    ZOO_NAMES.map((name) => [name, { id: ids[name], state: "", queue: `zoo.${name}`, key: `zoo:${name}`, attempt: attempts[name] }]),
  ) as Zoo;
  const snap = await snapshot(c, zoo);
  for (const name of ZOO_NAMES) zoo[name].state = snap.jobs[name]!.state as string;

  expect(Object.fromEntries(ZOO_NAMES.map((n) => [n, zoo[n].state]))).toEqual({
    scheduled: "scheduled",
    enqueued: "enqueued",
    processing: "processing",
    awaiting: "awaiting",
    succeeded: "succeeded",
    failed: "failed",
    expired: "expired",
    cancelled: "cancelled",
    leaseExpired: "processing",
    lastAttempt: "processing",
    parent: "scheduled",
  });
  expect(snap.jobs.lastAttempt).toMatchObject({ attempt: 2, max_attempts: 2 });
  return zoo;
}

export interface ZooSnapshot {
  /** Each zoo job's full row (jsonb), by name. */
  jobs: Record<ZooName, Record<string, unknown>>;
  /** Each zoo key's ledger row, by job name (undefined when absent). */
  keys: Record<ZooName, Record<string, unknown> | undefined>;
  /** Rows of idemq.jobs that are not zoo jobs (by id), so nothing else moves unnoticed. */
  others: Record<string, Record<string, unknown>>;
  dependencies: string[];
}

/** Reads every job, key and dependency row. */
export async function snapshot(c: Queryable, zoo: Pick<Zoo, ZooName>): Promise<ZooSnapshot> {
  const jobs = await c.query<{ id: string; row: Record<string, unknown> }>("SELECT j.id, to_jsonb(j) AS row FROM idemq.jobs j");
  const keys = await c.query<{ key: string; row: Record<string, unknown> }>("SELECT k.key, to_jsonb(k) AS row FROM idemq.keys k");
  const deps = await c.query<{ d: string }>(
    "SELECT d.parent_id || '->' || d.child_id AS d FROM idemq.job_dependencies d ORDER BY d.parent_id, d.child_id",
  );
  const byId = new Map(jobs.rows.map((r) => [r.id, r.row]));
  const byKey = new Map(keys.rows.map((r) => [r.key, r.row]));
  const zooIds = new Set(ZOO_NAMES.map((n) => zoo[n].id));
  return {
    jobs: Object.fromEntries(ZOO_NAMES.map((n) => [n, byId.get(zoo[n].id)!])) as ZooSnapshot["jobs"],
    keys: Object.fromEntries(ZOO_NAMES.map((n) => [n, byKey.get(`zoo:${n}`)])) as ZooSnapshot["keys"],
    others: Object.fromEntries(jobs.rows.filter((r) => !zooIds.has(r.id)).map((r) => [r.id, r.row])),
    dependencies: deps.rows.map((r) => r.d),
  };
}

export interface ZooChanges {
  /** Zoo jobs whose row changed. */
  jobs: ZooName[];
  /** Zoo keys whose ledger row changed. */
  keys: ZooName[];
  /** Ids of other jobs that appeared, vanished or changed. */
  others: string[];
  dependencies: { removed: string[]; added: string[] };
}

/** What differs between two snapshots. */
export function changed(before: ZooSnapshot, after: ZooSnapshot): ZooChanges {
  const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);
  const otherIds = new Set([...Object.keys(before.others), ...Object.keys(after.others)]);
  return {
    jobs: ZOO_NAMES.filter((n) => !same(before.jobs[n], after.jobs[n])),
    keys: ZOO_NAMES.filter((n) => !same(before.keys[n], after.keys[n])),
    others: [...otherIds].filter((id) => !same(before.others[id], after.others[id])),
    dependencies: {
      removed: before.dependencies.filter((d) => !after.dependencies.includes(d)),
      added: after.dependencies.filter((d) => !before.dependencies.includes(d)),
    },
  };
}

/** Asserts that exactly `jobs` (and `keys`, default none) changed, and nothing else did. */
export function expectOnlyChanged(
  before: ZooSnapshot,
  after: ZooSnapshot,
  expected: { jobs: ZooName[]; keys?: ZooName[]; dependenciesRemoved?: string[] },
): void {
  const diff = changed(before, after);
  expect(diff.jobs.sort(), "zoo jobs that changed").toEqual([...expected.jobs].sort());
  expect(diff.keys.sort(), "zoo keys that changed").toEqual([...(expected.keys ?? [])].sort());
  expect(diff.others, "other jobs that changed").toEqual([]);
  expect(diff.dependencies, "dependency rows").toEqual({ removed: expected.dependenciesRemoved ?? [], added: [] });
}
