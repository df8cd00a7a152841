// idemq.fail: records the failed attempt in errors, then schedules a retry
// (backoff or retry_at) or fails the job for good (not retryable, or out of
// attempts). Backoff arithmetic itself is in backoff.test.ts.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { Listener, unique, makeJob, sql, jobRow } from "../helpers/jobs.ts";
import { claimOne, fail, failRow, makeDue } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

const FIXED = { kind: "fixed", delays: ["2 seconds"] };

describe("fail", () => {
  it("schedules a retry at the backoff time and clears the lease", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { backoff: FIXED, max_attempts: 3 });
      const job = await claimOne(c);
      expect(await fail(c, id, job.attempt)).toBe("scheduled");
      expect(await jobRow(c, id)).toMatchObject({
        state: "scheduled",
        run_in: 2,
        attempt: 1,
        locked_by: null,
        lease_expires_at: null,
        finished_at: null,
      });
    });
  });

  it("returns the run_at it stored: the backoff's, retry_at's, a task backoff's; NULL when the job fails", async () => {
    await inRollback(db.pool, async (c) => {
      const storedRunAt = async (id: string) =>
        (await c.query<{ run_at: string }>("SELECT run_at::text AS run_at FROM idemq.jobs WHERE id = $1", [id])).rows[0]!.run_at;
      const id = await makeJob(c, { backoff: FIXED, max_attempts: 4 });
      await claimOne(c);
      const byBackoff = await failRow(c, id, 1);
      expect(byBackoff.state).toBe("scheduled");
      expect(byBackoff.run_at).toEqual(await storedRunAt(id));
      expect((await jobRow(c, id)).run_in).toBe(2);

      await makeDue(c, id);
      await claimOne(c);
      const byRetryAt = await failRow(c, id, 2, "later", { retry_at: sql("now() + interval '1 hour'") });
      expect(byRetryAt).toEqual({ state: "scheduled", run_at: await storedRunAt(id) });
      expect((await jobRow(c, id)).run_in).toBe(3600);

      await makeDue(c, id);
      await claimOne(c);
      // The polynomial default is random: the returned run_at is the one drawn.
      const byTaskBackoff = await failRow(c, id, 3, "again", { backoff: { kind: "polynomial" } });
      expect(byTaskBackoff).toEqual({ state: "scheduled", run_at: await storedRunAt(id) });

      await makeDue(c, id);
      await claimOne(c);
      const before = await storedRunAt(id);
      expect(await failRow(c, id, 4)).toEqual({ state: "failed", run_at: null });
      expect(await storedRunAt(id)).toEqual(before);
    });
  });

  it("retry_at overrides the backoff", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { backoff: FIXED });
      await claimOne(c);
      expect(await fail(c, id, 1, "rate limited", { retry_at: sql("now() + interval '1 hour'") })).toBe("scheduled");
      expect((await jobRow(c, id)).run_in).toBe(3600);
    });
  });

  it("a non-retryable error fails the job at once, attempts left or not", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { max_attempts: 10 });
      await claimOne(c);
      const state = await fail(c, id, 1, { class: "ValidationError", message: "bad payload" }, {
        retryable: false,
        retry_at: sql("now() + interval '1 hour'"),
      });
      expect(state).toBe("failed");
      expect(await jobRow(c, id)).toMatchObject({
        state: "failed",
        finished_now: true,
        locked_by: null,
        lease_expires_at: null,
        attempt: 1,
      });
    });
  });

  it("with max_attempts 3, the first two failures retry and the third fails the job", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { backoff: FIXED, max_attempts: 3 });
      const states: string[] = [];
      for (let attempt = 1; attempt <= 3; attempt++) {
        const job = await claimOne(c);
        expect(job.attempt).toBe(attempt);
        // retry_at cannot buy an attempt past max_attempts.
        states.push(await fail(c, id, attempt, "boom", { retry_at: sql("now()") }));
        if (attempt < 3) await makeDue(c, id);
      }
      expect(states).toEqual(["scheduled", "scheduled", "failed"]);
      expect(await jobRow(c, id)).toMatchObject({ state: "failed", attempt: 3, finished_now: true });
      expect(await c.query("SELECT * FROM idemq.claim('w2')")).toMatchObject({ rowCount: 0 });
    });
  });

  it("backoff and max_attempts given to fail override the job's (a worker's task settings); snoozes do not count", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { backoff: FIXED, max_attempts: 10 });
      const override = { backoff: { kind: "fixed", delays: ["7 seconds", "9 seconds"] }, max_attempts: 2 };
      // Attempt 1 is snoozed: it does not count.
      await claimOne(c);
      await c.query("SELECT idemq.snooze(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), run_at => now())", [id]);
      await claimOne(c);
      expect(await fail(c, id, 2, "first counted", override)).toBe("scheduled");
      // The first counted failure: the override's first delay, not the job's 2 seconds.
      expect((await jobRow(c, id)).run_in).toBe(7);
      await makeDue(c, id);
      await claimOne(c);
      // The second counted failure reaches the override's limit of 2, below the job's 10.
      expect(await fail(c, id, 3, "second counted", override)).toBe("failed");
      expect(await jobRow(c, id)).toMatchObject({ state: "failed", attempt: 3 });
    });
  });

  it("rejects a malformed backoff override or max_attempts below 1 (22023), changing nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, {});
      await claimOne(c);
      await underSavepoint(c, () =>
        expectSqlError(fail(c, id, 1, "x", { backoff: { kind: "linear" } }), {
          code: "22023",
          message: /^fail: backoff kind must be/,
        }),
      );
      await underSavepoint(c, () =>
        expectSqlError(fail(c, id, 1, "x", { max_attempts: 0 }), { code: "22023", message: /max_attempts must be NULL or >= 1/ }),
      );
      expect(await jobRow(c, id)).toMatchObject({ state: "processing", attempt: 1 });
    });
  });

  it("keeps every failed attempt's error: attempt, started_at, failed_at, worker, max_attempts, class, message and extra fields", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { backoff: FIXED, max_attempts: 2 });
      await claimOne(c, { worker_id: "host-a:1" });
      // The attempt started five minutes before it failed.
      await c.query("UPDATE idemq.jobs SET locked_at = now() - interval '5 minutes' WHERE id = $1", [id]);
      await fail(c, id, 1, { class: "TimeoutError", message: "took too long", stack: "at x()" });
      await makeDue(c, id);
      await claimOne(c, { worker_id: "host-b:2" });
      await fail(c, id, 2, { class: "HttpError", message: "503", status: 503 });

      const { rows } = await c.query(
        `SELECT e - 'started_at' - 'failed_at' AS entry,
                (e->>'started_at')::timestamptz = now() - interval '5 minutes' AS started_5_min_ago,
                (e->>'started_at')::timestamptz = now() AS started_now,
                (e->>'failed_at')::timestamptz = now() AS failed_now
         FROM idemq.jobs j, jsonb_array_elements(j.errors) WITH ORDINALITY AS x(e, n)
         WHERE j.id = $1 ORDER BY n`,
        [id],
      );
      expect(rows).toEqual([
        {
          entry: { attempt: 1, worker: "host-a:1", class: "TimeoutError", message: "took too long", stack: "at x()", max_attempts: 2 },
          started_5_min_ago: true,
          started_now: false,
          failed_now: true,
        },
        {
          entry: { attempt: 2, worker: "host-b:2", class: "HttpError", message: "503", status: 503, max_attempts: 2 },
          started_5_min_ago: false,
          started_now: true,
          failed_now: true,
        },
      ]);
    });
  });

  it("accepts an error given as a plain JSON string, as the message", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      await fail(c, id, 1, "connection reset");
      const [entry] = (await jobRow(c, id)).errors;
      expect(entry).toMatchObject({ attempt: 1, worker: "w1", class: "Error", message: "connection reset" });
    });
  });

  it("records its own attempt, worker and times over fields of the same name in the error", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c, { worker_id: "real" });
      await fail(c, id, 1, { class: "E", message: "m", attempt: 99, worker: "fake", failed_at: "never" });
      const [entry] = (await jobRow(c, id)).errors;
      expect(entry).toMatchObject({ attempt: 1, worker: "real", class: "E" });
      expect(entry!.failed_at).not.toBe("never");
    });
  });

  it("finishes the job's idempotency key when it fails for good", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { idempotency_key: "charge-9", max_attempts: 1 });
      await claimOne(c);
      expect(await fail(c, id, 1)).toBe("failed");
      const { rows } = await c.query("SELECT finished_state::text AS state FROM idemq.keys WHERE key = 'charge-9'");
      expect(rows).toEqual([{ state: "failed" }]);
    });
  });

  it("counted => false records the error but spends no attempt: runnable at once (no backoff), even on the last attempt", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { backoff: FIXED, max_attempts: 1 });
      const job = await claimOne(c);
      const { rows } = await c.query(
        `SELECT f.state, f.run_at = now() AS at_once FROM idemq.fail($1, $2, '{"class": "WorkerShutdownError", "message": "cut short"}', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), counted => false) f`,
        [id, job.attempt],
      );
      expect(rows).toEqual([{ state: "scheduled", at_once: true }]);
      const row = await jobRow(c, id);
      expect(row).toMatchObject({ state: "scheduled", run_in: 0, attempt: 1, locked_by: null, finished_at: null });
      expect(row.errors).toHaveLength(1);
      expect(row.errors[0]).toMatchObject({ attempt: 1, class: "WorkerShutdownError", message: "cut short" });
      const { rows: counts } = await c.query("SELECT uncounted FROM idemq.jobs WHERE id = $1", [id]);
      expect(counts).toEqual([{ uncounted: 1 }]);

      // The next attempt is the job's one counted attempt: its failure fails the job.
      const again = await claimOne(c);
      expect(again).toMatchObject({ job_id: id, attempt: 2 });
      expect(await fail(c, id, again.attempt)).toBe("failed");
    });
  });

  it("counted => false still honours retry_at, and a non-retryable error still fails the job", async () => {
    await inRollback(db.pool, async (c) => {
      const later = await makeJob(c, { max_attempts: 5 });
      await claimOne(c);
      const { rows } = await c.query(
        `SELECT f.state, f.run_at = now() + interval '1 minute' AS at_retry_at
         FROM idemq.fail($1, 1, '"x"', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), retry_at => now() + interval '1 minute', counted => false) f`,
        [later],
      );
      expect(rows).toEqual([{ state: "scheduled", at_retry_at: true }]);

      const permanent = await makeJob(c, { max_attempts: 5, queue: unique("permanent") });
      const { queue } = await jobRow(c, permanent);
      await claimOne(c, { queues: [queue] });
      const { rows: failed } = await c.query(`SELECT f.state FROM idemq.fail($1, 1, '"x"', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), retryable => false, counted => false) f`, [permanent]);
      expect(failed).toEqual([{ state: "failed" }]);
    });
  });

  it("rejects an error that is neither an object nor a string (22023), and NULL error or retryable (22004)", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      for (const error of [42, ["a"], true]) {
        await underSavepoint(c, () =>
          expectSqlError(fail(c, id, 1, error), { code: "22023", message: /error must be a JSON object or string/ }),
        );
      }
      await underSavepoint(c, () =>
        expectSqlError(c.query("SELECT idemq.fail($1, 1, NULL, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id]), { code: "22004" }),
      );
      await underSavepoint(c, () =>
        expectSqlError(c.query(`SELECT idemq.fail($1, 1, '"x"', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), retryable => NULL)`, [id]), { code: "22004" }),
      );
      await underSavepoint(c, () =>
        expectSqlError(c.query(`SELECT idemq.fail($1, 1, '"x"', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), counted => NULL)`, [id]), { code: "22004" }),
      );
      expect(await jobRow(c, id)).toMatchObject({ state: "processing", errors: [] });
    });
  });

  it("raises IQ404 for an unknown job and IQ410 for a job the attempt does not hold", async () => {
    await inRollback(db.pool, async (c) => {
      await underSavepoint(c, () => expectSqlError(fail(c, "987654321", 1), { code: "IQ404" }));
      const id = await makeJob(c);
      await underSavepoint(c, () =>
        expectSqlError(fail(c, id, 1), {
          code: "IQ410",
          detail: { job_id: Number(id), attempt: 1, current_state: "enqueued" },
        }),
      );
      expect(await jobRow(c, id)).toMatchObject({ state: "enqueued", errors: [] });
    });
  });

  it("notifies idemq_jobs at commit when the retry is due at once, and not when it waits out a backoff", async () => {
    const listenerClient = await db.newClient();
    const listener = await Listener.start(listenerClient);
    const queue = unique("due-retry");
    const c = await db.pool.connect();
    try {
      const id = await makeJob(c, { queue, backoff: { kind: "fixed", delays: ["1 hour"] }, max_attempts: 5 });
      await listener.waitFor(queue); // the enqueue's own notification
      listener.received.length = 0;
      await claimOne(c, { queues: [queue] });
      await fail(c, id, 1, "waits an hour");
      await listener.sync(c);
      expect(listener.payloads()).not.toContain(queue);

      await makeDue(c, id);
      await claimOne(c, { queues: [queue] });
      await fail(c, id, 2, "again at once", { retry_at: sql("now() - interval '1 second'") });
      await listener.waitFor(queue);
    } finally {
      c.release();
    }
  });
});
