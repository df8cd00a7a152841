// idemq.complete and idemq.complete_many: a held job becomes succeeded; a
// (job_id, attempt) that does not hold its job raises IQ410 (complete) or is
// skipped (complete_many).
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { jobRow, makeJob } from "../helpers/jobs.ts";
import { byId, claim, claimOne, complete, expireLease, fail, HOLDER_TOKENS, rescue } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { RESULT_BYTES } from "../../src/contract.ts";

const db = useTestDatabase();

async function completeMany(c: pg.ClientBase, ids: unknown, attempts: unknown): Promise<string[]> {
  const { rows } = await c.query<{ id: string }>(
    `SELECT id FROM idemq.complete_many(job_ids => $1::bigint[], attempts => $2::int[], lease_tokens => ${HOLDER_TOKENS("$1")}) AS id`,
    [ids, attempts],
  );
  return rows.map((r) => r.id).sort(byId);
}

describe("complete", () => {
  it("moves the held job to succeeded, stores the result, sets finished_at, clears the lease and keeps the worker that ran it", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c);
      await complete(c, id, job.attempt, { sent: true, n: 3 });
      expect(await jobRow(c, id)).toMatchObject({
        state: "succeeded",
        result: { sent: true, n: 3 },
        finished_now: true,
        locked_by: "w1",
        lease_expires_at: null,
        attempt: 1,
      });
    });
  });

  it("keeps a result of RESULT_BYTES of JSON text; one byte over is refused with 22023 naming the job, and the job stays held", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c);
      const atLimit = "x".repeat(RESULT_BYTES - 2); // the JSON string's two quotes
      await underSavepoint(c, () =>
        expectSqlError(complete(c, id, job.attempt, atLimit + "x"), {
          code: "22023",
          message: `complete: job ${id}: the result is ${RESULT_BYTES + 1} bytes of JSON, over the limit of ${RESULT_BYTES}`,
        }),
      );
      expect(await jobRow(c, id)).toMatchObject({ state: "processing", result: null });
      await complete(c, id, job.attempt, atLimit);
      expect(await jobRow(c, id)).toMatchObject({ state: "succeeded", result: atLimit });
    });
  });

  it("stores a NULL result when none is given", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await complete(c, id, (await claimOne(c)).attempt);
      expect(await jobRow(c, id)).toMatchObject({ state: "succeeded", result: null });
    });
  });

  it("finishes the job's idempotency key, so the duplicate policy applies from then on", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { idempotency_key: "order-1" });
      await complete(c, id, (await claimOne(c)).attempt);
      const { rows } = await c.query("SELECT job_id, finished_state::text AS state FROM idemq.keys WHERE key = 'order-1'");
      expect(rows).toEqual([{ job_id: id, state: "succeeded" }]);
    });
  });

  it("raises IQ404 for a job that does not exist", async () => {
    await inRollback(db.pool, async (c) => {
      await expectSqlError(complete(c, "987654321", 1), { code: "IQ404", message: /987654321/ });
    });
  });

  it("raises 22004 for a NULL job_id or attempt", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      await underSavepoint(c, () =>
        expectSqlError(c.query("SELECT idemq.complete(NULL, 1)"), { code: "22004" }),
      );
      await underSavepoint(c, () =>
        expectSqlError(c.query("SELECT idemq.complete($1, NULL)", [id]), { code: "22004" }),
      );
      expect((await jobRow(c, id)).state).toBe("processing");
    });
  });

  it("raises IQ410 with DETAIL for an attempt that is not the current one, changing nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c, { worker_id: "w1" });
      for (const wrong of [job.attempt + 1, job.attempt - 1]) {
        await underSavepoint(c, () =>
          expectSqlError(complete(c, id, wrong, { x: 1 }), {
            code: "IQ410",
            detail: { job_id: Number(id), attempt: wrong, current_state: "processing" },
            message: /lease lost/,
          }),
        );
      }
      expect(await jobRow(c, id)).toMatchObject({ state: "processing", locked_by: "w1", result: null, finished_at: null });
    });
  });

  it("raises IQ410 for a job that is not processing: enqueued, scheduled for a retry, already succeeded", async () => {
    await inRollback(db.pool, async (c) => {
      const neverClaimed = await makeJob(c, { priority: -1 });
      await underSavepoint(c, () =>
        expectSqlError(complete(c, neverClaimed, 0), {
          code: "IQ410",
          detail: { job_id: Number(neverClaimed), attempt: 0, current_state: "enqueued" },
        }),
      );

      const retrying = await makeJob(c, { priority: 2 });
      expect(await fail(c, retrying, (await claimOne(c)).attempt)).toBe("scheduled");
      await underSavepoint(c, () =>
        expectSqlError(complete(c, retrying, 1), {
          code: "IQ410",
          detail: { job_id: Number(retrying), attempt: 1, current_state: "scheduled" },
        }),
      );

      const done = await makeJob(c, { priority: 1 });
      await complete(c, done, (await claimOne(c)).attempt, { first: true });
      await underSavepoint(c, () =>
        expectSqlError(complete(c, done, 1, { second: true }), {
          code: "IQ410",
          detail: { job_id: Number(done), attempt: 1, current_state: "succeeded" },
        }),
      );
      expect((await jobRow(c, done)).result).toEqual({ first: true });
      expect((await jobRow(c, neverClaimed)).state).toBe("enqueued");
      expect((await jobRow(c, retrying)).state).toBe("scheduled");
    });
  });
});

describe("complete_many", () => {
  it("completes the held pairs and returns their ids, skipping lost, wrong-attempt and unknown ones without raising", async () => {
    await inRollback(db.pool, async (c) => {
      const [held1, held2, lost, wrong] = [await makeJob(c), await makeJob(c), await makeJob(c), await makeJob(c)];
      const claimed = await claim(c, { batch_size: 4 });
      expect(claimed).toHaveLength(4);
      await expireLease(c, lost);
      expect(await rescue(c)).toBe(1);

      const done = await completeMany(c, [held1, held2, lost, wrong, "987654321"], [1, 1, 1, 2, 1]);
      expect(done).toEqual([held1, held2].sort(byId));

      expect(await jobRow(c, held1)).toMatchObject({ state: "succeeded", finished_now: true, locked_by: "w1", lease_expires_at: null });
      expect(await jobRow(c, held2)).toMatchObject({ state: "succeeded" });
      expect(await jobRow(c, lost)).toMatchObject({ state: "enqueued", attempt: 1 });
      expect(await jobRow(c, wrong)).toMatchObject({ state: "processing", attempt: 1 });
    });
  });

  it("returns nothing for empty arrays", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await completeMany(c, [], [])).toEqual([]);
    });
  });

  it("returns an id once when it is given twice", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      expect(await completeMany(c, [id, id], [1, 1])).toEqual([id]);
    });
  });

  it("raises 22023 for arrays of different lengths and 22004 for NULL arrays, completing nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      await underSavepoint(c, () =>
        expectSqlError(completeMany(c, [id], [1, 1]), { code: "22023", message: /same length/ }),
      );
      await underSavepoint(c, () =>
        expectSqlError(completeMany(c, [id, id], [1]), { code: "22023", message: /same length/ }),
      );
      await underSavepoint(c, () => expectSqlError(completeMany(c, null, [1]), { code: "22004" }));
      await underSavepoint(c, () => expectSqlError(completeMany(c, [id], null), { code: "22004" }));
      expect((await jobRow(c, id)).state).toBe("processing");
    });
  });
});
