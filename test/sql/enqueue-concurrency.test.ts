// Concurrent enqueues of one idempotency key (the key ledger's primary key
// serialises them; see _resolve_keys): exactly one job, every caller gets its
// id, never NULL, also when the first inserter rolls back. Real connections
// running in parallel; blocking is confirmed with pg_blocking_pids.
import type pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { backendPid, interleave, useTestDatabase, waitUntilBlocked } from "../helpers/db.ts";
import { count, enqueue, enqueueMany, jobRow, unique, type Enqueued } from "../helpers/jobs.ts";

const CONNECTIONS = 50;

const db = useTestDatabase();
let clients: pg.Client[];
// Backend pids, read while each client is idle (a client runs one query at a time).
const pids = new Map<pg.Client, number>();
function pidOf(c: pg.Client): number {
  return pids.get(c)!;
}
beforeAll(async () => {
  clients = [];
  // One at a time: a burst of 50 connection starts is not what is under test.
  for (let i = 0; i < CONNECTIONS; i++) {
    const c = await db.newClient();
    clients.push(c);
    pids.set(c, await backendPid(c));
  }
});

async function jobsWithKey(key: string): Promise<number> {
  return count(db.pool, "SELECT 1 FROM idemq.jobs WHERE idempotency_key = $1", [key]);
}

describe("one key, many connections", () => {
  it(`${CONNECTIONS} concurrent enqueues of one key create exactly one job, and all ${CONNECTIONS} get its id`, async () => {
    const key = unique("k");
    const results = await Promise.all(
      clients.map((c) => enqueue(c, { task: "charge", payload: { order: 1 }, idempotency_key: key })),
    );
    expect(await jobsWithKey(key)).toBe(1);
    const { rows } = await db.pool.query<{ id: string }>("SELECT id FROM idemq.jobs WHERE idempotency_key = $1", [key]);
    const id = rows[0]!.id;
    expect(results.map((r) => r.job_id)).toEqual(Array(CONNECTIONS).fill(id));
    expect(results.filter((r) => !r.deduplicated)).toHaveLength(1);
    expect(results.filter((r) => r.deduplicated)).toHaveLength(CONNECTIONS - 1);
    const counted = await db.pool.query(
      "SELECT sum(n) AS n FROM idemq.counters WHERE task = 'charge' AND event = 'deduplicated'",
    );
    expect(Number(counted.rows[0]?.n)).toBe(CONNECTIONS - 1);
  });

  it("while the first inserter's transaction is open the others block; it rolls back; exactly one job, every waiter has its id", async () => {
    const key = unique("k");
    const [first, ...waiters] = clients as [pg.Client, ...pg.Client[]];
    const work = { task: "refund", payload: { order: 2 }, idempotency_key: key };

    await first.query("BEGIN");
    const doomed = await enqueue(first, work);
    expect(doomed.deduplicated).toBe(false);

    const pending = waiters.map((c) => enqueue(c, work));
    // Keep rejections observed while we wait, so none goes unhandled.
    const settled = Promise.allSettled(pending);
    const firstPid = pidOf(first);
    for (const c of waiters) {
      const blockers = await waitUntilBlocked(db.pool, pidOf(c));
      expect(blockers).toContain(firstPid);
    }
    await first.query("ROLLBACK");

    const outcomes = await settled;
    const results = outcomes.map((o) => {
      if (o.status === "rejected") throw o.reason;
      return o.value;
    });
    expect(await jobsWithKey(key)).toBe(1);
    const { rows } = await db.pool.query<{ id: string }>("SELECT id FROM idemq.jobs WHERE idempotency_key = $1", [key]);
    const id = rows[0]!.id;
    expect(id).not.toBe(doomed.job_id);
    expect(results.every((r: Enqueued) => r.job_id === id)).toBe(true);
    expect(results.filter((r) => !r.deduplicated)).toHaveLength(1);
    expect((await jobRow(db.pool, id)).state).toBe("enqueued");
    const ledger = await db.pool.query("SELECT job_id FROM idemq.keys WHERE key = $1", [key]);
    expect(ledger.rows).toEqual([{ job_id: id }]);
  });

  it("while the first inserter's transaction is open the others block; it commits; every waiter gets its job, deduplicated", async () => {
    const key = unique("k");
    const [first, ...waiters] = clients.slice(0, 10) as [pg.Client, ...pg.Client[]];
    const work = { task: "refund", payload: { order: 3 }, idempotency_key: key };

    await first.query("BEGIN");
    const created = await enqueue(first, work);
    const settled = Promise.allSettled(waiters.map((c) => enqueue(c, work)));
    for (const c of waiters) await waitUntilBlocked(db.pool, pidOf(c));
    await first.query("COMMIT");

    const results = (await settled).map((o) => {
      if (o.status === "rejected") throw o.reason;
      return o.value;
    });
    expect(results).toEqual(Array(waiters.length).fill({ job_id: created.job_id, deduplicated: true }));
    expect(await jobsWithKey(key)).toBe(1);
  });

  it("a waiter for different work under the same key gets IQ422 once the first inserter commits", async () => {
    const key = unique("k");
    const [first, second] = clients as [pg.Client, pg.Client];
    const run = await interleave(db.pool, {
      first,
      holds: (c) => enqueue(c, { task: "refund", payload: { order: 4 }, idempotency_key: key }),
      second,
      blocks: (c) =>
        enqueue(c, { task: "refund", payload: { order: 5 }, idempotency_key: key }).then(
          () => undefined,
          (error: unknown) => error as { code?: string; detail?: string },
        ),
      end: "COMMIT",
    });
    const created = run.held;
    const error = await run.second;
    expect(error?.code).toBe("IQ422");
    expect(JSON.parse(error?.detail ?? "{}")).toMatchObject({ key, existing_job_id: Number(created.job_id) });
  });
});

describe("one key whose job is terminal, many connections", () => {
  it(`${CONNECTIONS} concurrent enqueues after a failed job take the key over exactly once`, async () => {
    const key = unique("k");
    const queue = unique("q");
    const work = { task: "charge", payload: { order: 6 }, idempotency_key: key, queue };
    const old = await enqueue(db.pool, work);
    const claimed = await db.pool.query("SELECT job_id AS id, attempt FROM idemq.claim(worker_id => 'w', queues => ARRAY[$1])", [
      queue,
    ]);
    await db.pool.query("SELECT idemq.fail($1, $2, '{\"message\": \"no\"}', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), retryable => false)", [
      old.job_id,
      claimed.rows[0].attempt,
    ]);
    expect((await jobRow(db.pool, old.job_id)).state).toBe("failed");

    const results = await Promise.all(clients.map((c) => enqueue(c, work)));
    expect(await jobsWithKey(key)).toBe(2);
    const fresh = results.find((r) => !r.deduplicated)!;
    expect(fresh.job_id).not.toBe(old.job_id);
    expect(results.filter((r) => !r.deduplicated)).toHaveLength(1);
    expect(results.every((r) => r.job_id === fresh.job_id)).toBe(true);
  });
});

describe("enqueue_many batches with overlapping keys", () => {
  // 60 keys: batches under 64 elements insert keys with ON CONFLICT; 90: a
  // plain INSERT first, rolled back when a key exists (_resolve_keys).
  it.each([60, 90])("20 concurrent batches of %i keys over 100 shared keys (each in its own order) make one job per key", async (size) => {
    const prefix = unique("bk");
    const keys = Array.from({ length: 100 }, (_, i) => `${prefix}-${String(i).padStart(3, "0")}`);
    const batches = clients.slice(0, 20).map((c, b) => {
      // Each batch takes `size` of the keys, rotated and reversed differently, plus unkeyed jobs.
      const mine = keys.map((_, i) => keys[(i * 7 + b * 13) % keys.length]!).slice(0, size);
      if (b % 2 === 1) mine.reverse();
      const jobs = [
        ...mine.map((k) => ({ task: "sync", payload: { k }, idempotency_key: k, queue: prefix })),
        { task: "sync", payload: { unkeyed: b }, queue: prefix },
      ];
      return { c, jobs };
    });
    const results = await Promise.all(batches.map(({ c, jobs }) => enqueueMany(c, jobs)));

    const { rows } = await db.pool.query<{ idempotency_key: string; ids: string[] }>(
      `SELECT idempotency_key, array_agg(id::text) AS ids FROM idemq.jobs
       WHERE queue = $1 AND idempotency_key IS NOT NULL GROUP BY 1`,
      [prefix],
    );
    const used = new Set(batches.flatMap(({ jobs }) => jobs.flatMap((j) => ("idempotency_key" in j ? [j.idempotency_key] : []))));
    expect(rows).toHaveLength(used.size);
    expect(rows.every((r) => r.ids.length === 1)).toBe(true);
    const idOf = new Map(rows.map((r) => [r.idempotency_key, r.ids[0]!]));

    let created = 0;
    batches.forEach(({ jobs }, b) => {
      const result = results[b]!;
      expect(result.map((r) => r.ordinal)).toEqual(jobs.map((_, i) => i + 1));
      jobs.forEach((j, i) => {
        const row = result[i]!;
        if ("idempotency_key" in j) {
          expect(row.job_id).toBe(idOf.get(j.idempotency_key));
          expect(["created", "deduplicated"]).toContain(row.outcome);
          if (row.outcome === "created") created++;
        } else {
          expect(row.outcome).toBe("created");
        }
      });
    });
    // Every key was created by exactly one element of one batch.
    expect(created).toBe(used.size);
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE queue = $1 AND idempotency_key IS NULL", [prefix])).toBe(20);
  });

  // A batch of 64 or more tries a plain INSERT of its keys first: it waits
  // for an open inserter of one of them like ON CONFLICT does, and then
  // decides that key from what the inserter did.
  it.each(["COMMIT", "ROLLBACK"] as const)(
    "a batch of 100 new keys waits for an open enqueue of its 50th key; that one %ss; one job per key, the batch's outcomes follow",
    async (ending) => {
      const [first, second] = clients as [pg.Client, pg.Client];
      const prefix = unique("wb");
      const jobs = Array.from({ length: 100 }, (_, i) => ({
        task: "sync",
        payload: { i },
        idempotency_key: `${prefix}-${String(i).padStart(3, "0")}`,
      }));
      const run = await interleave(db.pool, {
        first,
        holds: (c) => enqueue(c, jobs[49]!),
        second,
        blocks: (c) => enqueueMany(c, jobs),
        end: ending,
      });
      expect(run.blockers).toContain(run.firstPid);
      const held = run.held;
      const batch = await run.second;
      const expected = jobs.map((_, i) => (i === 49 && ending === "COMMIT" ? "deduplicated" : "created"));
      expect(batch.map((r) => r.outcome)).toEqual(expected);
      if (ending === "COMMIT") expect(batch[49]!.job_id).toBe(held.job_id);
      else expect(batch[49]!.job_id).not.toBe(held.job_id);
      const { rows } = await db.pool.query<{ key: string; job_id: string }>(
        "SELECT key, job_id::text FROM idemq.keys WHERE starts_with(key, $1) ORDER BY key",
        [prefix],
      );
      expect(rows).toEqual(jobs.map((j, i) => ({ key: j.idempotency_key, job_id: batch[i]!.job_id })));
      expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE starts_with(idempotency_key, $1)", [prefix])).toBe(100);
    },
  );
});

