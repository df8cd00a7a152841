// A key's next waiting job is found through jobs_key_waiting, whatever the
// statistics say. The planner trap this holds off (migration 0002, DROP INDEX
// jobs_awaiting): statistics taken while nothing waited, then a keyed
// backlog, and an index of every awaiting job let each
// key's lookup walk the whole backlog and filter the key, so admitting a
// key's job cost time in proportion to every other key's waiting jobs.
import { expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueueMany, stateOf } from "../helpers/jobs.ts";

const db = useTestDatabase();

const ADMITTED = 2000;
const BACKLOG = 500;

it("admitting a new key's job (enqueue_many) reads none of another key's waiting backlog, though the statistics were taken when nothing waited", async () => {
  // Keyed jobs, each admitted (a key of its own): the statistics know the key
  // column, and no waiting job.
  await enqueueMany(
    db.pool,
    Array.from({ length: ADMITTED }, (_, i) => ({ task: "test_task", queue: "old", concurrency_key: `old-${i}`, payload: { i } })),
  );
  await db.pool.query("ANALYZE idemq.jobs");
  // One key: its first job admitted, BACKLOG waiting behind it.
  await enqueueMany(
    db.pool,
    Array.from({ length: BACKLOG + 1 }, (_, i) => ({ task: "test_task", queue: "backlog", concurrency_key: "busy", payload: { i } })),
  );

  // A connection that has read nothing else: pg_stat_get_xact_* also count a
  // backend's earlier transactions whose statistics it has not reported yet
  // (on PostgreSQL 15, the enqueues above, through the pool).
  const c = await db.newClient();
  await c.query("BEGIN");
  // enqueue_many admits through _key_promote, as completions do.
  const [row] = await enqueueMany(c, [{ task: "test_task", queue: "fresh", concurrency_key: "fresh-key" }]);
  const id = row!.job_id!;
  // Rows fetched through any index of idemq.jobs (counted on each index).
  const { rows } = await c.query<{ n: string }>(
    "SELECT sum(pg_stat_get_xact_tuples_fetched(i.indexrelid)) AS n FROM pg_index i WHERE i.indrelid = 'idemq.jobs'::regclass",
  );
  const fetched = Number(rows[0]!.n);
  const state = await stateOf(c, id);
  await c.query("ROLLBACK");
  expect(state).toBe("enqueued");
  expect(fetched).toBeLessThan(BACKLOG);
});
