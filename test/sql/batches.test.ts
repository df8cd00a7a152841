// idemq.enqueue_batch: jobs and a callback job that runs once, when all of
// them have finished (or, with fail_fast, at the first that did not
// succeed), reading their outcomes with children(); a key on the callback
// makes the batch idempotent.
import { describe, expect, it } from "vitest";
import { expectSqlError, inRollback, useTestDatabase } from "../helpers/db.ts";
import { stateOf, unique, type Queryable } from "../helpers/jobs.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { claimJobRow } from "../helpers/work.ts";

const db = useTestDatabase();

interface BatchRow {
  ordinal: number;
  job_id: string | null;
  outcome: string;
}

async function batch(c: Queryable, jobs: unknown, callback: unknown, failFast = false): Promise<BatchRow[]> {
  const { rows } = await c.query<BatchRow>("SELECT * FROM idemq.enqueue_batch(jobs => $1::jsonb, callback => $2::jsonb, fail_fast => $3)", [
    JSON.stringify(jobs),
    JSON.stringify(callback),
    failFast,
  ]);
  return rows;
}

async function finish(c: Queryable, id: string, result: unknown): Promise<void> {
  const job = await claimJobRow(c, id);
  await c.query("SELECT idemq.complete(job_id => $1, attempt => $2, result => $3::jsonb, lease_token => $4)", [
    id,
    job.attempt,
    JSON.stringify(result),
    job.lease_token,
  ]);
}

const jobsIn = (n: number) => Array.from({ length: n }, (_, i) => ({ task: "part", queue: unique(`part${i}`), payload: { i } }));

describe("enqueue_batch", () => {
  it("the callback waits (children) until every job finished, then runs once and reads their outcomes by ordinal", async () => {
    await inRollback(db.pool, async (c) => {
      const rows = await batch(c, jobsIn(3), { task: "report", queue: unique("cb") });
      expect(rows.map((r) => [r.ordinal, r.outcome])).toEqual([
        [0, "created"],
        [1, "created"],
        [2, "created"],
        [3, "created"],
      ]);
      const callback = rows[0]!.job_id!;
      expect(await stateOf(c, callback)).toBe("awaiting");
      const { rows: job } = await c.query("SELECT waiting_for FROM idemq.job(job_id => $1)", [callback]);
      expect(job).toEqual([{ waiting_for: "children" }]);
      for (const r of rows.slice(1)) {
        expect(await stateOf(c, callback)).toBe("awaiting");
        await finish(c, r.job_id!, r.ordinal * 10);
      }
      expect(await stateOf(c, callback)).toBe("enqueued");
      const { rows: outcomes } = await c.query("SELECT name, child_job_id, state, result FROM idemq.children(job_id => $1)", [callback]);
      expect(outcomes).toEqual(rows.slice(1).map((r) => ({ name: String(r.ordinal), child_job_id: r.job_id, state: "succeeded", result: r.ordinal * 10 })));
    });
  });

  it("fail_fast: the first job that did not succeed makes the callback runnable", async () => {
    await inRollback(db.pool, async (c) => {
      const rows = await batch(c, jobsIn(2), { task: "report", queue: unique("cb") }, true);
      await c.query("SELECT idemq.cancel(job_id => $1)", [rows[2]!.job_id]);
      expect(await stateOf(c, rows[0]!.job_id!)).toBe("enqueued");
    });
  });

  it("an empty batch leaves the callback runnable at once", async () => {
    await inRollback(db.pool, async (c) => {
      const rows = await batch(c, [], { task: "report", queue: unique("cb") });
      expect(rows).toHaveLength(1);
      expect(await stateOf(c, rows[0]!.job_id!)).toBe("enqueued");
    });
  });

  it("a job cancelled at once (a parent in its after had failed) counts as finished: a batch of only such jobs leaves the callback runnable", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("dead");
      const [dead] = (await batch(c, [], { task: "gone", queue })).map((r) => r.job_id!);
      await c.query("SELECT idemq.cancel(job_id => $1)", [dead]);
      const rows = await batch(c, [{ task: "part", queue: unique("p"), after: [Number(dead)] }], { task: "report", queue: unique("cb") });
      expect(await stateOf(c, rows[1]!.job_id!)).toBe("cancelled");
      expect(await stateOf(c, rows[0]!.job_id!)).toBe("enqueued");
      const { rows: outcomes } = await c.query("SELECT name, state FROM idemq.children(job_id => $1)", [rows[0]!.job_id]);
      expect(outcomes).toEqual([{ name: "1", state: "cancelled" }]);
    });
  });

  it("a key on the callback makes the batch idempotent: the second call enqueues nothing and says deduplicated", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("batch");
      const first = await batch(c, jobsIn(2), { task: "report", idempotency_key: key });
      const second = await batch(c, jobsIn(2), { task: "report", idempotency_key: key });
      expect(second).toEqual([{ ordinal: 0, job_id: first[0]!.job_id, outcome: "deduplicated" }]);
      const { rows } = await c.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE task = 'part'");
      expect(rows).toEqual([{ n: 2 }]);
    });
  });

  it("refuses a bad callback or job with 22023 (nothing enqueued), NULL arguments with 22004", async () => {
    await inRollback(db.pool, async (c) => {
      await underSavepoint(c, () => expectSqlError(batch(c, jobsIn(1), [1]), { code: "22023", message: /callback must be a JSON object/ }));
      await underSavepoint(c, () => expectSqlError(batch(c, jobsIn(1), { task: "" }), { code: "22023", message: /^enqueue_batch: callback: / }));
      await underSavepoint(c, () => expectSqlError(batch(c, [{ task: "" }], { task: "report" }), { code: "22023", message: /jobs\[1\]/ }));
      await underSavepoint(c, () =>
        expectSqlError(c.query("SELECT * FROM idemq.enqueue_batch(jobs => '[]', callback => NULL)"), { code: "22004", message: /callback must not be NULL/ }),
      );
      const { rows } = await c.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE task IN ('part', 'report')");
      expect(rows).toEqual([{ n: 0 }]);
    });
  });
});
