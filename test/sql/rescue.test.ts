// idemq.rescue: takes jobs away from attempts whose lease ran out (back to
// enqueued, or failed on the last attempt), expires active jobs past their
// expires_at, counts each job once, is idempotent, safe to run concurrently,
// and wakes idle workers for the jobs it re-enqueued.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { useTestDatabase, inRollback } from "../helpers/db.ts";
import { jobRow, states, waitForJobs, makeJob, makeJobs, sql, unique } from "../helpers/jobs.ts";
import {
  claim,
  claimOne,
  expireLease,
  fail,
  makeDue,
  rescue,
  snooze,
} from "../helpers/work.ts";
import { buildZoo, expectOnlyChanged, snapshot } from "../helpers/zoo.ts";

const db = useTestDatabase();

describe("rescue: lost leases", () => {
  it("puts a job whose lease ran out back to enqueued, runnable now, with a LeaseExpired error entry", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 3 });
      await claimOne(c, { worker_id: "crashed-host:7" });
      await c.query("UPDATE idemq.jobs SET locked_at = now() - interval '40 seconds' WHERE id = $1", [id]);
      await expireLease(c, id, "10 seconds");
      expect(await rescue(c)).toBe(1);

      const row = await jobRow(c, id);
      expect(row).toMatchObject({
        state: "enqueued",
        attempt: 1,
        run_in: 0,
        locked_by: null,
        lease_expires_at: null,
        finished_at: null,
      });
      expect(row.errors).toHaveLength(1);
      expect(row.errors[0]).toMatchObject({ attempt: 1, worker: "crashed-host:7", class: "LeaseExpired" });
      expect(row.errors[0]!.message).toMatch(/lease expired/);
      const { rows } = await c.query(
        `SELECT (e->>'started_at')::timestamptz = now() - interval '40 seconds' AS started_at_claim,
                (e->>'failed_at')::timestamptz = now() AS failed_now
         FROM idemq.jobs j, jsonb_array_elements(j.errors) e WHERE j.id = $1`,
        [id],
      );
      expect(rows).toEqual([{ started_at_claim: true, failed_now: true }]);
    });
  });

  it("keeps the job's place in line: a rescued job is claimed before the jobs that became due after it", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("line");
      const early = await makeJob(c, { queue, run_at: sql("now() - interval '1 hour'") });
      expect((await claimOne(c, { queues: [queue] })).job_id).toBe(early);
      const later = await makeJob(c, { queue, run_at: sql("now() - interval '30 minutes'") });
      await expireLease(c, early, "10 seconds");
      expect(await rescue(c)).toBe(1);

      const { rows } = await c.query<{ due_before_later: boolean }>(
        "SELECT j.run_at < (SELECT run_at FROM idemq.jobs WHERE id = $2) AS due_before_later FROM idemq.jobs j WHERE j.id = $1",
        [early, later],
      );
      expect(rows).toEqual([{ due_before_later: true }]);
      const next = await claimOne(c, { queues: [queue] });
      expect(next).toMatchObject({ job_id: early, reclaimed: true });
    });
  });

  it("takes a lease only once it has passed: lease_expires_at = now() is still held, 1 µs before is lost", async () => {
    await inRollback(db.pool, async (c) => {
      const atNow = await makeJob(c);
      const justPast = await makeJob(c);
      await claim(c, { batch_size: 2 });
      await c.query("UPDATE idemq.jobs SET lease_expires_at = now() WHERE id = $1", [atNow]);
      await c.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 microsecond' WHERE id = $1", [justPast]);
      expect(await rescue(c)).toBe(1);
      expect(await states(c, [atNow, justPast])).toEqual({ [atNow]: "processing", [justPast]: "enqueued" });
    });
  });

  it("fails the job when the lost attempt was its last counted attempt, finishing its key", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 2, idempotency_key: "last-1", backoff: { kind: "fixed", delays: ["1 second"] } });
      await claimOne(c);
      expect(await fail(c, id, 1)).toBe("scheduled");
      await makeDue(c, id);
      await claimOne(c);
      await expireLease(c, id);
      expect(await rescue(c)).toBe(1);
      const row = await jobRow(c, id);
      expect(row).toMatchObject({ state: "failed", attempt: 2, finished_now: true, lease_expires_at: null });
      expect(row.errors.map((e) => [e.attempt, e.class])).toEqual([
        [1, "Boom"],
        [2, "LeaseExpired"],
      ]);
      const { rows } = await c.query("SELECT finished_state::text AS s FROM idemq.keys WHERE key = 'last-1'");
      expect(rows).toEqual([{ s: "failed" }]);
    });
  });

  it("does not count a snoozed attempt: max_attempts 1, snoozed, then the lease of attempt 2 is lost -> failed", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 1 });
      await claimOne(c);
      await snooze(c, id, 1, sql("now()"));
      await claimOne(c);
      await expireLease(c, id);
      expect(await rescue(c)).toBe(1);
      expect(await jobRow(c, id)).toMatchObject({ state: "failed", attempt: 2 });
    });
  });

  it("a lost lease past the job's expires_at is expired at once and counted once", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { expires_at: sql("now() + interval '1 hour'") });
      await claimOne(c);
      await expireLease(c, id);
      await c.query("UPDATE idemq.jobs SET expires_at = now() - interval '1 second' WHERE id = $1", [id]);
      expect(await rescue(c)).toBe(1);
      const row = await jobRow(c, id);
      expect(row).toMatchObject({ state: "expired", finished_now: true, lease_expires_at: null });
      expect(row.errors.map((e) => e.class)).toEqual(["LeaseExpired"]);
    });
  });

  it("is idempotent: a second call changes nothing and returns 0", async () => {
    await inRollback(db.pool, async (c) => {
      const ids = [await makeJob(c), await makeJob(c)];
      await claim(c, { batch_size: 2 });
      for (const id of ids) await expireLease(c, id);
      await makeJob(c, { expires_at: sql("now()") });
      expect(await rescue(c)).toBe(3);
      const before = (await c.query("SELECT to_jsonb(j) AS row FROM idemq.jobs j ORDER BY id")).rows;
      expect(await rescue(c)).toBe(0);
      expect((await c.query("SELECT to_jsonb(j) AS row FROM idemq.jobs j ORDER BY id")).rows).toEqual(before);
    });
  });
});

describe("rescue: on the job zoo", () => {
  it("changes exactly the job whose lease ran out, then exactly the last-attempt job once its lease runs out", async () => {
    await inRollback(db.pool, async (c) => {
      const zoo = await buildZoo(c);
      const before = await snapshot(c, zoo);
      expect(await rescue(c)).toBe(1);
      const afterFirst = await snapshot(c, zoo);
      expectOnlyChanged(before, afterFirst, { jobs: ["leaseExpired"] });
      expect(afterFirst.jobs.leaseExpired).toMatchObject({ state: "enqueued", attempt: 1, lease_lost: true });

      await expireLease(c, zoo.lastAttempt.id);
      const beforeSecond = await snapshot(c, zoo);
      expect(await rescue(c)).toBe(1);
      const afterSecond = await snapshot(c, zoo);
      expectOnlyChanged(beforeSecond, afterSecond, { jobs: ["lastAttempt"], keys: ["lastAttempt"] });
      expect(afterSecond.jobs.lastAttempt).toMatchObject({ state: "failed", attempt: 2 });
      expect(afterSecond.keys.lastAttempt).toMatchObject({ finished_state: "failed" });
    });
  });
});

describe("rescue: deadlines", () => {
  it("expires every active job that is not processing once it is at or past expires_at, and none before", async () => {
    await inRollback(db.pool, async (c) => {
      const made: Record<string, string> = {};
      // Each kind of waiting job twice: deadline = now() (expired) and now() + 1 µs (kept).
      for (const [edge, deadline] of [
        ["at", "now()"],
        ["before", "now() + interval '1 microsecond'"],
      ] as const) {
        made[`enqueued.${edge}`] = await makeJob(c, { queue: `enq.${edge}` });
        made[`delayed.${edge}`] = await makeJob(c, { run_at: sql("now() + interval '1 hour'") });
        const parent = await makeJob(c, { run_at: sql("now() + interval '1 hour'") });
        made[`awaiting.${edge}`] = await makeJob(c, { after: [parent] });
        const retry = await makeJob(c, { queue: `retry.${edge}` });
        await claimOne(c, { queues: [`retry.${edge}`] });
        expect(await fail(c, retry, 1)).toBe("scheduled");
        made[`retry.${edge}`] = retry;
        const running = await makeJob(c, { queue: `run.${edge}` });
        await claimOne(c, { queues: [`run.${edge}`] });
        made[`processing.${edge}`] = running;
        const done = await makeJob(c, { queue: `done.${edge}` });
        await claimOne(c, { queues: [`done.${edge}`] });
        await c.query("SELECT idemq.complete($1, 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [done]);
        made[`succeeded.${edge}`] = done;
        await c.query(`UPDATE idemq.jobs SET expires_at = ${deadline} WHERE id = ANY($1::bigint[])`, [
          Object.entries(made)
            .filter(([name]) => name.endsWith(`.${edge}`))
            .map(([, id]) => id),
        ]);
      }
      expect(await rescue(c)).toBe(4);
      const now = await states(c, Object.values(made));
      expect(Object.fromEntries(Object.entries(made).map(([name, id]) => [name, now[id]]))).toEqual({
        "enqueued.at": "expired",
        "delayed.at": "expired",
        "awaiting.at": "expired",
        "retry.at": "expired",
        "processing.at": "processing",
        "succeeded.at": "succeeded",
        "enqueued.before": "enqueued",
        "delayed.before": "scheduled",
        "awaiting.before": "awaiting",
        "retry.before": "scheduled",
        "processing.before": "processing",
        "succeeded.before": "succeeded",
      });
      const { rows } = await c.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM idemq.jobs WHERE state = 'expired' AND finished_at = now()",
      );
      expect(rows[0]!.n).toBe(4);
    });
  });

  it("expires a job enqueued with an expires_at already past", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { expires_at: sql("now() - interval '1 day'"), idempotency_key: "late-1" });
      expect(await claim(c)).toEqual([]);
      expect(await rescue(c)).toBe(1);
      expect(await jobRow(c, id)).toMatchObject({ state: "expired", attempt: 0, errors: [] });
      const { rows } = await c.query("SELECT finished_state::text AS s FROM idemq.keys WHERE key = 'late-1'");
      expect(rows).toEqual([{ s: "expired" }]);
    });
  });
});

/** Collects idemq_jobs notifications on a listening connection; arrived(p) resolves once payload p came. */
async function listen(client: pg.Client): Promise<{ payloads: string[]; arrived(payload: string): Promise<void> }> {
  const payloads: string[] = [];
  const waiters: Array<{ payload: string; resolve(): void }> = [];
  client.on("notification", (n) => {
    if (n.channel !== "idemq_jobs") return;
    payloads.push(n.payload ?? "");
    for (const w of waiters) if (w.payload === n.payload) w.resolve();
  });
  await client.query("LISTEN idemq_jobs");
  await waitForJobs(client);
  return {
    payloads,
    arrived(payload) {
      if (payloads.includes(payload)) return Promise.resolve();
      return new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no notification ${payload} within 10 s`)), 10_000);
        waiters.push({ payload, resolve: () => (clearTimeout(timer), resolve()) });
      });
    },
  };
}

describe("rescue: concurrency and notifications", () => {
  it("concurrent rescue() calls on 6 connections rescue each of 300 lost leases once", async () => {
    const queue = "lost-many";
    const ids = await makeJobs(db.pool, 300, { queue });
    const claimed = await claim(db.pool, { queues: [queue], batch_size: 300 });
    expect(claimed).toHaveLength(300);
    await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE queue = $1", [queue]);

    const clients = await Promise.all(Array.from({ length: 6 }, () => db.newClient()));
    const counts = await Promise.all(clients.map((client) => rescue(client)));
    expect(counts.reduce((a, b) => a + b, 0)).toBe(300);

    const { rows } = await db.pool.query<{ state: string; entries: number; n: number }>(
      `SELECT state::text AS state, jsonb_array_length(errors) AS entries, count(*)::int AS n
       FROM idemq.jobs WHERE id = ANY($1::bigint[]) GROUP BY 1, 2`,
      [ids],
    );
    expect(rows).toEqual([{ state: "enqueued", entries: 1, n: 300 }]);
    expect(await rescue(db.pool)).toBe(0);
  });

  it("a rescue in progress does not block another, which skips its rows (SKIP LOCKED)", async () => {
    const queue = "lost-pair";
    const [id] = await makeJobs(db.pool, 1, { queue });
    await claimOne(db.pool, { queues: [queue] });
    await expireLease(db.pool, id!);

    const a = await db.newClient();
    const b = await db.newClient();
    await b.query("SET lock_timeout = '5s'");
    await a.query("BEGIN");
    expect(await rescue(a)).toBe(1);
    expect(await rescue(b)).toBe(0);
    await a.query("COMMIT");
    expect(await rescue(b)).toBe(0);
    expect(await jobRow(db.pool, id!)).toMatchObject({ state: "enqueued" });
    expect((await jobRow(db.pool, id!)).errors).toHaveLength(1);
  });

  it("notifies idemq_jobs with the queue of each re-enqueued job, at commit, and not for jobs it failed", async () => {
    const back = await makeJob(db.pool, { queue: "notify-back" });
    const last = await makeJob(db.pool, { queue: "notify-last", max_attempts: 1 });
    await claim(db.pool, { queues: ["notify-back", "notify-last"], batch_size: 2 });
    await expireLease(db.pool, back);
    await expireLease(db.pool, last);

    const listener = await db.newClient();
    const { payloads, arrived } = await listen(listener);
    const rescuer = await db.newClient();
    await rescuer.query("BEGIN");
    expect(await rescue(rescuer)).toBe(2);
    // Delivered at commit, not before: a round trip on the listener shows nothing yet.
    await listener.query("SELECT 1");
    expect(payloads).toEqual([]);
    await rescuer.query("COMMIT");

    await arrived("notify-back");
    // The rescuing transaction's notifications arrive together; a round trip flushes any straggler.
    await listener.query("SELECT 1");
    expect(payloads).toEqual(["notify-back"]);
    expect(await states(db.pool, [back, last])).toEqual({ [back]: "enqueued", [last]: "failed" });
  });
});
