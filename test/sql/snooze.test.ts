// idemq.snooze: back to `scheduled` without spending an attempt. The attempt
// number still advances on the next claim (it is the fencing token), but a
// snoozed attempt does not count against max_attempts.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { jobRow, makeJob, sql } from "../helpers/jobs.ts";
import { claim, claimOne, complete, fail, makeDue, snooze } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

describe("snooze", () => {
  it("puts the job back to scheduled at run_at, clears the lease and records no error", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 3 });
      const job = await claimOne(c);
      await snooze(c, id, job.attempt, sql("now() + interval '90 seconds'"));
      expect(await jobRow(c, id)).toMatchObject({
        state: "scheduled",
        run_in: 90,
        attempt: 1,
        locked_by: null,
        lease_expires_at: null,
        finished_at: null,
        errors: [],
      });
      expect(await claim(c)).toEqual([]);
    });
  });

  it("a snoozed job comes back as the next attempt, not reclaimed; the snoozed attempt is fenced out", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      await snooze(c, id, 1, sql("now()"));
      expect(await claimOne(c)).toMatchObject({ job_id: id, attempt: 2, reclaimed: false });
      await underSavepoint(c, () =>
        expectSqlError(complete(c, id, 1), {
          code: "IQ410",
          detail: { job_id: Number(id), attempt: 1, current_state: "processing" },
        }),
      );
      await complete(c, id, 2);
      expect((await jobRow(c, id)).state).toBe("succeeded");
    });
  });

  it("does not count against max_attempts: max_attempts 1, snoozed, claimed again as attempt 2, then a failure fails it", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 1 });
      await claimOne(c);
      await snooze(c, id, 1, sql("now() + interval '1 minute'"));
      await makeDue(c, id);
      const again = await claimOne(c);
      expect(again).toMatchObject({ job_id: id, attempt: 2, max_attempts: 1 });
      // The one counted attempt is this one: its failure is final.
      expect(await fail(c, id, 2, "boom")).toBe("failed");
      const row = await jobRow(c, id);
      expect(row).toMatchObject({ state: "failed", attempt: 2 });
      expect(row.errors.map((e) => e.attempt)).toEqual([2]);
    });
  });

  it("any number of snoozes never exhausts attempts", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 1 });
      for (let attempt = 1; attempt <= 5; attempt++) {
        expect((await claimOne(c)).attempt).toBe(attempt);
        await snooze(c, id, attempt, sql("now()"));
      }
      expect((await claimOne(c)).attempt).toBe(6);
      await complete(c, id, 6);
      expect(await jobRow(c, id)).toMatchObject({ state: "succeeded", attempt: 6, errors: [] });
    });
  });

  it("a failure after a snooze retries with the backoff of the first counted failure", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 2, backoff: { kind: "fixed", delays: ["2 seconds", "5 seconds"] } });
      await claimOne(c);
      await snooze(c, id, 1, sql("now()"));
      await claimOne(c);
      expect(await fail(c, id, 2)).toBe("scheduled");
      expect((await jobRow(c, id)).run_in).toBe(2);
      await makeDue(c, id);
      await claimOne(c);
      expect(await fail(c, id, 3)).toBe("failed");
    });
  });

  it("a run_at already past makes the job claimable at once", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      await snooze(c, id, 1, sql("now() - interval '1 minute'"));
      expect((await claimOne(c)).job_id).toBe(id);
    });
  });

  it("raises IQ410 for a stale attempt, IQ404 for an unknown job and 22004 for a NULL run_at, changing nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      for (const stale of [0, 2]) {
        await underSavepoint(c, () =>
          expectSqlError(snooze(c, id, stale, sql("now()")), {
            code: "IQ410",
            detail: { job_id: Number(id), attempt: stale, current_state: "processing" },
          }),
        );
      }
      await underSavepoint(c, () => expectSqlError(snooze(c, "987654321", 1, sql("now()")), { code: "IQ404" }));
      await underSavepoint(c, () => expectSqlError(snooze(c, id, 1, sql("NULL")), { code: "22004" }));
      expect(await jobRow(c, id)).toMatchObject({ state: "processing", attempt: 1, locked_by: "w1" });
    });
  });

  it("raises IQ410 for a job that is not processing (already snoozed)", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      await snooze(c, id, 1, sql("now() + interval '1 minute'"));
      await underSavepoint(c, () =>
        expectSqlError(snooze(c, id, 1, sql("now()")), {
          code: "IQ410",
          detail: { job_id: Number(id), attempt: 1, current_state: "scheduled" },
        }),
      );
      expect((await jobRow(c, id)).run_in).toBe(60);
    });
  });
});
