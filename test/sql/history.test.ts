// The dashboard's history: apply_retention()'s fold of idemq.job_counts adds
// each minute's counts to idemq.job_minutes, roll_up() its run and wait time
// buckets and the waiting jobs, history() reads it. The counts of a minute
// equal the jobs worked in it; a second call writes the same rows; minutes
// older than a day go; concurrent callers never count twice. Most tests roll back (now() is then one instant: their events fall
// in one minute, and the times are moved by hand where a test needs it).
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { backendPid, expectSqlError, inRollback, useTestDatabase, waitUntilBlocked } from "../helpers/db.ts";
import { makeJob, unique } from "../helpers/jobs.ts";
import { claim, complete, fail, makeDue } from "../helpers/work.ts";
import { RANGES } from "../../src/dashboard/charts-page.ts";

const db = useTestDatabase({ poolSize: 3 });

type Minute = { minute: Date; queue: string; task: string; started: string; succeeded: string; failed: string; retried: string };

async function minutes(c: pg.ClientBase, queue: string): Promise<Minute[]> {
  const { rows } = await c.query<Minute>(
    `SELECT minute, queue, task, started, succeeded, failed, retried, run_buckets, wait_buckets, waiting, oldest_waiting_seconds
     FROM idemq.job_minutes WHERE queue = $1 ORDER BY minute, task`,
    [queue],
  );
  return rows;
}

/** The fold, then a roll-up as if the last were more than a minute ago (roll_up() does one a minute). */
async function rollUpNow(c: pg.ClientBase): Promise<number> {
  await c.query("SELECT idemq.apply_retention()");
  await c.query("UPDATE idemq.job_minutes_mark SET rolled_at = rolled_at - interval '1 minute'");
  const { rows } = await c.query<{ n: number }>("SELECT idemq.roll_up() AS n");
  return rows[0]!.n;
}

/** In queue q: 3 jobs of task a succeed, 1 of task b fails for good, 1 of task b fails, is retried and runs again; 2 of a wait. */
async function workSome(c: pg.ClientBase, q: string): Promise<void> {
  for (let i = 0; i < 3; i++) await makeJob(c, { queue: q, task: "a" });
  await makeJob(c, { queue: q, task: "b", max_attempts: 1 });
  const retried = await makeJob(c, { queue: q, task: "b", max_attempts: 3 });
  const jobs = await claim(c, { queues: [q], batch_size: 10 });
  expect(jobs).toHaveLength(5);
  for (const j of jobs) {
    if (j.task === "a") await complete(c, j.job_id, j);
    else expect(await fail(c, j.job_id, j)).toBe(j.job_id === retried ? "scheduled" : "failed");
  }
  await makeDue(c, retried);
  expect(await claim(c, { queues: [q] })).toHaveLength(1);
  // Run times of 300 ms (bucket 200-500 ms), waits of 30 ms (20-50 ms).
  await c.query(
    `UPDATE idemq.jobs SET locked_at = coalesce(finished_at, now()) - interval '300 milliseconds',
                          run_at = coalesce(finished_at, now()) - interval '330 milliseconds' WHERE queue = $1`,
    [q],
  );
  await makeJob(c, { queue: q, task: "a" });
  await makeJob(c, { queue: q, task: "a" });
}

describe("roll_up", () => {
  it("counts each minute's attempts and finishes per queue and task, and samples the waiting jobs", async () => {
    await inRollback(db.pool, async (c) => {
      const q = unique("hist");
      await workSome(c, q);
      expect(await rollUpNow(c)).toBeGreaterThan(0);
      const rows = await minutes(c, q);
      const now = (await c.query<{ now: Date }>("SELECT date_bin('1 minute', now(), '2000-01-01+00') AS now")).rows[0]!.now;
      expect(rows).toEqual([
        {
          minute: now, queue: q, task: "a", started: "3", succeeded: "3", failed: "0", retried: "0",
          run_buckets: { "8": 3 }, wait_buckets: { "5": 3 }, waiting: "2", oldest_waiting_seconds: "0",
        },
        {
          minute: now, queue: q, task: "b", started: "3", succeeded: "0", failed: "1", retried: "1",
          run_buckets: { "8": 1 }, wait_buckets: { "5": 1 }, waiting: "0", oldest_waiting_seconds: "0",
        },
      ]);
      const { rows: history } = await c.query("SELECT * FROM idemq.history(queue => $1)", [q]);
      expect(history).toEqual([
        {
          minute: now, started: "6", succeeded: "3", failed: "1", retried: "1", waiting: "2", oldest_waiting_seconds: "0",
          run_p50_ms: "500", run_p95_ms: "500", wait_p50_ms: "50", wait_p95_ms: "50",
        },
      ]);
      const { rows: onlyB } = await c.query("SELECT started, failed FROM idemq.history(queue => $1, task => 'b')", [q]);
      expect(onlyB).toEqual([{ started: "3", failed: "1" }]);
    });
  });

  it("puts each count in its statement's minute, and each run time in its job's finish minute", async () => {
    await inRollback(db.pool, async (c) => {
      const q = unique("hist");
      await workSome(c, q);
      // Task a's claim 10 minutes ago, its completions 5 minutes ago (the statements' start).
      await c.query(
        `UPDATE idemq.job_counts SET at = now() - CASE state WHEN 'processing' THEN interval '10 minutes' ELSE interval '5 minutes' END
         WHERE queue = $1 AND task = 'a' AND n > 0 AND state IN ('processing', 'succeeded')`,
        [q],
      );
      await c.query(
        `UPDATE idemq.jobs SET locked_at = now() - interval '10 minutes', run_at = now() - interval '10 minutes',
                              finished_at = now() - interval '5 minutes' WHERE queue = $1 AND task = 'a' AND state = 'succeeded'`,
        [q],
      );
      await rollUpNow(c);
      const { rows } = await c.query<{ ago: number; started: string; succeeded: string; run: unknown }>(
        `SELECT round(extract(epoch FROM date_bin('1 minute', now(), '2000-01-01+00') - minute) / 60)::int AS ago,
                started, succeeded, run_buckets AS run
         FROM idemq.job_minutes WHERE queue = $1 AND task = 'a' AND (started > 0 OR succeeded > 0) ORDER BY minute`,
        [q],
      );
      // 5 minutes of 300,000 ms: bucket 17 (200 s to 500 s).
      expect(rows).toEqual([
        { ago: 10, started: "3", succeeded: "0", run: {} },
        { ago: 5, started: "0", succeeded: "3", run: { "17": 3 } },
      ]);
    });
  });

  it("writes the same rows when called again, and does one roll-up a minute whoever calls", async () => {
    await inRollback(db.pool, async (c) => {
      const q = unique("hist");
      await workSome(c, q);
      await rollUpNow(c);
      const first = await minutes(c, q);
      const { rows } = await c.query("SELECT idemq.roll_up() AS n");
      expect(rows).toEqual([{ n: 0 }]);
      await rollUpNow(c);
      await rollUpNow(c);
      expect(await minutes(c, q)).toEqual(first);
      expect(first.map((r) => Number(r.started))).toEqual([3, 3]);
    });
  });

  it("keeps a day: older minutes are deleted, counts stamped before it not added", async () => {
    await inRollback(db.pool, async (c) => {
      const q = unique("hist");
      await workSome(c, q);
      await c.query(
        `INSERT INTO idemq.job_minutes (minute, queue, task, started)
         VALUES (date_bin('1 minute', now() - interval '1 day 1 minute', '2000-01-01+00'), $1, 'old', 7),
                (date_bin('1 minute', now() - interval '23 hours', '2000-01-01+00'), $1, 'kept', 7)`,
        [q],
      );
      await c.query("UPDATE idemq.job_counts SET at = now() - interval '25 hours' WHERE queue = $1 AND task = 'a'", [q]);
      await rollUpNow(c);
      const rows = await minutes(c, q);
      expect(rows.map((r) => [r.task, r.started, r.succeeded])).toEqual([
        ["kept", "7", "0"],
        ["a", "0", "0"],
        ["b", "3", "0"],
      ]);
      const { rows: old } = await c.query("SELECT count(*)::int AS n FROM idemq.job_minutes WHERE minute < now() - interval '1 day'");
      expect(old).toEqual([{ n: 0 }]);
      // The fold kept the counts (stats()) whatever their age.
      const { rows: counts } = await c.query("SELECT state::text, jobs::int FROM idemq._job_counts() WHERE queue = $1 AND task = 'a' ORDER BY 1", [q]);
      expect(counts).toEqual([{ state: "enqueued", jobs: 2 }, { state: "succeeded", jobs: 3 }]);
    });
  });

  it("two folds at once: each count row is taken by one, added once; a concurrent roll-up returns 0 at once", async () => {
    const q = unique("hist-conc");
    const a = await db.newClient();
    const b = await db.newClient();
    await workSome(a, q);
    // The mark's row exists from the first call on (a caller meeting
    // another's insert of it would wait for that commit, once per install).
    await a.query("SELECT idemq.roll_up()");
    await a.query("UPDATE idemq.job_minutes_mark SET rolled_at = '-infinity'");
    await b.query("SET statement_timeout = '10s'");
    await a.query("BEGIN");
    await a.query("SELECT idemq.apply_retention()");
    expect((await a.query<{ n: number }>("SELECT idemq.roll_up() AS n")).rows[0]!.n).toBeGreaterThan(0);
    // SKIP LOCKED: b's fold takes none of the rows a's holds, and b's roll-up does not wait for a's.
    expect((await b.query("SELECT idemq.roll_up() AS n")).rows).toEqual([{ n: 0 }]);
    await b.query("SELECT idemq.apply_retention()");
    expect((await minutes(b, q)).filter((r) => r.started !== "0")).toEqual([]);
    await a.query("COMMIT");
    await b.query("SELECT idemq.apply_retention()");
    const rows = await minutes(b, q);
    expect(rows.map((r) => [r.task, r.started, r.succeeded, r.failed, r.retried])).toEqual([
      ["a", "3", "3", "0", "0"],
      ["b", "3", "0", "1", "1"],
    ]);
  });

  it("two folds racing on the same minute row: the second waits for the first, then adds its own rows", async () => {
    const q = unique("hist-race");
    const a = await db.newClient();
    const b = await db.newClient();
    await makeJob(a, { queue: q, task: "x" });
    await makeJob(a, { queue: q, task: "x" });
    await a.query("BEGIN");
    expect(await claim(a, { queues: [q], batch_size: 1 })).toHaveLength(1);
    await a.query("SELECT idemq.apply_retention()");
    // b's claim commits its own count row; its fold adds it to the minute row a's fold holds.
    expect(await claim(b, { queues: [q], batch_size: 1 })).toHaveLength(1);
    const bPid = await backendPid(b);
    const folding = b.query("SELECT idemq.apply_retention()");
    await waitUntilBlocked(db.pool, bPid);
    await a.query("COMMIT");
    await folding;
    const rows = await minutes(b, q);
    expect(rows.map((r) => [r.task, r.started])).toEqual([["x", "2"]]);
  });
});

describe("history", () => {
  it("refuses a since that is not positive or over the day kept (22023), and NULL (22004)", async () => {
    await expectSqlError(db.pool.query("SELECT * FROM idemq.history(since => '0')"), { code: "22023", hint: /keeps a day/ });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.history(since => '25 hours')"), { code: "22023", hint: /keeps a day/ });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.history(since => NULL)"), { code: "22004" });
  });

  it("the dashboard's longest range is the history kept (_history_kept), and history() takes it", async () => {
    const { rows } = await db.pool.query("SELECT extract(epoch FROM idemq._history_kept())::int / 60 AS minutes");
    expect(rows[0].minutes).toBe(Math.max(...Object.values(RANGES).map((r) => r.minutes)));
    const since = `${rows[0].minutes} minutes`;
    await db.pool.query("SELECT * FROM idemq.history(since => $1::interval)", [since]);
  });

  it("reads the minutes of the window only, oldest first", async () => {
    await inRollback(db.pool, async (c) => {
      const q = unique("hist");
      await c.query(
        `INSERT INTO idemq.job_minutes (minute, queue, task, started, succeeded)
         SELECT date_bin('1 minute', now() - m * interval '1 minute', '2000-01-01+00'), $1, t, m, 1
         FROM generate_series(0, 90, 30) m, unnest('{x,y}'::text[]) t`,
        [q],
      );
      const { rows: hour } = await c.query("SELECT started, succeeded FROM idemq.history(queue => $1)", [q]);
      expect(hour).toEqual([
        { started: "120", succeeded: "2" },
        { started: "60", succeeded: "2" },
        { started: "0", succeeded: "2" },
      ]);
    });
  });
});
