// idemq.job_counts: the counts stats() and overview() read instead of counting
// idemq.jobs. The trigger function _count_jobs appends one row per (queue,
// task, state) a statement changed; _job_counts() sums them; apply_retention()
// folds them. Proved here: every kind of write keeps the sums equal to a
// count(*) of the table (deletes by purge and retention, retry, cancel,
// rescue, continuations, retention 0, direct SQL, TRUNCATE); writers on real
// connections committing concurrently never make them drift, and a reader's
// snapshot sees the counts and the jobs agree at every moment; folding keeps
// the sums and never waits for a writer or another folder; and a scrape reads
// the same job rows whatever the table holds.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { useTestDatabase, inRollback } from "../helpers/db.ts";
import { countRows, expectCountsExact, keptAndCounted } from "../helpers/job-counts.ts";
import { enqueue, enqueueMany, makeJob, makeJobs, sql, unique } from "../helpers/jobs.ts";
import { claim, claimJob, complete, expireLease, fail, heartbeat, rescue, snooze } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });

type C = pg.ClientBase;

describe("every kind of write keeps the counts equal to count(*)", () => {
  it("enqueue, enqueue_many, claim, complete, complete_many, fail, snooze, heartbeat, cancel, retry, reschedule", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      const now = await makeJob(c, { task: "a", queue });
      const later = await makeJob(c, { task: "a", queue, run_at: sql("now() + interval '1 hour'") });
      await enqueue(c, { task: "a", queue, idempotency_key: "k1" });
      expect((await enqueue(c, { task: "a", queue, idempotency_key: "k1" })).deduplicated).toBe(true);
      await makeJobs(c, 30, { task: "b", queue });
      await expectCountsExact(c, "after the enqueues");

      const claimed = await claim(c, { queues: [queue], tasks: ["b"], batch_size: 10 });
      expect(claimed).toHaveLength(10);
      await expectCountsExact(c, "after a claim of 10");
      await c.query("SELECT idemq.complete_many(job_ids => $1::bigint[], attempts => $2::int[])", [
        claimed.slice(0, 4).map((j) => j.job_id),
        claimed.slice(0, 4).map((j) => j.attempt),
      ]);
      await complete(c, claimed[4]!.job_id, claimed[4]!.attempt);
      expect(await fail(c, claimed[5]!.job_id, claimed[5]!.attempt)).toBe("scheduled");
      expect(await fail(c, claimed[6]!.job_id, claimed[6]!.attempt, undefined, { retryable: false })).toBe("failed");
      await snooze(c, claimed[7]!.job_id, claimed[7]!.attempt, sql("now() + interval '1 minute'"));
      const rowsBefore = await countRows(c);
      expect(await heartbeat(c, claimed.slice(8).map((j) => ({ id: j.job_id, attempt: j.attempt })))).toHaveLength(2);
      expect(await countRows(c), "a heartbeat changes no state and appends nothing").toBe(rowsBefore);
      await expectCountsExact(c, "after completions, failures, a snooze and a heartbeat");

      await c.query("SELECT idemq.cancel(job_id => $1)", [now]);
      await c.query("SELECT idemq.cancel(job_id => $1)", [claimed[8]!.job_id]);
      await c.query("SELECT idemq.retry(job_id => $1)", [claimed[6]!.job_id]);
      await c.query("SELECT idemq.retry(job_id => $1)", [now]);
      await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", [later]);
      await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now() + interval '1 day')", [claimed[5]!.job_id]);
      await expectCountsExact(c, "after cancel, retry and reschedule");
    });
  });

  it("rescue (leases and deadlines), continuations released and cancelled, retention 0, purge, apply_retention", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      const lost = await makeJob(c, { task: "r", queue });
      const lastTry = await makeJob(c, { task: "r", queue: unique("q"), max_attempts: 1 });
      await claimJob(c, lost);
      await claimJob(c, lastTry);
      await expireLease(c, lost);
      await expireLease(c, lastTry);
      await makeJob(c, { task: "r", queue, expires_at: sql("now() - interval '1 second'") });
      expect(await rescue(c)).toBe(3);
      await expectCountsExact(c, "after rescue (enqueued again, failed, expired)");

      const parent = await makeJob(c, { task: "p", queue: unique("q") });
      const doomed = await makeJob(c, { task: "p", queue: unique("q") });
      await makeJob(c, { task: "child", queue, after: [parent] });
      await makeJob(c, { task: "child", queue, after: [doomed] });
      await enqueueMany(c, [
        { task: "child", queue, after: [Number(doomed)] },
        { task: "child", queue, after: [Number(parent), Number(doomed)] },
      ]);
      await expectCountsExact(c, "with awaiting children");
      await complete(c, parent, await claimJob(c, parent));
      await c.query("SELECT idemq.cancel(job_id => $1)", [doomed]);
      await enqueueMany(c, [{ task: "child", queue, after: [Number(doomed)] }]); // created cancelled at once
      await expectCountsExact(c, "after children were released and cancelled");

      await c.query("SELECT idemq.set_retention(state => 'succeeded', keep => '0 seconds', task => 'zero')");
      const gone = await makeJob(c, { task: "zero", queue: unique("q") });
      await complete(c, gone, await claimJob(c, gone));
      const goneToo = await makeJob(c, { task: "zero", queue: unique("q") });
      const attempt = await claimJob(c, goneToo);
      await c.query("SELECT idemq.complete_many(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int])", [goneToo, attempt]);
      expect((await c.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE task = 'zero'")).rows[0].n).toBe(0);
      await expectCountsExact(c, "after completions that deleted their jobs (retention 0)");

      await c.query("UPDATE idemq.jobs SET finished_at = now() - interval '40 days' WHERE task = 'child' AND finished_at IS NOT NULL");
      expect((await c.query("SELECT idemq.apply_retention() AS n")).rows[0].n).toBeGreaterThan(0);
      await expectCountsExact(c, "after apply_retention deleted jobs");
      await c.query("UPDATE idemq.jobs SET finished_at = now() - interval '2 days' WHERE finished_at IS NOT NULL");
      expect((await c.query("SELECT idemq.purge(older_than => '1 day', batch_size => 2) AS n")).rows[0].n).toBe(2);
      expect((await c.query("SELECT idemq.purge(older_than => '1 day') AS n")).rows[0].n).toBeGreaterThan(0);
      await expectCountsExact(c, "after purge");
    });
  });

  it("an owner's direct SQL: INSERT, an UPDATE that moves jobs to another queue, DELETE, TRUNCATE", async () => {
    await inRollback(db.pool, async (c) => {
      await makeJobs(c, 5, { task: "d", queue: "direct" });
      await c.query(
        `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, max_attempts, finished_at)
         SELECT 'd', 'direct', '{}', 'succeeded', 0, now(), 1, now() FROM generate_series(1, 7)`,
      );
      await c.query("UPDATE idemq.jobs SET queue = 'moved' WHERE id IN (SELECT id FROM idemq.jobs WHERE queue = 'direct' ORDER BY id LIMIT 3)");
      await c.query("DELETE FROM idemq.jobs WHERE id IN (SELECT id FROM idemq.jobs WHERE state = 'succeeded' ORDER BY id LIMIT 2)");
      expect(await expectCountsExact(c, "after direct writes")).toEqual([
        ["direct", "d", "enqueued", 2],
        ["direct", "d", "succeeded", 5],
        ["moved", "d", "enqueued", 3],
      ]);
      // CASCADE: idemq.job_steps references the jobs (its rows go with them).
      await c.query("TRUNCATE idemq.jobs CASCADE");
      expect(await expectCountsExact(c, "after TRUNCATE")).toEqual([]);
      expect(await countRows(c)).toBe(0);
    });
  });
});

describe("the rows", () => {
  it("a statement appends one row per (queue, task, state) it changed, not one per job", async () => {
    await inRollback(db.pool, async (c) => {
      const before = await countRows(c);
      await enqueueMany(c, Array.from({ length: 1000 }, (_, i) => ({ task: "many", queue: i % 2 === 0 ? "even" : "odd" })));
      expect(await countRows(c)).toBe(before + 2);
      expect(await claim(c, { tasks: ["many"], queues: ["even"], batch_size: 100 })).toHaveLength(100);
      expect(await countRows(c), "enqueued -100 and processing +100").toBe(before + 4);
    });
  });

  it("apply_retention folds them into one row per (queue, task, state), every sum unchanged, zeros dropped", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      for (let i = 0; i < 5; i++) await makeJob(c, { task: "f", queue });
      for (const job of await claim(c, { queues: [queue], batch_size: 5 })) await complete(c, job.job_id, job.attempt);
      await makeJob(c, { task: "g", queue });
      const kept = await expectCountsExact(c);
      expect(await countRows(c)).toBeGreaterThan(kept.length);

      await c.query("SELECT idemq.apply_retention()");
      expect(await expectCountsExact(c, "after the fold")).toEqual(kept);
      // f's enqueued (5 in, 5 out) and processing (5 in, 5 out) summed to 0 and are gone.
      expect(await countRows(c)).toBe(kept.length);
      const { rows } = await c.query("SELECT queue, task, state::text, n::int FROM idemq.job_counts WHERE queue = $1 ORDER BY 2, 3", [queue]);
      expect(rows).toEqual([
        { queue, task: "f", state: "succeeded", n: 5 },
        { queue, task: "g", state: "enqueued", n: 1 },
      ]);
    });
  });

  it("a fold waits for no writer and no other fold: it takes the rows committed before it looked and leaves the others", async () => {
    const queue = unique("q");
    const writer = await db.newClient();
    const folder = await db.newClient();
    const other = await db.newClient();
    await makeJobs(db.pool, 3, { task: "w", queue });
    await writer.query("BEGIN");
    await makeJobs(writer, 4, { task: "w", queue }); // appended, not committed
    await folder.query("BEGIN");
    await folder.query("SELECT idemq.apply_retention()"); // holds the rows it folded
    // Neither the open writer nor the open fold makes this call wait (SKIP LOCKED; writers only append).
    await other.query("SELECT idemq.apply_retention()");
    await folder.query("COMMIT");
    await writer.query("COMMIT");
    await expectCountsExact(db.pool, "after the folds and the writer committed");
    await db.pool.query("SELECT idemq.apply_retention()");
    const { rows } = await db.pool.query("SELECT n::int FROM idemq.job_counts WHERE queue = $1", [queue]);
    expect(rows).toEqual([{ n: 7 }]);
  });
});

describe("concurrent writers on real connections", () => {
  it("six connections enqueue, claim, complete, fail, snooze, cancel, retry, rescue, purge and fold at once: the counts equal count(*) throughout and at the end", async () => {
    const QUEUES = ["cq1", "cq2", "cq3"];
    await db.pool.query("SELECT idemq.set_retention(state => 'succeeded', keep => '0 seconds', task => 'gone_on_success')");
    const writers = await Promise.all(Array.from({ length: 6 }, () => db.newClient()));
    const reader = await db.newClient();
    let running = true;
    let checks = 0;

    const work = async (c: C, w: number): Promise<void> => {
      for (let round = 0; round < 12; round++) {
        const jobs = Array.from({ length: 12 }, (_, i) => ({
          task: ["c_task", "other_task", "gone_on_success"][i % 3],
          queue: QUEUES[(i + w) % 3],
          ...(i % 4 === 0 ? { run_at: new Date(Date.now() + 3_600_000).toISOString() } : {}),
          ...(i === 5 ? { idempotency_key: `shared-${round}` } : {}),
        }));
        await enqueueMany(c, jobs);
        const single = await makeJob(c, { task: "c_task", queue: QUEUES[w % 3] });
        const claimed = await claim(c, { worker_id: `w${w}`, batch_size: 8 });
        const [done, failed, snoozed, ...rest] = [claimed.slice(0, 4), claimed[4], claimed[5], ...claimed.slice(6)];
        await c.query("SELECT idemq.complete_many(job_ids => $1::bigint[], attempts => $2::int[])", [done.map((j) => j.job_id), done.map((j) => j.attempt)]);
        if (failed) await fail(c, failed.job_id, failed.attempt, undefined, { retryable: round % 2 === 0 });
        if (snoozed) await snooze(c, snoozed.job_id, snoozed.attempt, sql("now()"));
        for (const job of rest) if (job) await complete(c, job.job_id, job.attempt);
        // Cancelled only while still enqueued (locked so: a claim skips it), so no claimer loses its lease.
        await c.query(
          "SELECT idemq.cancel(job_id => j.id) FROM (SELECT id FROM idemq.jobs WHERE id = $1 AND state = 'enqueued' FOR UPDATE SKIP LOCKED) j",
          [single],
        );
        await c.query(
          "SELECT idemq.retry(job_id => j.id) FROM (SELECT id FROM idemq.jobs WHERE state = 'failed' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) j",
        ).catch((error: { code?: string }) => {
          if (!["IQ412", "IQ409"].includes(error.code ?? "")) throw error;
        });
        if (round % 3 === w % 3) {
          await c.query("SELECT idemq.rescue()");
          await c.query("SELECT idemq.apply_retention()");
          await c.query("SELECT idemq.purge(older_than => '0 seconds', batch_size => 5)");
        }
      }
    };

    // The reader: one snapshot per check (REPEATABLE READ), the counts and count(*) compared in it.
    const read = async (): Promise<void> => {
      while (running) {
        await reader.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
        const { kept, counted } = await keptAndCounted(reader);
        await reader.query("COMMIT");
        expect(kept, `snapshot ${checks}`).toEqual(counted);
        checks++;
      }
    };

    const reading = read();
    try {
      await Promise.all(writers.map((c, w) => work(c, w)));
    } finally {
      running = false;
      await reading;
    }
    expect(checks, "the reader compared at least one snapshot while the writers ran").toBeGreaterThan(0);
    const kept = await expectCountsExact(db.pool, "once every writer finished");
    expect(kept.some(([, , state]) => state === "succeeded") && kept.some(([, , state]) => state === "enqueued")).toBe(true);
    // What stats() reports is these counts.
    const { rows } = await db.pool.query<{ queue: string; task: string; metric: string; value: string }>(
      "SELECT * FROM idemq.stats() WHERE queue IS NOT NULL AND metric NOT IN ('lease_expired', 'oldest_runnable_seconds')",
    );
    const byName = (a: unknown[], b: unknown[]) => JSON.stringify(a.slice(0, 3)).localeCompare(JSON.stringify(b.slice(0, 3)));
    expect(rows.map((r) => [r.queue, r.task, r.metric, Number(r.value)]).sort(byName)).toEqual([...kept].sort(byName));
  });
});

describe("what a scrape reads", () => {
  /** idemq.jobs rows read in this transaction so far (sequential and through indexes), and sequential scans. */
  async function jobReads(c: C): Promise<{ seqScans: number; tuples: number }> {
    const { rows } = await c.query<{ seq_scan: string; seq_tup_read: string; idx_tup_fetch: string }>(
      "SELECT seq_scan, seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = 'idemq.jobs'::regclass",
    );
    const r = rows[0]!;
    return { seqScans: Number(r.seq_scan), tuples: Number(r.seq_tup_read) + Number(r.idx_tup_fetch) };
  }

  /** The job rows one call of `query` reads (its plan cached by a call before). */
  async function readsOf(c: C, query: string): Promise<{ seqScans: number; tuples: number }> {
    await c.query(query);
    const before = await jobReads(c);
    await c.query(query);
    const after = await jobReads(c);
    return { seqScans: after.seqScans - before.seqScans, tuples: after.tuples - before.tuples };
  }

  /** `finished` more finished jobs (a day old: outside overview()'s window) and `waiting` more runnable ones, then ANALYZE. */
  async function grow(c: C, finished: number, waiting: number): Promise<void> {
    await c.query(
      `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, attempt, max_attempts, created_at, finished_at)
       SELECT 'scrape_' || (g % 5), 'scrape_q' || (g % 3), '{}', 'succeeded', 0, now() - interval '1 day', 1, 1,
              now() - interval '1 day', now() - interval '1 day'
       FROM generate_series(1, $1::int) g`,
      [finished],
    );
    await c.query(
      `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, max_attempts)
       SELECT 'scrape_' || (g % 5), 'scrape_q' || (g % 3), '{}', 'enqueued', g % 2, now() - interval '1 minute', 1
       FROM generate_series(1, $1::int) g`,
      [waiting],
    );
    await c.query("ANALYZE idemq.jobs");
  }

  it("stats() and overview() read as many job rows, and no sequential scan, with 21,000 finished and 21,000 waiting jobs as with 1,000 of each", async () => {
    await inRollback(db.pool, async (c) => {
      await grow(c, 1000, 1000);
      const small = { stats: await readsOf(c, "SELECT * FROM idemq.stats()"), overview: await readsOf(c, "SELECT * FROM idemq.overview()") };
      await grow(c, 20_000, 20_000);
      const large = { stats: await readsOf(c, "SELECT * FROM idemq.stats()"), overview: await readsOf(c, "SELECT * FROM idemq.overview()") };
      expect(large).toEqual(small);
      expect(small.stats.seqScans + small.overview.seqScans, "no sequential scan of idemq.jobs").toBe(0);
      // They do read some: the first runnable job of each (queue, task) and priority, and the loose scan's steps.
      expect(small.stats.tuples).toBeGreaterThan(0);
      // The counts are the table's all the same.
      await expectCountsExact(c);
    });
  });
});
