// (job_id, attempt, lease_token) is the fencing token: once rescue() took a
// job from an attempt whose lease ran out and a newer attempt claimed it, the
// old attempt can neither complete, fail, snooze nor heartbeat it, and a
// transaction that wrote the old attempt's effect before calling complete()
// rolls back whole. And another worker (a second login of idemq_worker) that
// knows the job and guesses its attempt cannot either: it lacks the lease
// token claim() gave the holder, and no error shows it that token.
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  expectSqlError,
  useTestDatabase,
  inRollback,
  interleave,
  type PgError,
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
import { createLoginRole, dropLoginRoles, type LoginRole } from "../helpers/login-roles.ts";
import { installationRoles } from "../../src/roles.ts";
import type pg from "pg";

const db = useTestDatabase();
beforeAll(async () => {
  await db.pool.query("CREATE TABLE effect_log (job_id bigint NOT NULL, attempt int NOT NULL)");
});
afterAll(async () => {
  await dropLoginRoles();
});

/** Attempt 1 claims, loses its lease, is rescued; attempt 2 claims. Returns both claims. */
async function takenOver(c: pg.ClientBase, queue: string): Promise<{ id: string; first: ClaimedJob; second: ClaimedJob }> {
  const id = await makeJob(c, { queue });
  const first = await claimOne(c, { worker_id: "old", queues: [queue], token: true });
  await expireLease(c, id);
  expect(await rescue(c)).toBe(1);
  const second = await claimOne(c, { worker_id: "new", queues: [queue], token: true });
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
    const worker = await db.newClient();
    const run = await interleave(db.pool, {
      first: rescuer,
      holds: async (c) => expect(await rescue(c)).toBe(1),
      second: worker,
      blocks: (c) =>
        complete(c, id, 1).then(
          () => undefined,
          (error: unknown) => error,
        ),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    const error = (await run.second) as { code?: string; detail?: string } | undefined;
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

describe("the lease token: a second worker login cannot finish, fail, snooze or heartbeat a job the first claimed", () => {
  let holder: pg.Client;
  let thief: pg.Client;
  let logins: LoginRole[];
  beforeAll(async () => {
    const { worker } = await installationRoles(db.pool);
    logins = [await createLoginRole("fence_a", { memberOf: [worker] }), await createLoginRole("fence_b", { memberOf: [worker] })];
    holder = await logins[0]!.connect(db.name);
    thief = await logins[1]!.connect(db.name);
  });

  /** A job (committed, in a queue of its own) claimed by the holder's login: its claim row. */
  async function claimedByHolder(queue: string): Promise<ClaimedJob> {
    await makeJob(db.pool, { queue, payload: { n: 1 } });
    return claimOne(holder, { worker_id: "holder", queues: [queue], token: true });
  }

  /** The IQ410 the thief gets: the attempt it guessed, the state, and nothing of the holder's token. */
  function expectFencedOut(error: PgError, job: ClaimedJob, operation: string): void {
    expect(error.code).toBe("IQ410");
    expect(JSON.parse(error.detail!)).toEqual({ job_id: Number(job.job_id), attempt: job.attempt, current_state: "processing" });
    expect(error.message).toBe(`${operation}: lease lost: attempt ${job.attempt} no longer holds job ${job.job_id} (it is processing)`);
    expect(error.hint).toMatch(/lease_token passed is not the one claim\(\) returned with this attempt/);
    for (const text of [error.message, error.detail, error.hint]) expect(text).not.toContain(job.lease_token);
  }

  it("claim returns a random lease token per claim (a uuid), stored on the job, a new one at each claim", async () => {
    const job = await claimedByHolder("fence-token");
    expect(job.lease_token).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect((await db.pool.query("SELECT lease_token FROM idemq.jobs WHERE id = $1", [job.job_id])).rows).toEqual([{ lease_token: job.lease_token }]);
    await snooze(holder, job.job_id, job, sql("now()"));
    const again = await claimOne(holder, { worker_id: "holder", queues: ["fence-token"], token: true });
    expect(again).toMatchObject({ job_id: job.job_id, attempt: job.attempt + 1 });
    expect(again.lease_token).not.toBe(job.lease_token);
    await complete(holder, again.job_id, again);
  });

  it("the thief, with the right attempt and no token or a wrong one: complete, fail and snooze raise IQ410 without the token, heartbeat and complete_many skip the job; the holder then completes it", async () => {
    const job = await claimedByHolder("fence-thief");
    // What the thief can learn of the job: its id, attempt and holder (idemq.job()), never its token.
    const seen = (await thief.query("SELECT * FROM idemq.job($1)", [job.job_id])).rows[0];
    expect(seen).toMatchObject({ job_id: job.job_id, attempt: job.attempt, locked_by: "holder", state: "processing" });
    expect(Object.keys(seen)).not.toContain("lease_token");
    expect(Object.values(seen).map(String)).not.toContain(job.lease_token);
    // The stored row itself (jobRow adds ages relative to now()).
    const stored = async () => (await db.pool.query("SELECT to_jsonb(j) AS row FROM idemq.jobs j WHERE j.id = $1", [job.job_id])).rows[0].row;
    const before = await stored();

    await thief.query("BEGIN");
    try {
      for (const token of [null, "00000000-0000-4000-8000-000000000000"]) {
        const guess = { attempt: job.attempt, lease_token: token };
        expectFencedOut(await underSavepoint(thief, () => expectSqlError(complete(thief, job.job_id, guess, { stolen: true }), { code: "IQ410" })), job, "complete");
        expectFencedOut(await underSavepoint(thief, () => expectSqlError(fail(thief, job.job_id, guess, "x", { retryable: false }), { code: "IQ410" })), job, "fail");
        expectFencedOut(await underSavepoint(thief, () => expectSqlError(snooze(thief, job.job_id, guess, sql("now() + interval '1 hour'")), { code: "IQ410" })), job, "snooze");
        expect(await heartbeat(thief, [{ id: job.job_id, ...guess }], "1 day")).toEqual([]);
        const skipped = await thief.query("SELECT * FROM idemq.complete_many(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[$3::uuid])", [
          job.job_id,
          job.attempt,
          token,
        ]);
        expect(skipped.rows).toEqual([]);
      }
    } finally {
      await thief.query("COMMIT");
    }
    expect(await stored(), "nothing the thief did changed the job").toEqual(before);

    // The holder's own token still holds it.
    expect(await heartbeat(holder, [{ id: job.job_id, attempt: job.attempt, lease_token: job.lease_token }], "1 minute")).toEqual([job.job_id]);
    await complete(holder, job.job_id, job, { by: "holder" });
    expect(await jobRow(db.pool, job.job_id)).toMatchObject({ state: "succeeded", attempt: job.attempt, result: { by: "holder" }, locked_by: "holder" });
  });

  it("a token fences with its attempt: after a takeover the old attempt's token does not hold the new attempt, nor the new token the old attempt number", async () => {
    await inRollback(db.pool, async (c) => {
      const { id, first, second } = await takenOver(c, "q-tokens");
      await underSavepoint(c, () => expectSqlError(complete(c, id, { attempt: 2, lease_token: first.lease_token }), lostBy(id, 2)));
      await underSavepoint(c, () => expectSqlError(complete(c, id, { attempt: 1, lease_token: second.lease_token }), lostBy(id, 1)));
      expect(await heartbeat(c, [{ id, attempt: 2, lease_token: first.lease_token }])).toEqual([]);
      await complete(c, id, second);
      expect((await jobRow(c, id)).state).toBe("succeeded");
    });
  });

  it("effect_claim's job binding needs the token: the thief naming the job and its attempt gets busy, the holder reclaims its earlier attempt's claim", async () => {
    const queue = "fence-effect";
    const first = await claimedByHolder(queue);
    const key = `fence-effect:${first.job_id}`;
    expect(
      (await holder.query("SELECT status FROM idemq.effect_claim(key => $1, owner => 'attempt-1', job_id => $2, attempt => $3, lease_token => $4)", [
        key,
        first.job_id,
        first.attempt,
        first.lease_token,
      ])).rows,
    ).toEqual([{ status: "claimed" }]);
    // Attempt 1 loses its lease; the holder claims attempt 2.
    await expireLease(db.pool, first.job_id);
    expect(await rescue(db.pool)).toBe(1);
    const second = await claimOne(holder, { worker_id: "holder", queues: [queue], token: true });
    expect(second).toMatchObject({ job_id: first.job_id, attempt: first.attempt + 1 });

    const claimAs = (s: pg.Client, owner: string, token: string | null) =>
      s.query<{ status: string }>("SELECT status FROM idemq.effect_claim(key => $1, owner => $2, job_id => $3, attempt => $4, lease_token => $5)", [
        key,
        owner,
        second.job_id,
        second.attempt,
        token,
      ]);
    expect((await claimAs(thief, "thief", null)).rows).toEqual([{ status: "busy" }]);
    expect((await claimAs(thief, "thief", "00000000-0000-4000-8000-000000000000")).rows).toEqual([{ status: "busy" }]);
    expect((await db.pool.query("SELECT owner FROM idemq.effects WHERE key = $1", [key])).rows).toEqual([{ owner: "attempt-1" }]);
    expect((await claimAs(holder, "attempt-2", second.lease_token)).rows).toEqual([{ status: "reclaimed" }]);
    await complete(holder, second.job_id, second);
  });

  it("a job claimed without a token (claim's default, as 0.1.0 claimed) is held by its attempt with a NULL token, and by no made-up token", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { queue: "q-legacy" });
      const job = await claimOne(c, { queues: ["q-legacy"] });
      expect(job.lease_token).toBeNull();
      expect((await c.query("SELECT lease_token FROM idemq.jobs WHERE id = $1", [id])).rows).toEqual([{ lease_token: null }]);
      await underSavepoint(c, () => expectSqlError(complete(c, id, { ...job, lease_token: randomUUID() }), lostBy(id, job.attempt)));
      expect(await heartbeat(c, [{ id, attempt: job.attempt, lease_token: null }])).toEqual([id]);
      // As a 0.1.0 worker calls it: no lease_token argument at all.
      await c.query("SELECT idemq.complete(job_id => $1, attempt => $2)", [id, job.attempt]);
      expect((await jobRow(c, id)).state).toBe("succeeded");
    });
  });
});
