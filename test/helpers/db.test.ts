// The test helpers themselves (test/helpers/db.ts): other tests rely on them
// to fail when they should.
import { describe, expect, it } from "vitest";
import { migrationStatus } from "../../src/migrate.ts";
import {
  backendPid,
  expectSqlError,
  freshDatabase,
  inRollback,
  interleave,
  sqlState,
  useTestDatabase,
  useTestDatabases,
  waitUntilBlocked,
  waitUntilBlocking,
} from "./db.ts";

const db = useTestDatabase();

const RAISE_IQ409 = `DO $$ BEGIN
  RAISE EXCEPTION 'duplicate job for key k' USING ERRCODE = 'IQ409',
    DETAIL = '{"key":"k","existing_job_id":7,"existing_state":"failed"}', HINT = 'use another key';
END $$`;

describe("freshDatabase", () => {
  it("clones the migrated template: every migration is applied", async () => {
    const status = await migrationStatus({ connectionString: db.url });
    expect(status.pending).toEqual([]);
    const { rows } = await db.pool.query("SELECT current_database() AS name");
    expect(rows[0].name).toBe(db.name);
  });

  it("gives each caller its own database, and drop() removes it", async () => {
    const other = await freshDatabase();
    expect(other.name).not.toBe(db.name);
    const client = await other.newClient();
    await client.query("SELECT 1");
    await other.drop();
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM pg_database WHERE datname = $1", [other.name]);
    expect(rows[0].n).toBe(0);
  });
});

async function databaseExists(name: string): Promise<boolean> {
  const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM pg_database WHERE datname = $1", [name]);
  return rows[0].n === 1;
}

// What the blocks below saw, read after their afterAll hooks have run.
const seen: { readEarly?: unknown; block?: string; made: string[] } = { made: [] };

describe("useTestDatabase", () => {
  const inBlock = useTestDatabase({ empty: true });
  try {
    seen.readEarly = inBlock.pool;
  } catch (error) {
    seen.readEarly = error;
  }

  it("is made in beforeAll: read before it, it throws; in a test, it is a database of its own", async () => {
    expect(seen.readEarly).toBeInstanceOf(Error);
    expect(String(seen.readEarly)).toMatch(/beforeAll/);
    seen.block = inBlock.name;
    expect(inBlock.name).not.toBe(db.name);
    const { rows } = await inBlock.pool.query("SELECT current_database() AS name, to_regnamespace('idemq') AS idemq");
    expect(rows[0]).toEqual({ name: inBlock.name, idemq: null });
    expect(await databaseExists(inBlock.name)).toBe(true);
  });
});

describe("useTestDatabases", () => {
  const makeDatabase = useTestDatabases();

  it("makes a database per call", async () => {
    const [a, b] = [await makeDatabase(), await makeDatabase({ empty: true })];
    seen.made.push(a.name, b.name);
    expect(a.name).not.toBe(b.name);
    expect((await a.pool.query("SELECT to_regnamespace('idemq') IS NOT NULL AS idemq")).rows[0].idemq).toBe(true);
    expect((await b.pool.query("SELECT to_regnamespace('idemq') IS NOT NULL AS idemq")).rows[0].idemq).toBe(false);
  });
});

describe("useTestDatabase and useTestDatabases, once their block is done", () => {
  it("have dropped every database they made", async () => {
    expect(seen.block).toBeDefined();
    expect(seen.made).toHaveLength(2);
    for (const name of [seen.block!, ...seen.made]) expect(await databaseExists(name), name).toBe(false);
  });
});

describe("inRollback", () => {
  it("rolls back after the callback returns, and after it throws", async () => {
    await db.pool.query("CREATE TABLE IF NOT EXISTS helper_rows (v int)");
    expect(await inRollback(db.pool, async (client) => (await client.query("INSERT INTO helper_rows VALUES (1)")).rowCount)).toBe(1);
    await expect(
      inRollback(db.pool, async (client) => {
        await client.query("INSERT INTO helper_rows VALUES (2)");
        throw new Error("callback failed");
      }),
    ).rejects.toThrow("callback failed");
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM helper_rows");
    expect(rows[0].n).toBe(0);
  });
});

describe("sqlState and expectSqlError", () => {
  it("read the SQLSTATE, DETAIL JSON fields and HINT", async () => {
    expect(await sqlState(db.pool.query("SELECT 1/0"))).toBe("22012");
    const error = await expectSqlError(db.pool.query(RAISE_IQ409), {
      code: "IQ409",
      detail: { key: "k", existing_state: "failed" },
      message: /duplicate job/,
      hint: "another key",
    });
    expect(error.detail).toContain('"existing_job_id":7');
  });

  it("fail on another SQLSTATE, another DETAIL field, or success", async () => {
    await expect(expectSqlError(db.pool.query(RAISE_IQ409), { code: "IQ410" })).rejects.toThrow();
    await expect(
      expectSqlError(db.pool.query(RAISE_IQ409), { code: "IQ409", detail: { existing_state: "succeeded" } }),
    ).rejects.toThrow();
    await expect(expectSqlError(db.pool.query("SELECT 1"), { code: "IQ409" })).rejects.toThrow(/succeeded/);
    await expect(sqlState(db.pool.query("SELECT 1"))).rejects.toThrow(/succeeded/);
  });
});

describe("waitUntilBlocked", () => {
  it("returns once a session waits on another's lock, naming the blocker", async () => {
    const holder = await db.newClient();
    const waiter = await db.newClient();
    const [holderPid, waiterPid] = await Promise.all([backendPid(holder), backendPid(waiter)]);
    await holder.query("BEGIN");
    await holder.query("SELECT pg_advisory_xact_lock(4242)");
    const waiting = waiter.query("SELECT pg_advisory_lock(4242) AS locked");
    expect(await waitUntilBlocked(db.pool, waiterPid)).toEqual([holderPid]);
    await holder.query("COMMIT");
    await waiting;
    await waiter.query("SELECT pg_advisory_unlock(4242)");
  });

  it("fails after its timeout when the session is not blocked", async () => {
    const idle = await db.newClient();
    await expect(waitUntilBlocked(db.pool, await backendPid(idle), { timeoutMs: 100 })).rejects.toThrow(/not blocked/);
  });
});

describe("waitUntilBlocking", () => {
  it("returns the sessions that wait on a lock the session holds", async () => {
    const holder = await db.newClient();
    const waiter = await db.newClient();
    const [holderPid, waiterPid] = await Promise.all([backendPid(holder), backendPid(waiter)]);
    await holder.query("BEGIN");
    await holder.query("SELECT pg_advisory_xact_lock(4243)");
    const waiting = waiter.query("SELECT pg_advisory_lock(4243) AS locked");
    expect(await waitUntilBlocking(db.pool, holderPid)).toEqual([waiterPid]);
    await holder.query("COMMIT");
    await waiting;
    await waiter.query("SELECT pg_advisory_unlock(4243)");
  });

  it("fails after its timeout when no session waits on it", async () => {
    const idle = await db.newClient();
    await expect(waitUntilBlocking(db.pool, await backendPid(idle), { timeoutMs: 100 })).rejects.toThrow(/no session waited/);
  });
});

describe("interleave", () => {
  // `first` holds the table in EXCLUSIVE mode: `second`'s UPDATE waits for it.
  async function run(v: number, end: "COMMIT" | "ROLLBACK", update = "v = v") {
    await db.pool.query("CREATE TABLE IF NOT EXISTS helper_interleave (v int)");
    const [first, second] = [await db.newClient(), await db.newClient()];
    return interleave(db.pool, {
      first,
      holds: async (c) => {
        await c.query("LOCK TABLE helper_interleave IN EXCLUSIVE MODE");
        return (await c.query<{ v: number }>("INSERT INTO helper_interleave VALUES ($1) RETURNING v", [v])).rows[0]!.v;
      },
      second,
      blocks: async (c) => (await c.query(`UPDATE helper_interleave SET ${update} WHERE v = $1`, [v])).rowCount,
      end,
    });
  }

  it.each([
    ["COMMIT", 1],
    ["ROLLBACK", 0],
  ] as const)("names first as the blocker, and second finishes after first's %s (sees %i rows)", async (end, rows) => {
    const v = end === "COMMIT" ? 1 : 2;
    const { held, firstPid, blockers, second } = await run(v, end);
    expect(held).toBe(v);
    expect(blockers).toEqual([firstPid]);
    expect(await second).toBe(rows);
  });

  it("hands back second's error to whoever awaits it", async () => {
    const { second } = await run(3, "COMMIT", "v = v / 0");
    expect(await sqlState(second)).toBe("22012");
  });
});
