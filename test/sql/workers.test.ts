// Worker presence: worker_seen() registers and refreshes a worker's row in
// idemq.workers, worker_stopped() marks it stopped, workers() lists them,
// unserved_jobs() finds runnable jobs no live worker claims, and
// apply_retention() deletes rows not seen for worker_retention_seconds and
// rows stopped for stopped_worker_seconds. Each
// test runs in a transaction that rolls back; "stale" is made by moving a
// row's last_seen_at back (the test runs as the owner).
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { makeJob, sql } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 2 });

type C = pg.ClientBase;

async function seen(c: C, workerId: string, queues: string[] | null = null, tasks: string[] | null = null): Promise<void> {
  await c.query("SELECT idemq.worker_seen(worker_id => $1, queues => $2, tasks => $3)", [workerId, queues, tasks]);
}

async function rows(c: C): Promise<{ worker_id: string; queues: string[] | null; tasks: string[] | null; age_s: number; started_s: number }[]> {
  const { rows } = await c.query(
    `SELECT w.worker_id, w.queues, w.tasks,
            extract(epoch FROM now() - w.last_seen_at)::float8 AS age_s,
            extract(epoch FROM now() - w.started_at)::float8 AS started_s
       FROM idemq.workers() w`,
  );
  return rows;
}

async function unserved(c: C, within = "2 minutes"): Promise<[string, string, number, boolean][]> {
  const { rows } = await c.query<{ queue: string; task: string; jobs: string; last_seen_at: Date | null }>(
    "SELECT * FROM idemq.unserved_jobs(seen_within => $1)",
    [within],
  );
  return rows.map((r) => [r.queue, r.task, Number(r.jobs), r.last_seen_at !== null]);
}

async function age(c: C, workerId: string, by: string): Promise<void> {
  await c.query("UPDATE idemq.workers SET last_seen_at = now() - $2::interval, started_at = now() - $2::interval WHERE worker_id = $1", [
    workerId,
    by,
  ]);
}

describe("worker_seen", () => {
  it("registers a worker with its queues and tasks, sorted and without duplicates", async () => {
    await inRollback(db.pool, async (c) => {
      await seen(c, "w1", ["b", "a", "b"], ["send", "bill"]);
      await seen(c, "w2");
      expect((await rows(c)).map((r) => [r.worker_id, r.queues, r.tasks])).toEqual([
        ["w1", ["a", "b"], ["bill", "send"]],
        ["w2", null, null],
      ]);
    });
  });

  it("a refresh moves last_seen_at to now and keeps started_at", async () => {
    await inRollback(db.pool, async (c) => {
      await seen(c, "w1", null, ["a"]);
      await age(c, "w1", "10 minutes");
      await seen(c, "w1", null, ["a", "b"]);
      const [row] = await rows(c);
      expect(row!.age_s).toBe(0);
      expect(row!.started_s).toBe(600);
      expect(row!.tasks).toEqual(["a", "b"]);
    });
  });

  it("refuses bad arguments with a HINT, and writes nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const cases: [unknown[], string, RegExp][] = [
        [[null, null, null], "22004", /worker_id must be a non-empty string/],
        [["", null, null], "22023", /worker_id must be a non-empty string/],
        [["x".repeat(257), null, null], "22023", /worker_id is 257 bytes, over the limit of 256 bytes \(worker_id_bytes/],
        [["w", [], null], "22023", /queues must be NULL \(every queue\) or a non-empty list/],
        [["w", [""], null], "22023", /queues must be NULL/],
        [["w", ["q".repeat(1001)], null], "22023", /queue names of 1 to 1000 characters/],
        [["w", null, []], "22023", /tasks must be NULL \(any task\) or a non-empty list/],
        [["w", null, [null]], "22023", /tasks must be NULL/],
        [["w", null, ["t".repeat(257)]], "22023", /a task name is 257 bytes, over the limit of 256 bytes \(task_bytes/],
      ];
      for (const [args, code, message] of cases) {
        await underSavepoint(c, () =>
          expectSqlError(c.query("SELECT idemq.worker_seen(worker_id => $1, queues => $2, tasks => $3)", args), {
            code,
            message,
            hint: /./,
          }),
        );
      }
      expect(await rows(c)).toEqual([]);
    });
  });

  it("stores host, pid, concurrency, refresh_every and outages; a call leaving one NULL keeps it; last_outage_at moves when outages rises", async () => {
    await inRollback(db.pool, async (c) => {
      const read = async () =>
        (
          await c.query(
            `SELECT host, pid, concurrency, refresh_every::text AS every, outages, outage_ms::int AS outage_ms, last_outage_at, late
               FROM idemq.workers() WHERE worker_id = 'w1'`,
          )
        ).rows[0];
      await seen(c, "w1");
      expect(await read()).toEqual({ host: null, pid: null, concurrency: null, every: null, outages: 0, outage_ms: 0, last_outage_at: null, late: null });
      await c.query("SELECT idemq.worker_seen(worker_id => 'w1', host => 'h1', pid => 7, concurrency => 4, refresh_every => '10 seconds', outages => 0, outage_ms => 0)");
      expect(await read()).toMatchObject({ host: "h1", pid: 7, concurrency: 4, every: "00:00:10", outages: 0, last_outage_at: null, late: false });
      await seen(c, "w1"); // a caller that does not know them (a 0.1.0 worker) takes nothing away
      expect(await read()).toMatchObject({ host: "h1", pid: 7, concurrency: 4, every: "00:00:10", outages: 0 });
      await c.query("SELECT idemq.worker_seen(worker_id => 'w1', outages => 1, outage_ms => 2500)");
      const after = await read();
      expect(after).toMatchObject({ outages: 1, outage_ms: 2500 });
      expect(after.last_outage_at).toBeInstanceOf(Date);
      await c.query("UPDATE idemq.workers SET last_outage_at = '2026-01-01Z' WHERE worker_id = 'w1'");
      await c.query("SELECT idemq.worker_seen(worker_id => 'w1', outages => 1, outage_ms => 2500)");
      expect((await read()).last_outage_at).toEqual(new Date("2026-01-01Z")); // the same count: no new outage
      // late: two refreshes missed, by the database's clock; at the boundary it is not yet.
      await c.query("UPDATE idemq.workers SET last_seen_at = now() - interval '20 seconds' WHERE worker_id = 'w1'");
      expect((await read()).late).toBe(false);
      await c.query("UPDATE idemq.workers SET last_seen_at = now() - interval '20.001 seconds' WHERE worker_id = 'w1'");
      expect((await read()).late).toBe(true);
    });
  });

  it("refuses a bad host, pid, concurrency, refresh_every or outage count with a HINT, and writes nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const cases: [string, RegExp][] = [
        ["host => ''", /host must not be empty/],
        [`host => '${"h".repeat(257)}'`, /host is 257 bytes, over the limit of 256 bytes/],
        ["pid => 0", /pid and concurrency must be at least 1/],
        ["concurrency => 0", /pid and concurrency must be at least 1/],
        ["outages => -1", /outages and outage_ms at least 0/],
        ["outage_ms => -1", /outages and outage_ms at least 0/],
        ["refresh_every => '0 seconds'", /refresh_every must be positive/],
        ["refresh_every => '-1 seconds'", /refresh_every must be positive/],
        ["refresh_every => '100001 days'", /refresh_every/],
      ];
      for (const [arg, message] of cases) {
        await underSavepoint(c, () => expectSqlError(c.query(`SELECT idemq.worker_seen(worker_id => 'w', ${arg})`), { code: "22023", message, hint: /./ }));
      }
      expect(await rows(c)).toEqual([]);
    });
  });

  it("refuses more names than worker_names, queues and tasks together", async () => {
    await inRollback(db.pool, async (c) => {
      await c.query("UPDATE idemq.settings SET value = 3 WHERE name = 'worker_names'");
      await seen(c, "ok", ["q1"], ["t1", "t2"]);
      await underSavepoint(c, () =>
        expectSqlError(c.query("SELECT idemq.worker_seen(worker_id => 'w', queues => '{q1,q2}', tasks => '{t1,t2}')"), {
          code: "22023",
          message: "worker_seen: 4 queue and task names, over the limit of 3 (worker_names)",
          hint: /raise worker_names/,
        }),
      );
      expect((await rows(c)).map((r) => r.worker_id)).toEqual(["ok"]);
    });
  });
});

describe("worker_stopped", () => {
  it("marks only the named worker's row stopped and says whether it had a live one; NULL is refused", async () => {
    await inRollback(db.pool, async (c) => {
      await seen(c, "w1");
      await seen(c, "w2");
      await age(c, "w1", "10 seconds");
      expect((await c.query("SELECT idemq.worker_stopped(worker_id => 'w1') AS r")).rows[0].r).toBe(true);
      expect((await c.query("SELECT idemq.worker_stopped(worker_id => 'w1') AS r")).rows[0].r).toBe(false);
      expect((await c.query("SELECT idemq.worker_stopped(worker_id => 'nobody') AS r")).rows[0].r).toBe(false);
      // Kept, stopped, after the live ones; its last refresh stays what it was.
      const { rows: listed } = await c.query(
        `SELECT w.worker_id, w.stopped_at IS NOT NULL AS stopped, w.stopped_at = now() AS stopped_now, w.late,
                extract(epoch FROM now() - w.last_seen_at)::int AS age_s
           FROM idemq.workers() w`,
      );
      expect(listed).toEqual([
        { worker_id: "w2", stopped: false, stopped_now: null, late: null, age_s: 0 },
        { worker_id: "w1", stopped: true, stopped_now: true, late: false, age_s: 10 },
      ]);
      await underSavepoint(c, () =>
        expectSqlError(c.query("SELECT idemq.worker_stopped(worker_id => NULL)"), { code: "22004", hint: /worker_seen/ }),
      );
    });
  });

  it("a stopped worker is never late and serves nothing (unserved_jobs); worker_seen of its id starts it again, live", async () => {
    await inRollback(db.pool, async (c) => {
      await makeJob(c, { task: "t", queue: "q" });
      await c.query("SELECT idemq.worker_seen(worker_id => 'w', tasks => '{t}', refresh_every => '1 second')");
      await age(c, "w", "1 minute");
      expect(await unserved(c)).toEqual([]);
      await c.query("SELECT idemq.worker_stopped(worker_id => 'w')");
      expect(await unserved(c)).toEqual([["q", "t", 1, false]]);
      expect((await c.query("SELECT late FROM idemq.workers()")).rows).toEqual([{ late: false }]);
      await seen(c, "w", null, ["t"]);
      expect(await unserved(c)).toEqual([]);
      const { rows: again } = await c.query("SELECT stopped_at, started_at = now() AS restarted FROM idemq.workers()");
      expect(again).toEqual([{ stopped_at: null, restarted: true }]);
    });
  });
});

describe("unserved_jobs", () => {
  it("a runnable job of a task no worker has is reported; a live worker with it clears it", async () => {
    await inRollback(db.pool, async (c) => {
      await makeJob(c, { task: "orphan", queue: "q" });
      await makeJob(c, { task: "orphan", queue: "q" });
      expect(await unserved(c)).toEqual([["q", "orphan", 2, false]]);
      await seen(c, "w1", null, ["other"]);
      expect(await unserved(c)).toEqual([["q", "orphan", 2, false]]);
      await seen(c, "w2", ["q"], ["orphan"]);
      expect(await unserved(c)).toEqual([]);
    });
  });

  it("a worker covers a job as claim() would: its queue (NULL: any) and its task (NULL: any)", async () => {
    await inRollback(db.pool, async (c) => {
      await makeJob(c, { task: "t", queue: "q1" });
      await makeJob(c, { task: "t", queue: "q2" });
      await makeJob(c, { task: "u", queue: "q1" });
      await seen(c, "only-q1-t", ["q1"], ["t"]);
      expect(await unserved(c)).toEqual([
        ["q1", "u", 1, false],
        ["q2", "t", 1, false],
      ]);
      await seen(c, "any-task-on-q2", ["q2"], null);
      expect(await unserved(c)).toEqual([["q1", "u", 1, false]]);
      await seen(c, "u-anywhere", null, ["u"]);
      expect(await unserved(c)).toEqual([]);
    });
  });

  it("a stale worker does not count: just inside the window it does, just outside it does not", async () => {
    await inRollback(db.pool, async (c) => {
      await makeJob(c, { task: "t", queue: "q" });
      await seen(c, "w", null, ["t"]);
      await age(c, "w", "2 minutes");
      expect(await unserved(c, "2 minutes 1 second")).toEqual([]);
      expect(await unserved(c, "2 minutes")).toEqual([]); // seen exactly seen_within ago: still live
      expect(await unserved(c, "1 minute 59 seconds")).toEqual([["q", "t", 1, true]]);
      const { rows } = await c.query("SELECT extract(epoch FROM now() - last_seen_at)::int AS s FROM idemq.unserved_jobs('1 minute')");
      expect(rows).toEqual([{ s: 120 }]);
    });
  });

  it("counts only runnable jobs: not a future run_at, a processing, awaiting, finished or expired job", async () => {
    await inRollback(db.pool, async (c) => {
      await makeJob(c, { task: "t", queue: "q", run_at: sql("now() + interval '1 hour'") });
      const parent = await makeJob(c, { task: "p", queue: "busy" });
      await c.query("SELECT * FROM idemq.claim(worker_id => 'sql', queues => '{busy}')");
      await makeJob(c, { task: "t", queue: "q", after: [parent] });
      await makeJob(c, { task: "t", queue: "q", expires_at: sql("now() - interval '1 second'") });
      const gone = await makeJob(c, { task: "t", queue: "q" });
      await c.query("SELECT idemq.cancel(job_id => $1)", [gone]);
      expect(await unserved(c)).toEqual([]);
      await makeJob(c, { task: "t", queue: "q", run_at: sql("now() - interval '5 minutes'") });
      const { rows } = await c.query("SELECT jobs, oldest_runnable_seconds FROM idemq.unserved_jobs('1 minute')");
      expect(rows).toEqual([{ jobs: "1", oldest_runnable_seconds: "300" }]);
      // The same age stats() reports: one definition of runnable (_runnable_jobs).
      const stats = await c.query("SELECT value FROM idemq.stats() WHERE metric = 'oldest_runnable_seconds' AND queue = 'q'");
      expect(stats.rows).toEqual([{ value: "300" }]);
    });
  });

  it("refuses a NULL, non-positive or too long seen_within", async () => {
    await inRollback(db.pool, async (c) => {
      for (const [value, code, message] of [
        [null, "22004", /must not be NULL/],
        ["0", "22023", /must be positive, not 00:00:00/],
        ["-1 minute", "22023", /must be positive/],
        ["1000000 days", "22023", /seen_within must be at most 36500 days/],
      ] as const) {
        await underSavepoint(c, () =>
          expectSqlError(c.query("SELECT * FROM idemq.unserved_jobs(seen_within => $1)", [value]), { code, message, hint: /./ }),
        );
      }
    });
  });
});

describe("apply_retention and stale workers", () => {
  it("deletes rows not seen for worker_retention_seconds, keeps the others, and does not count them", async () => {
    await inRollback(db.pool, async (c) => {
      await seen(c, "crashed");
      await seen(c, "recent");
      await seen(c, "live");
      await age(c, "crashed", "1 day 1 second");
      await age(c, "recent", "23 hours 59 minutes");
      expect((await c.query("SELECT idemq.apply_retention() AS n")).rows[0].n).toBe(0);
      expect((await rows(c)).map((r) => r.worker_id).sort()).toEqual(["live", "recent"]);
      await c.query("UPDATE idemq.settings SET value = 60 WHERE name = 'worker_retention_seconds'");
      await c.query("SELECT idemq.apply_retention()");
      expect((await rows(c)).map((r) => r.worker_id)).toEqual(["live"]);
    });
  });

  it("deletes rows stopped more than stopped_worker_seconds ago (an hour), keeps those just inside, and does not count them", async () => {
    await inRollback(db.pool, async (c) => {
      for (const w of ["stopped-long-ago", "stopped-just-inside", "live"]) await seen(c, w);
      for (const w of ["stopped-long-ago", "stopped-just-inside"]) await c.query("SELECT idemq.worker_stopped(worker_id => $1)", [w]);
      await c.query("UPDATE idemq.workers SET stopped_at = now() - interval '1 hour 1 second' WHERE worker_id = 'stopped-long-ago'");
      await c.query("UPDATE idemq.workers SET stopped_at = now() - interval '59 minutes 59 seconds' WHERE worker_id = 'stopped-just-inside'");
      expect((await c.query("SELECT idemq.apply_retention() AS n")).rows[0].n).toBe(0);
      expect((await rows(c)).map((r) => r.worker_id)).toEqual(["live", "stopped-just-inside"]);
      await c.query("UPDATE idemq.settings SET value = 60 WHERE name = 'stopped_worker_seconds'");
      await c.query("SELECT idemq.apply_retention()");
      expect((await rows(c)).map((r) => r.worker_id)).toEqual(["live"]);
    });
  });
});
