// No idemq call keeps the worker waiting for good (issue 11, item 4): the
// worker's calls go through timedCalls (pg's query_timeout; 30 s, see
// WORKER_DEFAULTS.callTimeout), so a call stuck behind a lock rejects after
// its timeout and the pool discards its connection. A table lock held by a
// superuser stands in for whatever could stall a call.
import pg from "pg";
import { describe, expect, it } from "vitest";
import * as sql from "../../src/sql-api.ts";
import { timedCalls } from "../../src/worker/worker-state.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 4 });


/** How many sessions of this database wait on a lock held by `pid` (pg_blocking_pids). */
async function blockedBy(pid: number): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND $1 = ANY (pg_blocking_pids(pid))",
    [pid],
  );
  return rows[0]!.n;
}

describe("every call the worker makes has a timeout", () => {
  it("a claim stuck behind a lock rejects after the timeout, and the pool drops its connection", async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    pool.on("error", () => {});
    const locker = await db.newClient();
    try {
      const { rows } = await locker.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
      await locker.query("BEGIN");
      await locker.query("LOCK TABLE idemq.jobs IN ACCESS EXCLUSIVE MODE");
      const started = performance.now();
      const claim = sql.claim(timedCalls(pool, 300), { workerId: "w", batchSize: 1 });
      const failed = claim.then(
        () => undefined,
        (error: unknown) => error,
      );
      // The claim really waits on the lock (not an error of its own)...
      await waitFor(async () => (await blockedBy(rows[0]!.pid)) === 1, { what: "the claim to wait on the lock", timeoutMs: 5_000 });
      // ...and is abandoned after its timeout, with its connection.
      const error = await failed;
      const elapsed = performance.now() - started;
      expect(error).toBeInstanceOf(Error);
      expect(String((error as Error).message)).toMatch(/timeout/i);
      expect(elapsed).toBeGreaterThanOrEqual(290);
      expect(elapsed).toBeLessThan(3_000);
      await waitFor(() => pool.totalCount === 0, { what: "the pool to drop the timed-out connection", timeoutMs: 5_000 });
      await locker.query("ROLLBACK");
      // The pool works again once the lock is gone.
      expect(await sql.claim(timedCalls(pool, 5_000), { workerId: "w", batchSize: 1 })).toEqual([]);
    } finally {
      await locker.query("ROLLBACK").catch(() => {});
      await pool.end();
    }
  });
});
