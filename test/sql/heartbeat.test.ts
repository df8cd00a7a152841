// idemq.heartbeat: extends the leases that (job_id, attempt) pairs still
// hold and returns exactly those ids; a missing id tells its handler to stop.
import { describe, expect, it } from "vitest";
import {
  expectSqlError,
  useTestDatabase,
  inRollback,
  interleave,
} from "../helpers/db.ts";
import { jobRow, makeJob } from "../helpers/jobs.ts";
import {
  byId,
  claim,
  claimOne,
  complete,
  expireLease,
  heartbeat,
  rescue,
} from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

describe("heartbeat", () => {
  it("extends every held lease to now() + lease and returns exactly the held ids", async () => {
    await inRollback(db.pool, async (c) => {
      const held = [await makeJob(c), await makeJob(c)];
      const wrongAttempt = await makeJob(c);
      const rescued = await makeJob(c);
      const done = await makeJob(c);
      await claim(c, { batch_size: 5, lease: "10 seconds" });
      const neverClaimed = await makeJob(c);
      await complete(c, done, 1);
      await expireLease(c, rescued);
      expect(await rescue(c)).toBe(1);
      for (const id of held) await expireLease(c, id, "3 seconds");

      const answer = await heartbeat(
        c,
        [
          { id: held[0]!, attempt: 1 },
          { id: wrongAttempt, attempt: 2 },
          { id: rescued, attempt: 1 },
          { id: done, attempt: 1 },
          { id: neverClaimed, attempt: 0 },
          { id: "987654321", attempt: 1 },
          { id: held[1]!, attempt: 1 },
        ],
        "2 minutes",
      );
      expect(answer).toEqual([...held].sort(byId));
      for (const id of held) {
        expect(await jobRow(c, id)).toMatchObject({ state: "processing", attempt: 1, locked_by: "w1", lease_in: 120 });
      }
      expect(await jobRow(c, wrongAttempt)).toMatchObject({ state: "processing", lease_in: 10 });
      expect(await jobRow(c, rescued)).toMatchObject({ state: "enqueued", lease_expires_at: null });
      expect(await jobRow(c, done)).toMatchObject({ state: "succeeded", lease_expires_at: null });
      expect(await jobRow(c, neverClaimed)).toMatchObject({ state: "enqueued", lease_expires_at: null });
    });
  });

  it("uses a 30-second lease by default and may shorten a lease", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c, { lease: "5 minutes" });
      expect(await heartbeat(c, [{ id, attempt: 1 }])).toEqual([id]);
      expect((await jobRow(c, id)).lease_in).toBe(30);
    });
  });

  it("extends a lease that ran out but was not rescued", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      await expireLease(c, id, "1 hour");
      expect(await heartbeat(c, [{ id, attempt: 1 }], "45 seconds")).toEqual([id]);
      expect((await jobRow(c, id)).lease_in).toBe(45);
      expect(await rescue(c)).toBe(0);
    });
  });

  it("returns nothing for empty arrays", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await heartbeat(c, [])).toEqual([]);
    });
  });

  it("rejects NULL arrays (22004), arrays of different lengths (22023) and a bad lease", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      const call = (ids: unknown, attempts: unknown, lease: unknown = "30 seconds") =>
        c.query("SELECT * FROM idemq.heartbeat($1::bigint[], $2::int[], $3::interval)", [ids, attempts, lease]);
      await underSavepoint(c, () => expectSqlError(call(null, [1]), { code: "22004" }));
      await underSavepoint(c, () => expectSqlError(call([id], null), { code: "22004" }));
      await underSavepoint(c, () => expectSqlError(call([id], [1, 1]), { code: "22023", message: /same length/ }));
      await underSavepoint(c, () => expectSqlError(call([id], [1], null), { code: "22004", message: /lease/ }));
      await underSavepoint(c, () => expectSqlError(call([id], [1], "0 seconds"), { code: "22023", message: /lease/ }));
      await underSavepoint(c, () => expectSqlError(call([id], [1], "-5 seconds"), { code: "22023", message: /lease/ }));
      await underSavepoint(c, () => expectSqlError(call([id], [1], "25 hours"), { code: "22023", message: /lease/ }));
      expect((await jobRow(c, id)).lease_in).toBe(30);
    });
  });

  it("waits for a concurrent complete of the job, then leaves it out", async () => {
    const id = await makeJob(db.pool, { queue: "hb-race" });
    await claimOne(db.pool, { queues: ["hb-race"] });

    const worker = await db.newClient();
    const beater = await db.newClient();
    const run = await interleave(db.pool, {
      first: worker,
      holds: (c) => complete(c, id, 1),
      second: beater,
      blocks: (c) => heartbeat(c, [{ id, attempt: 1 }]),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    expect(await run.second).toEqual([]);
    expect(await jobRow(db.pool, id)).toMatchObject({ state: "succeeded", lease_expires_at: null });
  });
});
