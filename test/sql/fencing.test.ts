// (job_id, attempt) is the fencing token: once rescue() took a job from an
// attempt whose lease ran out and a newer attempt claimed it, the old attempt
// can neither complete, fail, snooze nor heartbeat it, and a transaction that
// wrote the old attempt's effect before calling complete() rolls back whole.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  backendPid,
  expectSqlError,
  freshDatabase,
  inRollback,
  waitUntilBlocked,
  type TestDatabase,
} from "../helpers/db.ts";
import { jobRow, makeJob, sql } from "../helpers/jobs.ts";
import {
  claimOne,
  complete,
  expireLease,
  fail,
  heartbeat,
  rescue,
  snooze,
  type ClaimedJob,
} from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import type pg from "pg";

let db: TestDatabase;
beforeAll(async () => {
  db = await freshDatabase();
  await db.pool.query("CREATE TABLE effect_log (job_id bigint NOT NULL, attempt int NOT NULL)");
});
afterAll(async () => {
  await db?.drop();
});

/** Attempt 1 claims, loses its lease, is rescued; attempt 2 claims. Returns both claims. */
async function takenOver(c: pg.ClientBase, queue: string): Promise<{ id: string; first: ClaimedJob; second: ClaimedJob }> {
  const id = await makeJob(c, { queue });
  const first = await claimOne(c, { worker_id: "old", queues: [queue] });
  await expireLease(c, id);
  expect(await rescue(c)).toBe(1);
  const second = await claimOne(c, { worker_id: "new", queues: [queue] });
  return { id, first, second };
}

// The DETAIL never names the current attempt: with the job id it would be the
// fencing token of whichever attempt holds the job now.
const lostBy = (id: string, attempt: number, state = "processing") => ({
  code: "IQ410",
  detail: { job_id: Number(id), attempt, current_state: state },
});

describe("fencing", () => {
  it("after a rescue, the next claim is attempt 2 with reclaimed = true", async () => {
    await inRollback(db.pool, async (c) => {
      const { id, first, second } = await takenOver(c, "q");
      expect(first).toMatchObject({ job_id: id, attempt: 1, reclaimed: false });
      expect(second).toMatchObject({ job_id: id, attempt: 2, reclaimed: true });
      expect(await jobRow(c, id)).toMatchObject({ state: "processing", attempt: 2, locked_by: "new" });
    });
  });

  it("IQ410 names neither in its DETAIL nor in its message the attempt that holds the job now (it would be that attempt's fencing token)", async () => {
    await inRollback(db.pool, async (c) => {
      const { id, second } = await takenOver(c, "q");
      expect(second.attempt).toBe(2);
      const error = await underSavepoint(c, () => expectSqlError(complete(c, id, 1), lostBy(id, 1)));
      expect(Object.keys(JSON.parse(error.detail!)).sort()).toEqual(["attempt", "current_state", "job_id"]);
      expect(error.message).toBe(`complete: lease lost: attempt 1 no longer holds job ${id} (it is processing)`);
    });
  });

  it("the stale attempt's complete raises IQ410 and its effect rolls back with it; the new attempt commits", async () => {
    const queue = "effects";
    const setup = await db.newClient();
    const { id } = await takenOver(setup, queue);

    const stale = await db.newClient();
    await stale.query("BEGIN");
    await stale.query("INSERT INTO effect_log VALUES ($1, 1)", [id]);
    await expectSqlError(complete(stale, id, 1), lostBy(id, 1));
    // The transaction is aborted: COMMIT can only roll it back.
    const end = await stale.query("COMMIT");
    expect(end.command).toBe("ROLLBACK");
    expect((await db.pool.query("SELECT * FROM effect_log WHERE job_id = $1", [id])).rows).toEqual([]);

    const fresh = await db.newClient();
    await fresh.query("BEGIN");
    await fresh.query("INSERT INTO effect_log VALUES ($1, 2)", [id]);
    await complete(fresh, id, 2, { ok: true });
    await fresh.query("COMMIT");
    expect((await db.pool.query("SELECT job_id, attempt FROM effect_log WHERE job_id = $1", [id])).rows).toEqual([
      { job_id: id, attempt: 2 },
    ]);
    expect(await jobRow(db.pool, id)).toMatchObject({ state: "succeeded", attempt: 2, result: { ok: true } });
  });

  it("the stale attempt's heartbeat returns nothing and leaves the new attempt's lease alone", async () => {
    await inRollback(db.pool, async (c) => {
      const { id, second } = await takenOver(c, "q");
      expect(await heartbeat(c, [{ id, attempt: 1 }], "10 minutes")).toEqual([]);
      const row = await jobRow(c, id);
      expect(row.lease_in).toBe(30);
      expect(row.lease_expires_at).toEqual(second.lease_expires_at);
      expect(await heartbeat(c, [{ id, attempt: 2 }], "10 minutes")).toEqual([id]);
      expect((await jobRow(c, id)).lease_in).toBe(600);
    });
  });

  it("a lease that ran out but was not rescued is still held: heartbeat extends it and complete succeeds", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c);
      await expireLease(c, id, "5 minutes");
      expect(await heartbeat(c, [{ id, attempt: job.attempt }])).toEqual([id]);
      expect((await jobRow(c, id)).lease_in).toBe(30);
      await expireLease(c, id, "5 minutes");
      await complete(c, id, job.attempt);
      expect((await jobRow(c, id)).state).toBe("succeeded");
      expect(await rescue(c)).toBe(0);
    });
  });

  it("fail and snooze by the stale attempt raise IQ410 and change nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const { id } = await takenOver(c, "q");
      const before = await jobRow(c, id);
      await underSavepoint(c, () => expectSqlError(fail(c, id, 1), lostBy(id, 1)));
      await underSavepoint(c, () => expectSqlError(fail(c, id, 1, "x", { retryable: false }), lostBy(id, 1)));
      await underSavepoint(c, () =>
        expectSqlError(snooze(c, id, 1, sql("now() + interval '1 minute'")), lostBy(id, 1)),
      );
      expect(await jobRow(c, id)).toEqual(before);
    });
  });

  it("a rescued job not yet claimed again fences out the old attempt too (IQ410, current_state enqueued)", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      await expireLease(c, id);
      expect(await rescue(c)).toBe(1);
      await underSavepoint(c, () => expectSqlError(complete(c, id, 1), lostBy(id, 1, "enqueued")));
      expect(await heartbeat(c, [{ id, attempt: 1 }])).toEqual([]);
    });
  });

  it("complete waits for a rescue in progress on its job, then raises IQ410", async () => {
    const queue = "race-rescue-first";
    const setup = await db.newClient();
    const id = await makeJob(setup, { queue });
    await claimOne(setup, { queues: [queue] });
    await expireLease(setup, id);

    const rescuer = await db.newClient();
    await rescuer.query("BEGIN");
    expect(await rescue(rescuer)).toBe(1);

    const worker = await db.newClient();
    const workerPid = await backendPid(worker);
    const completing = complete(worker, id, 1).then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(await waitUntilBlocked(db.pool, workerPid)).toEqual([await backendPid(rescuer)]);
    await rescuer.query("COMMIT");
    const error = (await completing) as { code?: string; detail?: string } | undefined;
    expect(error?.code).toBe("IQ410");
    expect(JSON.parse(error!.detail!)).toEqual({ job_id: Number(id), attempt: 1, current_state: "enqueued" });
    expect(await jobRow(db.pool, id)).toMatchObject({ state: "enqueued", attempt: 1 });
  });

  it("rescue skips a job whose worker is completing it, and the worker's complete commits", async () => {
    const queue = "race-complete-first";
    const setup = await db.newClient();
    const id = await makeJob(setup, { queue });
    await claimOne(setup, { queues: [queue] });
    await expireLease(setup, id);

    const worker = await db.newClient();
    await worker.query("BEGIN");
    await complete(worker, id, 1, { won: true });

    const rescuer = await db.newClient();
    await rescuer.query("SET lock_timeout = '5s'");
    // The row is locked by the completing worker: SKIP LOCKED passes it over.
    expect(await rescue(rescuer)).toBe(0);
    await worker.query("COMMIT");
    expect(await jobRow(db.pool, id)).toMatchObject({ state: "succeeded", attempt: 1, result: { won: true }, errors: [] });
  });
});
