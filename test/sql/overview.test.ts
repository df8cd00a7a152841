// idemq.overview(): the dashboard's read. Active counts, expired leases and
// the oldest runnable age equal stats()'s; recent finishes are counted inside
// the window only; terminal totals are exact up to exact_up_to and an
// estimate (flagged) beyond it. Each test rolls back, so counts are exact.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { makeJob } from "../helpers/jobs.ts";
import { buildZoo } from "../helpers/zoo.ts";

const db = useTestDatabase({ poolSize: 2 });

type Row = { queue: string | null; task: string | null; metric: string; value: number; exact: boolean };

async function overview(c: pg.ClientBase, args = ""): Promise<Row[]> {
  const { rows } = await c.query<{ queue: string | null; task: string | null; metric: string; value: string; exact: boolean }>(
    `SELECT * FROM idemq.overview(${args}) ORDER BY 1, 2, 3`,
  );
  return rows.map((r) => ({ ...r, value: Number(r.value) }));
}

const ACTIVE_METRICS = ["scheduled", "enqueued", "processing", "awaiting", "lease_expired", "oldest_runnable_seconds"];

describe("overview", () => {
  it("a database without jobs or events has no rows", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await overview(c)).toEqual([]);
    });
  });

  it("active counts, expired leases and the oldest runnable age are stats()'s, per queue and task", async () => {
    await inRollback(db.pool, async (c) => {
      await buildZoo(c);
      const { rows: stats } = await c.query<{ queue: string; task: string; metric: string; value: string }>(
        "SELECT * FROM idemq.stats() WHERE metric = ANY ($1) ORDER BY 1, 2, 3",
        [ACTIVE_METRICS],
      );
      const active = (await overview(c)).filter((r) => ACTIVE_METRICS.includes(r.metric));
      expect(active.map((r) => [r.queue, r.task, r.metric, r.value, r.exact])).toEqual(
        stats.map((r) => [r.queue, r.task, r.metric, Number(r.value), true]),
      );
      expect(active.map((r) => r.metric)).toEqual(expect.arrayContaining(["awaiting", "processing", "lease_expired", "enqueued", "scheduled"]));
    });
  });

  it("recent finishes count jobs finished within the window, not before it", async () => {
    await inRollback(db.pool, async (c) => {
      const zoo = await buildZoo(c);
      const early = await makeJob(c, { task: "old", queue: "old" });
      await c.query("SELECT idemq.cancel(job_id => $1)", [early]);
      // Just outside a 10-minute window, and the zoo's cancelled job just inside it.
      await c.query("UPDATE idemq.jobs SET finished_at = now() - interval '10 minutes 1 second' WHERE id = $1", [early]);
      await c.query("UPDATE idemq.jobs SET finished_at = now() - interval '9 minutes 59 seconds' WHERE id = $1", [zoo.cancelled.id]);
      const recent = (await overview(c, "recent => '10 minutes'")).filter((r) => r.metric.endsWith("_recent"));
      expect(recent.map((r) => [r.queue, r.metric, r.value])).toEqual([
        ["zoo.cancelled", "cancelled_recent", 1],
        ["zoo.expired", "expired_recent", 1],
        ["zoo.failed", "failed_recent", 1],
        ["zoo.succeeded", "succeeded_recent", 1],
      ]);
    });
  });

  it("terminal totals are exact up to exact_up_to and an estimate, flagged, above it", async () => {
    await inRollback(db.pool, async (c) => {
      for (let i = 0; i < 3; i++) await c.query("SELECT idemq.cancel(job_id => $1)", [await makeJob(c, { task: "t" })]);
      const totals = async (cap: number) =>
        (await overview(c, `exact_up_to => ${cap}`)).filter((r) => r.queue === null && r.task === null);
      expect(await totals(3)).toEqual([{ queue: null, task: null, metric: "cancelled", value: 3, exact: true }]);
      // Over the cap, never analysed (reltuples -1): the floor, cap + 1, unexact.
      expect(await totals(2)).toEqual([{ queue: null, task: null, metric: "cancelled", value: 3, exact: false }]);
      expect(await totals(0)).toEqual([{ queue: null, task: null, metric: "cancelled", value: 1, exact: false }]);
    });
  });

  it("refuses NULL arguments, a window that is not positive and a cap out of range", async () => {
    await inRollback(db.pool, async (c) => {
      await underSavepoint(c, () => expectSqlError(c.query("SELECT * FROM idemq.overview(recent => NULL)"), { code: "22004" }));
      await underSavepoint(c, () => expectSqlError(c.query("SELECT * FROM idemq.overview(recent => '0 seconds')"), { code: "22023" }));
      await underSavepoint(c, () => expectSqlError(c.query("SELECT * FROM idemq.overview(recent => '100000 days')"), { code: "22023" }));
      await underSavepoint(c, () => expectSqlError(c.query("SELECT * FROM idemq.overview(exact_up_to => -1)"), { code: "22023" }));
      await underSavepoint(c, () => expectSqlError(c.query("SELECT * FROM idemq.overview(exact_up_to => 10000001)"), { code: "22023" }));
    });
  });
});
