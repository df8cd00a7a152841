// idemq.claim: which jobs it hands out, in which order, and what it records.
// Every case runs in a transaction that rolls back, so now() is one instant
// and times can be compared exactly.
import pg from "pg";
import { describe, expect, it } from "vitest";
import * as tsSql from "../../src/sql/index.ts";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { jobRow, makeJob, sql, unique } from "../helpers/jobs.ts";
import {
  claim,
  claimOne,
  expireLease,
  fail,
  makeDue,
  rescue,
  type ClaimArgs,
} from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

describe("claim", () => {
  it("orders by priority desc, then run_at, then id", async () => {
    await inRollback(db.pool, async (c) => {
      const low = await makeJob(c, { priority: 0, run_at: sql("now() - interval '1 hour'") });
      const highLater = await makeJob(c, { priority: 5, run_at: sql("now() - interval '1 minute'") });
      const highEarlierB = await makeJob(c, { priority: 5, run_at: sql("now() - interval '10 minutes'") });
      const highEarlierA = await makeJob(c, { priority: 5, run_at: sql("now() - interval '10 minutes'") });
      const top = await makeJob(c, { priority: 9, run_at: sql("now()") });
      const rows = await claim(c, { batch_size: 10 });
      // highEarlierB was enqueued first, so it has the lower id.
      expect(rows.map((r) => r.job_id)).toEqual([top, highEarlierB, highEarlierA, highLater, low]);
    });
  });

  it("respects batch_size, taking the first jobs in claim order", async () => {
    await inRollback(db.pool, async (c) => {
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) ids.push(await makeJob(c, { priority: 10 - i }));
      expect((await claim(c, { batch_size: 2 })).map((r) => r.job_id)).toEqual(ids.slice(0, 2));
      expect((await claim(c, { batch_size: 2 })).map((r) => r.job_id)).toEqual(ids.slice(2, 4));
      expect((await claim(c, { batch_size: 2 })).map((r) => r.job_id)).toEqual(ids.slice(4));
      expect(await claim(c, { batch_size: 2 })).toEqual([]);
    });
  });

  it("increments attempt and records locked_by and lease_expires_at = now() + lease", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { task: "send", payload: { n: 1 }, queue: "mail", max_attempts: 4, idempotency_key: "k-1" });
      const [job] = await claim(c, { worker_id: "host:42", lease: "45 seconds" });
      expect(job).toMatchObject({
        job_id: id,
        task: "send",
        queue: "mail",
        payload: { n: 1 },
        attempt: 1,
        max_attempts: 4,
        idempotency_key: "k-1",
        reclaimed: false,
      });
      const row = await jobRow(c, id);
      expect(row).toMatchObject({ state: "processing", attempt: 1, locked_by: "host:42", lease_in: 45 });
      expect(row.lease_expires_at).toEqual(job!.lease_expires_at);
    });
  });

  it("uses a 30-second lease by default", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      await claimOne(c);
      expect((await jobRow(c, id)).lease_in).toBe(30);
    });
  });

  it("takes only jobs from the queues asked for; NULL means every queue", async () => {
    await inRollback(db.pool, async (c) => {
      const a = await makeJob(c, { queue: "a" });
      const b = await makeJob(c, { queue: "b" });
      const other = await makeJob(c, { queue: "c" });
      expect(await claim(c, { queues: ["nowhere"], batch_size: 10 })).toEqual([]);
      const ab = await claim(c, { queues: ["b", "a"], batch_size: 10 });
      expect(ab.map((r) => r.job_id).sort()).toEqual([a, b].sort());
      expect((await claim(c, { queues: null, batch_size: 10 })).map((r) => r.job_id)).toEqual([other]);
    });
  });

  it("skips a scheduled retry whose run_at is in the future", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { backoff: { kind: "fixed", delays: ["1 minute"] } });
      const first = await claimOne(c);
      expect(await fail(c, id, first.attempt)).toBe("scheduled");
      expect(await claim(c, { batch_size: 10 })).toEqual([]);
      // One microsecond before due: still not claimable.
      await c.query("UPDATE idemq.jobs SET run_at = now() + interval '1 microsecond' WHERE id = $1", [id]);
      expect(await claim(c)).toEqual([]);
      await makeDue(c, id);
      expect((await claimOne(c)).attempt).toBe(2);
    });
  });

  it("claims a delayed job once its run_at has come, with no promoter in between", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { run_at: sql("now() + interval '1 hour'") });
      expect((await jobRow(c, id)).state).toBe("scheduled");
      expect(await claim(c)).toEqual([]);
      await makeDue(c, id); // run_at = now(): due exactly now
      expect((await jobRow(c, id)).state).toBe("scheduled");
      expect((await claimOne(c)).job_id).toBe(id);
    });
  });

  it("never hands out a job at or past its expires_at, and takes one just before it", async () => {
    await inRollback(db.pool, async (c) => {
      const past = await makeJob(c, { expires_at: sql("now() - interval '1 second'") });
      const atNow = await makeJob(c, { expires_at: sql("now() + interval '1 hour'") });
      await c.query("UPDATE idemq.jobs SET expires_at = now() WHERE id = $1", [atNow]);
      const justBefore = await makeJob(c, { expires_at: sql("now() + interval '1 microsecond'") });
      const rows = await claim(c, { batch_size: 10 });
      expect(rows.map((r) => r.job_id)).toEqual([justBefore]);
      expect((await jobRow(c, past)).state).toBe("enqueued");
      expect((await jobRow(c, atNow)).state).toBe("enqueued");
    });
  });

  it("never takes a processing job, even when its lease has run out", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const job = await claimOne(c, { worker_id: "crashed" });
      await expireLease(c, id, "1 hour");
      expect(await claim(c, { worker_id: "other", batch_size: 10 })).toEqual([]);
      const row = await jobRow(c, id);
      expect(row).toMatchObject({ state: "processing", attempt: job.attempt, locked_by: "crashed" });
    });
  });

  it("reports reclaimed = true only on the first claim after a rescue", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { backoff: { kind: "fixed", delays: ["1 second"] } });
      const first = await claimOne(c);
      expect(first.reclaimed).toBe(false);
      await expireLease(c, id);
      expect(await rescue(c)).toBe(1);
      const second = await claimOne(c);
      expect(second).toMatchObject({ job_id: id, attempt: 2, reclaimed: true });
      // attempt 2 fails normally: attempt 3 is an ordinary retry, not a reclaim.
      expect(await fail(c, id, 2)).toBe("scheduled");
      await makeDue(c, id);
      expect(await claimOne(c)).toMatchObject({ job_id: id, attempt: 3, reclaimed: false });
    });
  });

  it("commits a claim that hands out lease tokens asynchronously, to the end of its transaction only; a claim without tokens, or of nothing, stays synchronous", async () => {
    // The caller's own setting is what a claim must leave alone: set on this session here, as a server may
    // be started with it off (the embedded one for development is).
    const callers = "on";
    const queue = unique("async-claim");
    const c = await db.pool.connect();
    try {
      const setting = async () => (await c.query<{ s: string }>("SELECT current_setting('synchronous_commit') AS s")).rows[0]!.s;
      await c.query(`SET synchronous_commit = ${callers}`);
      await c.query("BEGIN");
      await makeJob(c, { queue });
      await makeJob(c, { queue });
      expect(await claim(c, { queues: [queue], token: false })).toHaveLength(1);
      expect(await setting()).toBe(callers);
      expect(await claim(c, { queues: [unique("empty")], token: true })).toEqual([]);
      expect(await setting()).toBe(callers);
      const [job] = await claim(c, { queues: [queue], token: true });
      expect(job!.lease_token).not.toBeNull();
      expect(await setting()).toBe("off");
      await c.query("COMMIT");
      // SET LOCAL: nothing stays on the connection (a pooled connection, through PgBouncer too).
      expect(await setting()).toBe(callers);
      expect((await jobRow(c, job!.job_id)).state).toBe("processing");
    } finally {
      await c.query("ROLLBACK").catch(() => {});
      await c.query("DELETE FROM idemq.jobs WHERE queue = $1", [queue]);
      await c.query("RESET synchronous_commit");
      c.release();
    }
  });

  it("takes neither awaiting nor finished jobs", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await makeJob(c, { priority: -1 });
      const child = await makeJob(c, { after: [parent], priority: 100 });
      expect((await jobRow(c, child)).state).toBe("awaiting");
      const [only] = await claim(c, { batch_size: 10 });
      expect(only!.job_id).toBe(parent);
      await c.query("SELECT idemq.complete($1, 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [parent]);
      expect((await jobRow(c, child)).state).toBe("enqueued");
      expect((await claim(c, { batch_size: 10 })).map((r) => r.job_id)).toEqual([child]);
    });
  });

  it("rejects bad arguments (worker_id, batch_size outside 1..1000, queues, lease) and claims nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c);
      const cases: Array<[ClaimArgs, string, RegExp]> = [
        [{ worker_id: sql("NULL") }, "22004", /worker_id/],
        [{ worker_id: "" }, "22023", /worker_id/],
        [{ batch_size: 0 }, "22023", /batch_size must be between 1 and 1000, not 0/],
        [{ batch_size: 1001 }, "22023", /batch_size must be between 1 and 1000, not 1001/],
        [{ batch_size: sql("NULL") }, "22004", /batch_size/],
        [{ queues: [] }, "22023", /queues/],
        [{ queues: ["a", ""] }, "22023", /queues/],
        [{ lease: "0 seconds" }, "22023", /lease/],
        [{ lease: "2 days" }, "22023", /lease/],
        [{ lease: sql("NULL") }, "22004", /lease/],
      ];
      for (const [args, code, message] of cases) {
        await underSavepoint(c, () => expectSqlError(claim(c, args), { code, message }));
      }
      expect(await claim(c, { batch_size: 1000 })).toHaveLength(1);
      expect((await jobRow(c, id)).attempt).toBe(1);
    });
  });
});

describe("claim() in TypeScript: the worker's row parsing", () => {
  it("returns each id as the exact digits of its bigint, even when the application made pg parse int8 as numbers", async () => {
    // pg's type parsers are global: a user's setTypeParser(20, ...) reaches
    // every query that does not bring its own, as claim() does.
    const int8 = pg.types.getTypeParser(20, "text");
    pg.types.setTypeParser(20, "text", Number);
    try {
      await inRollback(db.pool, async (c) => {
        await makeJob(c, { task: "int8", queue: "int8-ids" });
        await makeJob(c, { task: "int8", queue: "int8-ids" });
        const { rows } = await c.query<{ id: unknown; text: string }>(
          "SELECT id, id::text AS text FROM idemq.jobs WHERE queue = 'int8-ids' ORDER BY id",
        );
        expect(rows.map((r) => typeof r.id)).toEqual(["number", "number"]); // the application's parser is in force
        const jobs = await tsSql.claim(c, { workerId: "w", queues: ["int8-ids"], batchSize: 10 });
        expect(jobs.map((j) => j.id)).toEqual(rows.map((r) => r.text));
      });
    } finally {
      pg.types.setTypeParser(20, "text", int8);
    }
  });
});

describe("claim: the tasks filter", () => {
  it("claims only jobs of the tasks given, in claim order, and leaves the others untouched", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = "tasks-filter";
      for (const task of ["a", "b", "c", "a", "b"]) {
        await c.query("SELECT idemq.enqueue(task => $1, queue => $2)", [task, queue]);
      }
      const { rows } = await c.query(
        "SELECT task, attempt FROM idemq.claim('w', ARRAY[$1], 10, tasks => ARRAY['a', 'c'])",
        [queue],
      );
      expect(rows.map((r) => r.task)).toEqual(["a", "c", "a"]);
      const { rows: left } = await c.query(
        "SELECT task, state, attempt FROM idemq.jobs WHERE queue = $1 AND task = 'b' ORDER BY id",
        [queue],
      );
      expect(left).toEqual([
        { task: "b", state: "enqueued", attempt: 0 },
        { task: "b", state: "enqueued", attempt: 0 },
      ]);
      const { rows: any } = await c.query("SELECT task FROM idemq.claim('w', ARRAY[$1], 10)", [queue]);
      expect(any.map((r) => r.task)).toEqual(["b", "b"]);
    });
  });
});

// A claim's cost must not grow with the rows the table keeps: one UPDATE joined
// to the locking subquery once let the planner hash every row of idemq.jobs
// (a sequential scan per claim of a few hundred, seen in EXPLAIN).
describe("claim, heartbeat and complete_many read jobs by index, whatever the table holds", () => {
  it("with 4,000 finished rows and fresh statistics, claim(250) (unfiltered, by queue, by queue and task), heartbeat and complete_many of 250 jobs scan no table sequentially", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = "index-only";
      // Two tasks: the unfiltered and the queue's claim merge two keys, the claim of one task walks one.
      const seed = (n: number) =>
        c.query("SELECT count(*) FROM idemq.enqueue_many((SELECT jsonb_agg(jsonb_build_object('task', 't' || (g % 2), 'queue', $2::text, 'payload', jsonb_build_object('i', g))) FROM generate_series(1, $1::int) g))", [n, queue]);
      await seed(4000);
      for (let i = 0; i < 8; i++) {
        await c.query(
          "SELECT idemq.complete_many(array_agg(job_id), array_agg(attempt), array_agg(lease_token)) FROM idemq.claim('seed', ARRAY[$1], 500)",
          [queue],
        );
      }
      await seed(1500);
      await c.query("ANALYZE idemq.jobs");
      const seqScans = async () =>
        Number((await c.query("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'idemq.jobs'::regclass")).rows[0].seq_scan);
      const before = await seqScans();
      for (const [queues, tasks] of [[null, null], [[queue], null], [[queue], ["t0"]]]) {
        const { rows } = await c.query("SELECT job_id AS id, attempt, lease_token FROM idemq.claim('w', $1::text[], 250, tasks => $2::text[])", [queues, tasks]);
        expect(rows).toHaveLength(250);
        const pairs = [rows.map((r) => r.id), rows.map((r) => r.attempt), rows.map((r) => r.lease_token)];
        const beat = await c.query("SELECT * FROM idemq.heartbeat($1::bigint[], $2::int[], lease_tokens => $3::uuid[])", pairs);
        expect(beat.rows).toHaveLength(250);
        const done = await c.query("SELECT * FROM idemq.complete_many($1::bigint[], $2::int[], $3::uuid[])", pairs);
        expect(done.rows).toHaveLength(250);
      }
      expect(await seqScans()).toBe(before);
    });
  });
});
