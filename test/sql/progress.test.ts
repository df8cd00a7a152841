// idemq.progress: a held attempt's progress (0..100), fenced like complete();
// kept after the attempt ends, cleared by the next claim; job() and
// find_jobs() return it; bad values are refused and write nothing.
import { describe, expect, it } from "vitest";
import { expectSqlError, inRollback, useTestDatabase } from "../helpers/db.ts";
import { makeJob } from "../helpers/jobs.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { claimOne, complete, fail, makeDue } from "../helpers/work.ts";
import type { Queryable } from "../helpers/jobs.ts";
import { PROGRESS_BOUNDS } from "../../src/contract.ts";

const db = useTestDatabase();

async function report(c: Queryable, id: string, attempt: number, value: number | null, token: string | null): Promise<void> {
  await c.query("SELECT idemq.progress(job_id => $1, attempt => $2, value => $3, lease_token => $4)", [id, attempt, value, token]);
}

async function progressOf(c: Queryable, id: string): Promise<{ job: unknown; found: unknown; column: unknown }> {
  const job = (await c.query("SELECT progress FROM idemq.job(job_id => $1)", [id])).rows[0]?.progress;
  const found = (await c.query("SELECT progress FROM idemq.find_jobs(filter => jsonb_build_object('ids', jsonb_build_array($1::text)))", [id])).rows[0]?.progress;
  const column = (await c.query("SELECT progress FROM idemq.jobs WHERE id = $1", [id])).rows[0]?.progress;
  return { job, found, column };
}

describe("progress", () => {
  it("records the holding attempt's value, which job() and find_jobs() return; kept after completion", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c, { token: true });
      expect(await progressOf(c, id)).toEqual({ job: null, found: null, column: null });
      await report(c, id, job.attempt, 40, job.lease_token);
      await report(c, id, job.attempt, 75, job.lease_token);
      expect(await progressOf(c, id)).toEqual({ job: 75, found: 75, column: 75 });
      await complete(c, id, job);
      expect(await progressOf(c, id)).toEqual({ job: 75, found: 75, column: 75 });
    });
  });

  it("is fenced: a wrong token or a stale attempt gets IQ410 and writes nothing; an unknown job IQ404", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c, { token: true });
      await report(c, id, job.attempt, 10, job.lease_token);
      await underSavepoint(c, () => expectSqlError(report(c, id, job.attempt, 90, "00000000-0000-4000-8000-000000000000"), { code: "IQ410" }));
      await underSavepoint(c, () => expectSqlError(report(c, id, job.attempt + 1, 90, job.lease_token), { code: "IQ410" }));
      await underSavepoint(c, () => expectSqlError(report(c, "999999999", 1, 90, null), { code: "IQ404" }));
      expect((await progressOf(c, id)).column).toBe(10);
    });
  });

  it("the next claim clears it: a retry starts with no progress", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 2 });
      const first = await claimOne(c, { token: true });
      await report(c, id, first.attempt, 60, first.lease_token);
      await fail(c, id, first);
      await makeDue(c, id);
      const second = await claimOne(c, { token: true });
      expect(second.attempt).toBe(first.attempt + 1);
      expect(await progressOf(c, id)).toEqual({ job: null, found: null, column: null });
    });
  });

  it("the bounds are PROGRESS_BOUNDS (src/contract.ts): the CHECK's, and the ends are accepted", async () => {
    const { rows } = await db.pool.query("SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conname = 'jobs_progress_percent'");
    expect(rows).toEqual([{ def: `CHECK (((progress >= ${PROGRESS_BOUNDS.min}) AND (progress <= ${PROGRESS_BOUNDS.max}))) NOT VALID` }]);
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c, { token: true });
      for (const value of [PROGRESS_BOUNDS.min, PROGRESS_BOUNDS.max]) {
        await report(c, id, job.attempt, value, job.lease_token);
        expect((await progressOf(c, id)).column).toBe(value);
      }
    });
  });

  it.each([
    [PROGRESS_BOUNDS.min - 1, "22023"],
    [PROGRESS_BOUNDS.max + 1, "22023"],
    [null, "22004"],
  ])("refuses value %s (%s) with a HINT and writes nothing", async (value, code) => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c, { token: true });
      await report(c, id, job.attempt, 5, job.lease_token);
      const error = await underSavepoint(c, () => expectSqlError(report(c, id, job.attempt, value, job.lease_token), { code }));
      expect((error as { hint?: string }).hint).toMatch(/percentage/);
      expect((await progressOf(c, id)).column).toBe(5);
    });
  });
});
