// No idemq call keeps the worker waiting for good (issue 11, item 4): the
// worker's calls go through timedCalls (pg's query_timeout; 30 s, see
// WORKER_DEFAULTS.callTimeout), so a call stuck behind a lock rejects after
// its timeout and the pool discards its connection. A table lock held by a
// superuser stands in for whatever could stall a call.
import pg from "pg";
import { describe, expect, it } from "vitest";
import * as sql from "../../src/sql/index.ts";
import { timedCalls } from "../../src/worker/worker-state.ts";
import { backendPid, useTestDatabase, waitUntilBlocking } from "../helpers/db.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 4 });


describe("every call the worker makes has a timeout", () => {
  it("a claim stuck behind a lock rejects after the timeout, and the pool drops its connection", async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    pool.on("error", () => {});
    const locker = await db.newClient();
    try {
      const lockerPid = await backendPid(locker);
      await locker.query("BEGIN");
      await locker.query("LOCK TABLE idemq.jobs IN ACCESS EXCLUSIVE MODE");
      const started = performance.now();
      const claim = sql.claim(timedCalls(pool, 300), { workerId: "w", batchSize: 1 });
      const failed = claim.then(
        () => undefined,
        (error: unknown) => error,
      );
      // The claim really waits on the lock (not an error of its own)...
      expect(await waitUntilBlocking(db.pool, lockerPid, { timeoutMs: 5_000 })).toHaveLength(1);
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
