// idemq.hold (issue 26, item 5): back-pressure from an API. The attempt
// holding a job holds back its queue or task until a time (a 429's
// Retry-After): the job goes back to scheduled at that time without spending
// an attempt, and no claim of any client takes a job of the scope before it.
// Each case uses its own queue or task (unique()), since these commit. The
// clock hand a test moves directly is the hold's end (held_until), as
// makeDue moves a run_at; the real clock is test/worker/rate-limited.test.ts's.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase } from "../helpers/db.ts";
import { jobRow, makeJob, makeJobs, unique } from "../helpers/jobs.ts";
import { claim, claimOne, expireLease, fail, makeDue, rescue, type ClaimedJob } from "../helpers/work.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 4 });

/** hold() by the claim row's attempt and token; returns the held_until it answered. */
async function hold(job: ClaimedJob, scope: string, until: string, token: string | null = job.lease_token): Promise<Date> {
  const { rows } = await db.pool.query<{ held: Date }>(
    "SELECT idemq.hold(job_id => $1, attempt => $2, scope => $3, until => $4::timestamptz, lease_token => $5) AS held",
    [job.job_id, job.attempt, scope, until, token],
  );
  return rows[0]!.held;
}

async function dbNowPlus(interval: string): Promise<string> {
  const { rows } = await db.pool.query<{ t: string }>("SELECT (now() + $1::interval)::text AS t", [interval]);
  return rows[0]!.t;
}

async function heldUntil(scope: { queue?: string; task?: string }): Promise<Date | null | undefined> {
  const { rows } = await db.pool.query<{ held_until: Date | null }>(
    "SELECT held_until FROM idemq.limits() WHERE queue IS NOT DISTINCT FROM $1 AND task IS NOT DISTINCT FROM $2",
    [scope.queue ?? null, scope.task ?? null],
  );
  return rows[0]?.held_until;
}

/** The hold's end moved into the past (the clock hand), as makeDue moves a run_at. */
async function endHold(kind: "queue" | "task", name: string): Promise<void> {
  const { rowCount } = await db.pool.query(
    "UPDATE idemq.limits SET held_until = now() - interval '1 millisecond' WHERE kind = $1 AND name = $2 AND held_until IS NOT NULL",
    [kind, name],
  );
  expect(rowCount).toBe(1);
}

const claimToken = { token: true } as const;

describe("hold", () => {
  it("stops claims of the queue from every session until held_until, then they resume; other queues run on", async () => {
    const queue = unique("held");
    const other = unique("free");
    await makeJobs(db.pool, 4, { queue });
    const [otherId] = await makeJobs(db.pool, 1, { queue: other });
    const first = await claimOne(db.pool, { queues: [queue], ...claimToken });
    const until = await dbNowPlus("1 hour");
    const held = await hold(first, "queue", until);
    expect(held.toISOString()).toBe(new Date(until).toISOString());
    expect(await heldUntil({ queue })).toEqual(held);

    // Two sessions, each its own transaction: neither takes a job of the queue.
    const a = await db.pool.connect();
    const b = await db.pool.connect();
    try {
      expect(await claim(a, { queues: [queue], batch_size: 10, ...claimToken })).toEqual([]);
      expect(await claim(b, { queues: [queue], batch_size: 10, ...claimToken })).toEqual([]);
      // Unfiltered and by task: the held queue's jobs are skipped, another queue's are not.
      expect((await claim(b, { batch_size: 10, ...claimToken })).map((r) => r.job_id)).toEqual([otherId]);
      expect(await claim(a, { tasks: ["test_task"], queues: [queue], batch_size: 10, ...claimToken })).toEqual([]);
      // The held job is scheduled at until, its attempt not counted.
      expect(await jobRow(db.pool, first.job_id)).toMatchObject({ state: "scheduled", attempt: 1, uncounted: 1, errors: [] });

      await endHold("queue", queue);
      expect(await heldUntil({ queue })).toBeNull();
      const fromA = await claim(a, { queues: [queue], batch_size: 2, ...claimToken });
      const fromB = await claim(b, { queues: [queue], batch_size: 2, ...claimToken });
      expect(fromA).toHaveLength(2);
      expect(fromB).toHaveLength(1); // the 3 not held back; the 4th is scheduled at until
    } finally {
      a.release();
      b.release();
    }
  });

  it("on the real clock: two sessions claim nothing of the queue before held_until, and a job at or after it", async () => {
    const queue = unique("clock");
    await makeJobs(db.pool, 3, { queue });
    const first = await claimOne(db.pool, { queues: [queue], ...claimToken });
    await hold(first, "queue", await dbNowPlus("700 milliseconds"));
    // held_until as the database has it (to the microsecond), compared by the database.
    const { rows: heldRows } = await db.pool.query<{ t: string }>(
      "SELECT held_until::text AS t FROM idemq.limits WHERE kind = 'queue' AND name = $1",
      [queue],
    );
    const until = heldRows[0]!.t;
    const sessions = [await db.pool.connect(), await db.pool.connect()];
    const empties: { before: boolean }[] = [];
    try {
      let turn = 0;
      // Each claim in its own transaction, timed by that transaction's now() (the claim's clock).
      const taken = await waitFor(
        async () => {
          const c = sessions[turn++ % 2]!;
          await c.query("BEGIN");
          const { rows } = await c.query<{ before: boolean }>("SELECT now() < $1::timestamptz AS before", [until]);
          const got = await claim(c, { queues: [queue], batch_size: 5, ...claimToken });
          await c.query("COMMIT");
          if (got.length === 0) empties.push(rows[0]!);
          return got.length > 0 ? { before: rows[0]!.before, got } : undefined;
        },
        { what: "a claim after the hold", intervalMs: 50 },
      );
      expect(taken.before).toBe(false);
      expect(taken.got.map((j) => j.job_id)).toContain(first.job_id); // scheduled at until: runnable again then
      expect(taken.got).toHaveLength(3);
      expect(empties.length).toBeGreaterThan(0);
      // Every empty claim ran before held_until.
      expect(empties.every((e) => e.before)).toBe(true);
    } finally {
      for (const c of sessions) c.release();
    }
  });

  it("scope task holds that task in every queue, not the queue's other tasks", async () => {
    const task = unique("api-task");
    const queue = unique("mixed");
    await makeJobs(db.pool, 2, { queue, task });
    const [otherTask] = await makeJobs(db.pool, 1, { queue, task: "other_task" });
    const [elsewhere] = await makeJobs(db.pool, 1, { queue: unique("elsewhere"), task });
    const job = await claimOne(db.pool, { tasks: [task], queues: [queue], ...claimToken });
    await hold(job, "task", await dbNowPlus("10 minutes"));
    expect(await heldUntil({ task })).not.toBeNull();
    expect(await heldUntil({ queue })).toBeUndefined();
    expect((await claim(db.pool, { queues: [queue], batch_size: 10, ...claimToken })).map((r) => r.job_id)).toEqual([otherTask]);
    expect(await claim(db.pool, { tasks: [task], batch_size: 10, ...claimToken })).toEqual([]);
    await endHold("task", task);
    const after = await claim(db.pool, { tasks: [task], batch_size: 10, ...claimToken });
    expect(after.map((r) => r.job_id)).toContain(elsewhere);
    expect(after).toHaveLength(2);
  });

  it("does not spend the attempt: max_attempts 1, held, claimed again as attempt 2, whose failure is the one counted", async () => {
    const queue = unique("uncounted");
    const id = await makeJob(db.pool, { queue, max_attempts: 1 });
    const job = await claimOne(db.pool, { queues: [queue], ...claimToken });
    await hold(job, "queue", await dbNowPlus("5 minutes"));
    await endHold("queue", queue);
    await makeDue(db.pool, id);
    const again = await claimOne(db.pool, { queues: [queue], ...claimToken });
    expect(again).toMatchObject({ job_id: id, attempt: 2, reclaimed: false });
    expect(await fail(db.pool, id, again, "boom")).toBe("failed");
    expect((await jobRow(db.pool, id)).errors.map((e) => e.attempt)).toEqual([2]);
  });

  it("is fenced: a stale attempt or a wrong token gets IQ410 and holds nothing", async () => {
    const queue = unique("fenced");
    const id = await makeJob(db.pool, { queue });
    const stale = await claimOne(db.pool, { queues: [queue], ...claimToken });
    await expireLease(db.pool, id);
    expect(await rescue(db.pool)).toBeGreaterThanOrEqual(1);
    const current = await claimOne(db.pool, { queues: [queue], ...claimToken });
    const until = await dbNowPlus("1 hour");
    await expectSqlError(hold(stale, "queue", until), { code: "IQ410" });
    await expectSqlError(hold(current, "queue", until, "00000000-0000-4000-8000-000000000000"), { code: "IQ410" });
    await expectSqlError(hold(current, "queue", until, null), { code: "IQ410" });
    expect(await heldUntil({ queue })).toBeUndefined();
    expect(await jobRow(db.pool, id)).toMatchObject({ state: "processing", attempt: current.attempt });
  });

  it("keeps the later of two holds; resume() ends a hold; until not in the future snoozes only", async () => {
    const queue = unique("twice");
    await makeJobs(db.pool, 3, { queue });
    const [one, two] = await claim(db.pool, { queues: [queue], batch_size: 2, ...claimToken });
    const later = await dbNowPlus("20 minutes");
    await hold(one!, "queue", later);
    const kept = await hold(two!, "queue", await dbNowPlus("5 minutes"));
    expect(kept.toISOString()).toBe(new Date(later).toISOString());
    expect(await claim(db.pool, { queues: [queue], ...claimToken })).toEqual([]);
    const { rows } = await db.pool.query<{ resumed: boolean }>("SELECT idemq.resume(queue => $1) AS resumed", [queue]);
    expect(rows[0]!.resumed).toBe(true);
    expect(await heldUntil({ queue })).toBeUndefined();
    const third = await claimOne(db.pool, { queues: [queue], ...claimToken });
    await hold(third, "queue", await dbNowPlus("-1 second"));
    expect(await heldUntil({ queue })).toBeUndefined();
    expect((await jobRow(db.pool, third.job_id)).state).toBe("scheduled");
  });

  it("clear_limit keeps a hold; a row left with a passed hold only is deleted by the next hold", async () => {
    const queue = unique("clear");
    const next = unique("next");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 5)", [queue]);
    await makeJobs(db.pool, 2, { queue });
    await makeJobs(db.pool, 1, { queue: next });
    const job = await claimOne(db.pool, { queues: [queue], ...claimToken });
    await hold(job, "queue", await dbNowPlus("1 hour"));
    await db.pool.query("SELECT idemq.clear_limit(queue => $1)", [queue]);
    expect(await heldUntil({ queue })).not.toBeNull();
    expect(await claim(db.pool, { queues: [queue], ...claimToken })).toEqual([]);
    await endHold("queue", queue);
    const other = await claimOne(db.pool, { queues: [next], ...claimToken });
    await hold(other, "queue", await dbNowPlus("1 minute"));
    const { rows } = await db.pool.query("SELECT 1 FROM idemq.limits WHERE kind = 'queue' AND name = $1", [queue]);
    expect(rows).toEqual([]);
  });

  describe("bad input: an error with a HINT, nothing written", () => {
    const cases: [string, string, string, string, RegExp][] = [
      ["scope unknown", "customer", "now() + interval '1 minute'", "22023", /scope must be 'queue', 'task' or 'key', not customer/],
      ["scope key, job without a concurrency_key", "key", "now() + interval '1 minute'", "22023", /job \d+ has no concurrency_key/],
      ["scope NULL", "", "now() + interval '1 minute'", "22004", /scope must not be NULL/],
      ["until NULL", "queue", "NULL", "22004", /until must not be NULL/],
      ["until infinity", "queue", "'infinity'::timestamptz", "22023", /until must be a finite time/],
      ["until past duration_days", "queue", "now() + interval '36501 days'", "22023", /at most 36500 days ahead/],
    ];
    it.each(cases)("%s", async (_name, scope, until, code, message) => {
      const queue = unique("bad");
      const id = await makeJob(db.pool, { queue });
      const job = await claimOne(db.pool, { queues: [queue], ...claimToken });
      const error = await expectSqlError(
        db.pool.query(
          `SELECT idemq.hold(job_id => $1, attempt => $2, scope => nullif($3, ''), until => ${until}, lease_token => $4)`,
          [id, job.attempt, scope, job.lease_token],
        ),
        { code, message },
      );
      expect(error.hint ?? "").not.toBe("");
      expect(await heldUntil({ queue })).toBeUndefined();
      expect((await jobRow(db.pool, id)).state).toBe("processing");
    });
  });
});
