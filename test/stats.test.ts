// idemq.stats(): counts per (queue, task, state), expired leases, the age of
// the oldest runnable job, and the events counted per task (deduplicated,
// rejected, conflict, guard_duplicate). Each test builds its jobs in a
// transaction that rolls back, so every count is exact.
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase, inRollback, type TestDatabase } from "./helpers/db.ts";
import { expectErrorInTx } from "./helpers/savepoint.ts";

let db: TestDatabase;
beforeAll(async () => {
  db = await freshDatabase({ poolSize: 4 });
});
afterAll(async () => {
  await db?.drop();
});

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

async function enq(c: C, task: string, queue: string, extra = ""): Promise<string> {
  const { rows } = await c.query<{ job_id: string }>(
    `SELECT job_id FROM idemq.enqueue(task => $1, queue => $2${extra})`,
    [task, queue],
  );
  return rows[0]!.job_id;
}

async function claim(c: C, queue: string, n = 1): Promise<Array<{ id: string; attempt: number }>> {
  const { rows } = await c.query("SELECT id, attempt FROM idemq.claim(worker_id => 'w', queues => ARRAY[$1::text], batch_size => $2)", [
    queue,
    n,
  ]);
  return rows;
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
      for (let i = 0; i < 3; i++) await enq(c, "mail", "q1");
      await enq(c, "sms", "q1");
      await enq(c, "mail", "q2", ", run_at => now() + interval '1 hour'");
      await enq(c, "mail", "q2", ", run_at => now() + interval '1 hour'");
      const parent = await enq(c, "sms", "q3");
      await enq(c, "sms", "q2", `, after => ARRAY[${parent}::bigint]`);
      await claim(c, "q1", 1); // the first mail job (lowest id)

      // Terminal states in their own queue.
      const [ok] = await claim(c, "q3"); // the parent: succeeded, so its child leaves awaiting
      await c.query("SELECT idemq.complete(job_id => $1, attempt => $2)", [ok!.id, ok!.attempt]);
      await enq(c, "t", "q4", ", max_attempts => 1");
      const [bad] = await claim(c, "q4");
      await c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, error => '"x"')`, [bad!.id, bad!.attempt]);
      const gone = await enq(c, "t", "q4");
      await c.query("SELECT idemq.cancel(job_id => $1)", [gone]);
      await enq(c, "t", "q4", ", expires_at => now() - interval '1 second'");
      await c.query("SELECT idemq.rescue()");
      await enq(c, "waits", "q5", `, after => ARRAY[${gone}::bigint, ${parent}::bigint]`); // cancelled parent -> cancelled
      const p2 = await enq(c, "t", "q6", ", run_at => now() + interval '1 day'");
      await enq(c, "waits", "q5", `, after => ARRAY[${p2}::bigint]`);

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
      await enq(c, "b", "q2");
      await enq(c, "a", "q1");
      await enq(c, "a", "q1", ", idempotency_key => 'k'");
      await enq(c, "a", "q1", ", idempotency_key => 'k'");
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
      for (let i = 0; i < 3; i++) await enq(c, "job", "leases");
      const held = await claim(c, "leases", 3);
      await c.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 microsecond' WHERE id = $1", [held[0]!.id]);
      await c.query("UPDATE idemq.jobs SET lease_expires_at = now() WHERE id = $1", [held[1]!.id]);
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
      const old = await enq(c, "job", "age");
      const older = await enq(c, "job", "age");
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '99.9 seconds' WHERE id = $1", [old]);
      // A scheduled job whose run_at passed is runnable, so it counts.
      const due = await enq(c, "job", "age", ", run_at => now() + interval '1 hour'");
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '42 seconds' WHERE id = $1", [due]);
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '10 seconds' WHERE id = $1", [older]);
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([["age", "job", "oldest_runnable_seconds", 99]]);

      // Future (scheduled) jobs and processing jobs do not count.
      await enq(c, "later", "age", ", run_at => now() + interval '1 microsecond'");
      const running = await enq(c, "running", "age2");
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '1 hour' WHERE id = $1", [running]);
      await claim(c, "age2");
      // Awaiting jobs are not runnable either.
      const parent = await enq(c, "parent", "age3", ", run_at => now() + interval '1 day'");
      await enq(c, "child", "age3", `, after => ARRAY[${parent}::bigint]`);
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '1 hour' WHERE task = 'child'");
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([["age", "job", "oldest_runnable_seconds", 99]]);
    });
  });

  it("oldest_runnable_seconds boundary: run_at = now() gives 0; run_at one microsecond later gives no row", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await enq(c, "edge", "edge");
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([["edge", "edge", "oldest_runnable_seconds", 0]]);
      await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now() + interval '1 microsecond')", [id]);
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([]);
    });
  });

  it("oldest_runnable_seconds leaves out a job past its expires_at (claim never hands it out): expires_at = now() excluded, now() + 1 µs counted", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await enq(c, "late", "late", ", expires_at => now() + interval '1 hour'");
      await c.query("UPDATE idemq.jobs SET run_at = now() - interval '30 seconds', expires_at = now() WHERE id = $1", [id]);
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([]);
      expect((await c.query("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY['late'])")).rows).toEqual([]);
      await c.query("UPDATE idemq.jobs SET expires_at = now() + interval '1 microsecond' WHERE id = $1", [id]);
      expect(await stats(c, ["oldest_runnable_seconds"])).toEqual([["late", "late", "oldest_runnable_seconds", 30]]);
    });
  });

  it("events per task, queue NULL: deduplicated, rejected, conflict (enqueue_many) and guard_duplicate", async () => {
    await inRollback(db.pool, async (c) => {
      // deduplicated: by enqueue twice, and by enqueue_many once.
      await enq(c, "mail", "q", ", idempotency_key => 'd1'");
      await enq(c, "mail", "q", ", idempotency_key => 'd1'");
      await enq(c, "mail", "q", ", idempotency_key => 'd1'");
      await c.query(`SELECT * FROM idemq.enqueue_many('[{"task": "mail", "queue": "q", "idempotency_key": "d1"}]')`);
      // rejected (bulk): a failed key under reject_if_failed.
      await enq(c, "charge", "q2", ", idempotency_key => 'r1', max_attempts => 1");
      const [job] = await claim(c, "q2");
      await c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, error => '"no"')`, [job!.id, job!.attempt]);
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
      await enq(c, "charge", "q", ", idempotency_key => 'r2', max_attempts => 1");
      const [job] = await claim(c, "q");
      await c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, error => '"no"')`, [job!.id, job!.attempt]);
      await expectErrorInTx(
        c,
        "SELECT * FROM idemq.enqueue(task => 'charge', idempotency_key => 'r2', duplicate_policy => 'reject_if_failed')",
        [],
        { code: "IQ409" },
      );
      await enq(c, "mail", "q", ", idempotency_key => 'c2'");
      await expectErrorInTx(c, `SELECT * FROM idemq.enqueue(task => 'other', idempotency_key => 'c2')`, [], { code: "IQ422" });
      expect(await stats(c, ["deduplicated", "rejected", "conflict", "guard_duplicate"])).toEqual([]);
    });
  });
});
