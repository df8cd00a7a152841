// idemq.counters is append-only: counting a duplicate takes no row lock that
// outlives the statement, so transactions that count events for the same task
// never wait for each other (an upserted counter row queued them, and two
// transactions counting tasks x then y and y then x deadlocked).
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";

const db = useTestDatabase({ poolSize: 4 });

async function metric(task: string, name: string): Promise<number> {
  const { rows } = await db.pool.query<{ value: string }>(
    "SELECT value FROM idemq.stats() WHERE task = $1 AND metric = $2",
    [task, name],
  );
  return rows.length === 0 ? 0 : Number(rows[0]!.value);
}

describe("counters", () => {
  it("two open transactions deduplicating tasks x, y and y, x in opposite orders neither block nor deadlock", async () => {
    for (const t of ["x", "y"]) {
      await db.pool.query("SELECT idemq.enqueue(task => $1, idempotency_key => $2)", [t, `held-${t}`]);
    }
    const a = await db.newClient();
    const b = await db.newClient();
    // A lock wait would surface as this error rather than as a hung test.
    await a.query("SET lock_timeout = '2s'");
    await b.query("SET lock_timeout = '2s'");
    await a.query("BEGIN");
    await b.query("BEGIN");
    const dedupe = (c: typeof a, t: string) =>
      c.query<{ deduplicated: boolean }>("SELECT deduplicated FROM idemq.enqueue(task => $1, idempotency_key => $2)", [t, `held-${t}`]);
    expect((await dedupe(a, "x")).rows[0]!.deduplicated).toBe(true);
    expect((await dedupe(b, "y")).rows[0]!.deduplicated).toBe(true);
    expect((await dedupe(a, "y")).rows[0]!.deduplicated).toBe(true);
    expect((await dedupe(b, "x")).rows[0]!.deduplicated).toBe(true);
    await a.query("COMMIT");
    await b.query("COMMIT");
    expect(await metric("x", "deduplicated")).toBe(2);
    expect(await metric("y", "deduplicated")).toBe(2);
  });

  it("guard duplicates for one task in two open transactions do not wait for each other", async () => {
    await db.pool.query("SELECT idemq.guard(key => 'g-1'), idemq.guard(key => 'g-2')");
    const a = await db.newClient();
    const b = await db.newClient();
    await a.query("SET lock_timeout = '2s'");
    await b.query("SET lock_timeout = '2s'");
    await a.query("BEGIN");
    await b.query("BEGIN");
    expect((await a.query("SELECT idemq.guard(key => 'g-1', task => 'credit') AS ok")).rows[0].ok).toBe(false);
    expect((await b.query("SELECT idemq.guard(key => 'g-2', task => 'credit') AS ok")).rows[0].ok).toBe(false);
    await a.query("COMMIT");
    await b.query("COMMIT");
    expect(await metric("credit", "guard_duplicate")).toBe(2);
  });

  it("prune_keys folds the rows of each (task, event) into one and stats() sums stay the same", async () => {
    for (let i = 0; i < 3; i++) {
      await db.pool.query("SELECT idemq.enqueue(task => 'fold', idempotency_key => 'fold-key')");
    }
    const before = await metric("fold", "deduplicated");
    expect(before).toBe(2);
    await db.pool.query("SELECT idemq.prune_keys()");
    expect(await metric("fold", "deduplicated")).toBe(before);
    const { rows } = await db.pool.query<{ n: string }>(
      "SELECT count(*) AS n FROM idemq.counters WHERE task = 'fold' AND event = 'deduplicated'",
    );
    expect(Number(rows[0]!.n)).toBe(1);
  });
});
