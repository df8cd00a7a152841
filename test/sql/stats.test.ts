// idemq.stats(): counts per (queue, task, state), expired leases, the age of
// the oldest runnable job, and the events counted per task (deduplicated,
// rejected, conflict, guard_duplicate). Each test builds its jobs in a
// transaction that rolls back, so every count is exact.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { useTestDatabase, inRollback, expectSqlError } from "../helpers/db.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { makeJob, sql } from "../helpers/jobs.ts";
import { claim } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });

type C = pg.ClientBase;
type Row = [queue: string | null, task: string, metric: string, value: number];

async function stats(c: C, metrics?: string[]): Promise<Row[]> {
  const { rows } = await c.query<{ queue: string | null; task: string; metric: string; value: string }>(
    "SELECT * FROM idemq.stats()",
  );
  return rows
    .filter((r) => metrics === undefined || metrics.includes(r.metric))
    .map((r) => [r.queue, r.task, r.metric, Number(r.value)]);
}

const STATES = ["scheduled", "enqueued", "processing", "awaiting", "succeeded", "failed", "expired", "cancelled"];

describe("stats", () => {
  it("a database without jobs or events has no rows", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await stats(c)).toEqual([]);
    });
  });

  it("counts jobs per queue, task and state, non-zero rows only", async () => {
    await inRollback(db.pool, async (c) => {
      for (let i = 0; i < 3; i++) await makeJob(c, { task: "mail", queue: "q1" });
      await makeJob(c, { task: "sms", queue: "q1" });
      await makeJob(c, { task: "mail", queue: "q2", run_at: sql("now() + interval '1 hour'") });
      await makeJob(c, { task: "mail", queue: "q2", run_at: sql("now() + interval '1 hour'") });
      const parent = await makeJob(c, { task: "sms", queue: "q3" });
      await makeJob(c, { task: "sms", queue: "q2", after: [parent] });
      await claim(c, { worker_id: "w", queues: ["q1"] }); // the first mail job (lowest id)

      // Terminal states in their own queue.
      const [ok] = await claim(c, { worker_id: "w", queues: ["q3"] }); // the parent: succeeded, so its child leaves awaiting
      await c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", [ok!.job_id, ok!.attempt, ok!.lease_token]);
      await makeJob(c, { task: "t", queue: "q4", max_attempts: 1 });
      const [bad] = await claim(c, { worker_id: "w", queues: ["q4"] });
      await c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => $3, error => '"x"')`, [bad!.job_id, bad!.attempt, bad!.lease_token]);
      const gone = await makeJob(c, { task: "t", queue: "q4" });
      await c.query("SELECT idemq.cancel(job_id => $1)", [gone]);
      await makeJob(c, { task: "t", queue: "q4", expires_at: sql("now() - interval '1 second'") });
      await c.query("SELECT idemq.rescue()");
      await makeJob(c, { task: "waits", queue: "q5", after: [gone, parent] }); // cancelled parent -> cancelled
      const p2 = await makeJob(c, { task: "t", queue: "q6", run_at: sql("now() + interval '1 day'") });
      await makeJob(c, { task: "waits", queue: "q5", after: [p2] });

      expect(await stats(c, STATES)).toEqual([
        ["q1", "mail", "enqueued", 2],
        ["q1", "mail", "processing", 1],
        ["q1", "sms", "enqueued", 1],
        ["q2", "mail", "scheduled", 2],
        ["q2", "sms", "enqueued", 1],
        ["q3", "sms", "succeeded", 1],
        ["q4", "t", "cancelled", 1],
        ["q4", "t", "expired", 1],
        ["q4", "t", "failed", 1],
        ["q5", "waits", "awaiting", 1],
        ["q5", "waits", "cancelled", 1],
        ["q6", "t", "scheduled", 1],
      ]);
    });
  });

  it("rows come ordered by queue, task, metric, with the per-task events (queue NULL) last", async () => {
    await inRollback(db.pool, async (c) => {
      await makeJob(c, { task: "b", queue: "q2" });
      await makeJob(c, { task: "a", queue: "q1" });
      await makeJob(c, { task: "a", queue: "q1", idempotency_key: "k" });
      await makeJob(c, { task: "a", queue: "q1", idempotency_key: "k" });
      const rows = await stats(c);
      expect(rows.map(([q, t, m]) => [q, t, m])).toEqual([
        ["q1", "a", "enqueued"],
        ["q1", "a", "oldest_runnable_seconds"],
        ["q2", "b", "enqueued"],
        ["q2", "b", "oldest_runnable_seconds"],
        [null, "a", "deduplicated"],
      ]);
    });
  });

  it("lease_expired: a lease that ran out before now() counts; one ending exactly now() does not; rescue clears it", async () => {
    await inRollback(db.pool, async (c) => {
      for (let i = 0; i < 3; i++) await makeJob(c, { task: "job", queue: "leases" });
      const held = await claim(c, { worker_id: "w", queues: ["leases"], batch_size: 3 });
      await c.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 microsecond' WHERE id = $1", [held[0]!.job_id]);
      await c.query("UPDATE idemq.jobs SET lease_expires_at = now() WHERE id = $1", [held[1]!.job_id]);
      expect(await stats(c, ["lease_expired", "processing"])).toEqual([
        ["leases", "job", "lease_expired", 1],
        ["leases", "job", "processing", 3],
      ]);
      await c.query("SELECT idemq.rescue()");
      expect(await stats(c, ["lease_expired", "processing"])).toEqual([["leases", "job", "processing", 2]]);
    });
  });

  it("oldest_runnable_seconds: whole seconds since the oldest due run_at, per queue and task; future, processing and awaiting jobs excluded", async () => {
    await inRollback(db.pool, async (c) => {
      const old = await makeJob(c, { task: "job", queue: "age" });
      const older = await makeJob(c, { task: "job", queue: "age" });
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '99.9 seconds' WHERE id = $1", [old]);
      // A scheduled job whose run_at passed is runnable, so it counts.
      const due = await makeJob(c, { task: "job", queue: "age", run_at: sql("now() + interval '1 hour'") });
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '42 seconds' WHERE id = $1", [due]);
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '10 seconds' WHERE id = $1", [older]);
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([["age", "job", "oldest_runnable_seconds", 99]]);

      // Future (scheduled) jobs and processing jobs do not count.
      await makeJob(c, { task: "later", queue: "age", run_at: sql("now() + interval '1 microsecond'") });
      const running = await makeJob(c, { task: "running", queue: "age2" });
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '1 hour' WHERE id = $1", [running]);
      await claim(c, { worker_id: "w", queues: ["age2"] });
      // Awaiting jobs are not runnable either.
      const parent = await makeJob(c, { task: "parent", queue: "age3", run_at: sql("now() + interval '1 day'") });
      await makeJob(c, { task: "child", queue: "age3", after: [parent] });
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '1 hour' WHERE task = 'child'");
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([["age", "job", "oldest_runnable_seconds", 99]]);
    });
  });

  it("oldest_runnable_seconds boundary: run_at = now() gives 0; run_at one microsecond later gives no row", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { task: "edge", queue: "edge" });
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([["edge", "edge", "oldest_runnable_seconds", 0]]);
      await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now() + interval '1 microsecond')", [id]);
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([]);
    });
  });

  it("oldest_runnable_seconds leaves out a job past its expires_at (claim never hands it out): expires_at = now() excluded, now() + 1 µs counted", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { task: "late", queue: "late", expires_at: sql("now() + interval '1 hour'") });
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '30 seconds', expires_at = now() WHERE id = $1", [id]);
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([]);
      expect((await c.query("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY['late'])")).rows).toEqual([]);
      await c.query("UPDATE idemq.jobs SET expires_at = now() + interval '1 microsecond' WHERE id = $1", [id]);
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([["late", "late", "oldest_runnable_seconds", 30]]);
    });
  });

  it("oldest_runnable_seconds looks through every priority (a lower priority's older job counts) and steps over jobs past their deadline, as _runnable_jobs() counts it", async () => {
    await inRollback(db.pool, async (c) => {
      const aged = async (priority: number, seconds: number, more: Record<string, unknown> = {}) => {
        const id = await makeJob(c, { task: "prio", queue: "prio", priority, ...more });
        await c.query("UPDATE idemq.jobs SET run_at = now() - make_interval(secs => $2) WHERE id = $1", [id, seconds]);
        return id;
      };
      await aged(5, 10);
      await aged(0, 100);
      await aged(0, 40);
      await aged(-3, 70);
      // Older, but past its deadline (rescue has not expired it yet): claim would not hand it out.
      const late = await aged(2, 500, { expires_at: sql("now() + interval '1 hour'") });
      await c.query("UPDATE idemq.jobs SET expires_at = now() WHERE id = $1", [late]);
      // Due later: scheduled, not runnable.
      await makeJob(c, { task: "prio", queue: "prio", priority: -9, run_at: sql("now() + interval '1 hour'") });
      // Another task in the queue, with one priority only.
      await makeJob(c, { task: "other", queue: "prio", priority: 1 });
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '7 seconds' WHERE task = 'other'");

      const oldest = await stats(c, ["oldest_runnable_seconds"]);
      expect(oldest).toEqual([
        ["prio", "other", "oldest_runnable_seconds", 7],
        ["prio", "prio", "oldest_runnable_seconds", 100],
      ]);
      const { rows } = await c.query<{ queue: string; task: string; oldest_seconds: string }>(
        "SELECT queue, task, oldest_seconds FROM idemq._runnable_jobs() ORDER BY 1, 2",
      );
      expect(rows.map((r) => [r.queue, r.task, "oldest_runnable_seconds", Number(r.oldest_seconds)])).toEqual(oldest);
    });
  });

  it("events per task, queue NULL: deduplicated, rejected, conflict (enqueue_many) and guard_duplicate", async () => {
    await inRollback(db.pool, async (c) => {
      // deduplicated: by enqueue twice, and by enqueue_many once.
      await makeJob(c, { task: "mail", queue: "q", idempotency_key: "d1" });
      await makeJob(c, { task: "mail", queue: "q", idempotency_key: "d1" });
      await makeJob(c, { task: "mail", queue: "q", idempotency_key: "d1" });
      await c.query(`SELECT * FROM idemq.enqueue_many('[{"task": "mail", "queue": "q", "idempotency_key": "d1"}]')`);
      // rejected (bulk): a failed key under reject_if_failed.
      await makeJob(c, { task: "charge", queue: "q2", idempotency_key: "r1", max_attempts: 1 });
      const [job] = await claim(c, { worker_id: "w", queues: ["q2"] });
      await c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => $3, error => '"no"')`, [job!.job_id, job!.attempt, job!.lease_token]);
      const many = await c.query(
        `SELECT outcome FROM idemq.enqueue_many('[{"task": "charge", "idempotency_key": "r1", "duplicate_policy": "reject_if_failed"},
                                                  {"task": "charge", "idempotency_key": "r1", "duplicate_policy": "reject_if_failed"}]')
          ORDER BY ordinal`,
      );
      expect(many.rows.map((r) => r.outcome)).toEqual(["rejected", "rejected"]);
      // conflict (bulk): the active key d1 with another payload.
      const conflict = await c.query(
        `SELECT outcome FROM idemq.enqueue_many('[{"task": "mail", "payload": {"other": true}, "idempotency_key": "d1"}]')`,
      );
      expect(conflict.rows.map((r) => r.outcome)).toEqual(["conflict"]);
      // guard duplicates.
      await c.query("SELECT idemq.guard(key => 'g1', task => 'credit')");
      await c.query("SELECT idemq.guard(key => 'g1', task => 'credit')");
      await c.query("SELECT idemq.guard(key => 'g1', task => 'credit')");

      expect(await stats(c, ["deduplicated", "rejected", "conflict", "guard_duplicate"])).toEqual([
        [null, "charge", "rejected", 2],
        [null, "credit", "guard_duplicate", 2],
        [null, "mail", "conflict", 1],
        [null, "mail", "deduplicated", 3],
      ]);
    });
  });

  it("an IQ409 or IQ422 raised by enqueue rolls back with the statement and is not counted", async () => {
    await inRollback(db.pool, async (c) => {
      await makeJob(c, { task: "charge", queue: "q", idempotency_key: "r2", max_attempts: 1 });
      const [job] = await claim(c, { worker_id: "w", queues: ["q"] });
      await c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => $3, error => '"no"')`, [job!.job_id, job!.attempt, job!.lease_token]);
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT * FROM idemq.enqueue(task => 'charge', idempotency_key => 'r2', duplicate_policy => 'reject_if_failed')", [])),
        { code: "IQ409" },
      );
      await makeJob(c, { task: "mail", queue: "q", idempotency_key: "c2" });
      await expectSqlError(
        underSavepoint(c, () => c.query(`SELECT * FROM idemq.enqueue(task => 'other', idempotency_key => 'c2')`, [])),
        { code: "IQ422" },
      );
      expect(await stats(c, ["deduplicated", "rejected", "conflict", "guard_duplicate"])).toEqual([]);
    });
  });
});
