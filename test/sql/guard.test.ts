// idemq.guard(key, task): the guard row of a database effect, committed in
// the caller's transaction. Proven here: N deliveries -> one effect under real
// concurrency, the blocking interleavings (commit -> false, rollback -> true),
// counting of duplicates in stats(), and bad keys.
import type pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { expectSqlError, inRollback, interleave, useTestDatabase } from "../helpers/db.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import * as sqlApi from "../../src/sql/index.ts";

const db = useTestDatabase({ poolSize: 4 });

beforeAll(async () => {
  await db.pool.query("CREATE TABLE public.ledger (key text NOT NULL, delivery int NOT NULL)");
});

async function guard(client: pg.ClientBase, key: string | null, task: string | null = null): Promise<boolean> {
  const { rows } = await client.query<{ ok: boolean }>("SELECT idemq.guard(key => $1, task => $2) AS ok", [key, task]);
  return rows[0]!.ok;
}

async function guardDuplicates(client: pg.ClientBase | pg.Pool, task: string): Promise<number> {
  const { rows } = await client.query<{ n: string }>(
    "SELECT coalesce(sum(value), 0) AS n FROM idemq.stats() WHERE metric = 'guard_duplicate' AND task = $1 AND queue IS NULL",
    [task],
  );
  return Number(rows[0]!.n);
}

describe("guard: many deliveries on real connections", () => {
  it("300 concurrent deliveries of 100 keys (3 each) on 20 connections: 100 ledger rows, 200 false, guard_duplicate 200", async () => {
    const keys = Array.from({ length: 100 }, (_, i) => `credit:order-${i}`);
    // The three deliveries of a key sit next to each other, so different
    // connections pick them up at the same moment and really contend.
    const deliveries = keys.flatMap((key) => [key, key, key]).map((key, delivery) => ({ key, delivery }));
    const clients = await Promise.all(Array.from({ length: 20 }, () => db.newClient()));

    let next = 0;
    const answers: boolean[] = [];
    await Promise.all(
      clients.map(async (client) => {
        for (let d = deliveries[next++]; d !== undefined; d = deliveries[next++]) {
          await client.query("BEGIN");
          try {
            const ok = await guard(client, d.key, "credit");
            if (ok) await client.query("INSERT INTO public.ledger (key, delivery) VALUES ($1, $2)", [d.key, d.delivery]);
            await client.query("COMMIT");
            answers.push(ok);
          } catch (error) {
            await client.query("ROLLBACK");
            throw error;
          }
        }
      }),
    );
    await Promise.all(clients.map((c) => c.end()));

    expect(answers).toHaveLength(300);
    expect(answers.filter((a) => a)).toHaveLength(100);
    expect(answers.filter((a) => !a)).toHaveLength(200);
    const ledger = await db.pool.query<{ rows: number; keys: number }>(
      "SELECT count(*)::int AS rows, count(DISTINCT key)::int AS keys FROM public.ledger",
    );
    expect(ledger.rows[0]).toEqual({ rows: 100, keys: 100 });
    const processed = await db.pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM idemq.processed WHERE key = ANY ($1)",
      [keys],
    );
    expect(processed.rows[0]!.n).toBe(100);
    expect(await guardDuplicates(db.pool, "credit")).toBe(200);
  });
});

describe("guard: deterministic interleavings", () => {
  it("B's guard blocks on A's open transaction; A commits -> B gets false", async () => {
    const [a, b] = await Promise.all([db.newClient(), db.newClient()]);
    const key = "interleave:commit";
    const run = await interleave(db.pool, {
      first: a,
      holds: async (c) => {
        expect(await guard(c, key, "interleave")).toBe(true);
        await b.query("BEGIN");
      },
      second: b,
      blocks: (c) => guard(c, key, "interleave"),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    expect(await run.second).toBe(false);
    await b.query("COMMIT");

    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.processed WHERE key = $1", [key]);
    expect(rows[0].n).toBe(1);
    expect(await guardDuplicates(db.pool, "interleave")).toBe(1);
  });

  it("B's guard blocks on A's open transaction; A rolls back -> B gets true and owns the key", async () => {
    const [a, b] = await Promise.all([db.newClient(), db.newClient()]);
    const key = "interleave:rollback";
    const run = await interleave(db.pool, {
      first: a,
      holds: async (c) => {
        expect(await guard(c, key, "interleave-rb")).toBe(true);
        await b.query("BEGIN");
      },
      second: b,
      blocks: (c) => guard(c, key, "interleave-rb"),
      end: "ROLLBACK",
    });
    expect(await run.second).toBe(true);
    await b.query("COMMIT");

    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.processed WHERE key = $1", [key]);
    expect(rows[0].n).toBe(1);
    expect(await guardDuplicates(db.pool, "interleave-rb")).toBe(0);
    // A third delivery after B committed is a duplicate.
    expect(await guard(a, key, "interleave-rb")).toBe(false);
  });

  it("under REPEATABLE READ the blocked second caller raises 40001 when the first commits (header: retry)", async () => {
    const [a, b] = await Promise.all([db.newClient(), db.newClient()]);
    const key = "interleave:repeatable-read";
    const run = await interleave(db.pool, {
      first: a,
      holds: async (c) => {
        expect(await guard(c, key)).toBe(true);
        await b.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
        await b.query("SELECT 1"); // take the snapshot before A commits
      },
      second: b,
      blocks: (c) => expectSqlError(guard(c, key), { code: "40001" }),
      end: "COMMIT",
    });
    await run.second;
    await b.query("ROLLBACK");
  });
});

describe("guard: answers within one database", () => {
  it("a committed key answers false to every later delivery; a rolled-back one leaves no row", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await guard(c, "seq:1")).toBe(true);
      expect(await guard(c, "seq:1")).toBe(false);
      expect(await guard(c, "seq:2")).toBe(true);
    });
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.processed WHERE key LIKE 'seq:%'");
    expect(rows[0].n).toBe(0);
  });

  it("without a task a duplicate is not counted in stats()", async () => {
    await inRollback(db.pool, async (c) => {
      const before = await c.query("SELECT count(*)::int AS n FROM idemq.counters");
      expect(await guard(c, "untasked")).toBe(true);
      expect(await guard(c, "untasked")).toBe(false);
      const after = await c.query("SELECT count(*)::int AS n FROM idemq.counters");
      expect(after.rows[0].n).toBe(before.rows[0].n);
    });
  });

  it("a first delivery (true) is not counted as a duplicate", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await guard(c, "first-only", "first-only")).toBe(true);
      expect(await guardDuplicates(c, "first-only")).toBe(0);
      expect(await guard(c, "first-only", "first-only")).toBe(false);
      expect(await guardDuplicates(c, "first-only")).toBe(1);
    });
  });
});

// The worker sends BEGIN with guard() and complete() with COMMIT as one
// simple-protocol string each, its arguments inlined as escaped literals.
describe("guard and complete inlined with BEGIN / COMMIT (src/sql/effects.ts, src/sql/attempts.ts)", () => {
  it("keys, tasks and results with quotes, backslashes and non-ASCII arrive exactly", async () => {
    const c = await db.pool.connect();
    try {
      const key = `it's a \\ "key" é ✓ $1 ; COMMIT; --`;
      const task = `task 'q' \\n`;
      const { rows: jobRows } = await c.query(
        "SELECT job_id FROM idemq.enqueue(task => 'inline', payload => '{}')",
      );
      const [claimed] = (await c.query("SELECT job_id AS id, attempt, lease_token FROM idemq.claim('w', NULL, 1)")).rows;
      expect(claimed.id).toBe(jobRows[0].job_id);
      expect(await sqlApi.beginWithGuard(c, key, task)).toBe(true);
      const result = { quote: "it's", backslash: "a\\b", nested: [1, { x: null }], text: "é ✓" };
      await sqlApi.completeAndCommit(c, claimed.id, claimed.attempt, claimed.lease_token, JSON.stringify(result));
      const { rows } = await c.query("SELECT key FROM idemq.processed WHERE key = $1", [key]);
      expect(rows).toEqual([{ key }]);
      const { rows: done } = await c.query("SELECT state, result FROM idemq.jobs WHERE id = $1", [claimed.id]);
      expect(done).toEqual([{ state: "succeeded", result }]);
      // The same key again: false, and the transaction is open until the caller ends it.
      expect(await sqlApi.beginWithGuard(c, key, task)).toBe(false);
      expect((await c.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = pg_backend_pid() AND xact_start IS NOT NULL")).rows[0].n).toBe(1);
      await c.query("ROLLBACK");
    } finally {
      c.release();
    }
  });

  it("a fenced complete that fails does not run the COMMIT after it: the transaction is aborted, its writes roll back", async () => {
    const c = await db.pool.connect();
    try {
      await c.query("SELECT idemq.enqueue(task => 'inline-fenced', payload => '{}')");
      const [claimed] = (await c.query("SELECT job_id AS id, attempt, lease_token FROM idemq.claim('w', ARRAY['default'], 1)")).rows;
      expect(await sqlApi.beginWithGuard(c, "inline-fenced:1")).toBe(true);
      await expect(sqlApi.completeAndCommit(c, claimed.id, claimed.attempt + 1, claimed.lease_token)).rejects.toMatchObject({ code: "IQ410" });
      await expect(c.query("SELECT 1")).rejects.toMatchObject({ code: "25P02" });
      await c.query("ROLLBACK");
      const { rows } = await c.query("SELECT count(*)::int AS n FROM idemq.processed WHERE key = 'inline-fenced:1'");
      expect(rows[0].n).toBe(0);
    } finally {
      c.release();
    }
  });
});

describe("guard: bad input", () => {
  it("NULL key -> 22004 with a HINT; empty key -> 22023; empty task -> 22023; nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const count = async () =>
        (await c.query("SELECT (SELECT count(*) FROM idemq.processed) + (SELECT count(*) FROM idemq.counters) AS n")).rows[0].n;
      const before = await count();
      const sql = "SELECT idemq.guard(key => $1, task => $2)";
      await expectSqlError(underSavepoint(c, () => c.query(sql, [null, "t"])), { code: "22004", hint: /key/ });
      await expectSqlError(underSavepoint(c, () => c.query(sql, ["", "t"])), { code: "22023", hint: /key/ });
      await expectSqlError(underSavepoint(c, () => c.query(sql, ["k", ""])), { code: "22023", hint: /task/ });
      expect(await count()).toBe(before);
    });
  });
});
