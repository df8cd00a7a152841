// Concurrency keys under concurrency, on real connections: a key's admissions
// serialise on its lock, so two sessions finishing and enqueueing one key at
// once never admit two at K = 1 and never leave the key with nothing
// admitted while a job waits (interleavings by pg_blocking_pids, no sleeps);
// and many connections looping claim + complete never run more than K of a key.
// complete_and_take_next's hand-off is that admission with another target
// state, under the same lock: the same interleavings hold for it.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { interleave, useTestDatabase } from "../helpers/db.ts";
import { count, makeJob, stateOf, states, unique } from "../helpers/jobs.ts";
import { claimJob } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 12 });

const admitted = (key: string): Promise<number> =>
  count(db.pool, "SELECT 1 FROM idemq.jobs WHERE concurrency_key = $1 AND state IN ('enqueued', 'scheduled', 'processing')", [key]);

const enqueueKeyed = async (c: pg.ClientBase, queue: string, key: string): Promise<string> =>
  (await c.query<{ job_id: string }>("SELECT job_id FROM idemq.enqueue('test_task', queue => $1, concurrency_key => $2)", [queue, key]))
    .rows[0]!.job_id;

const completeJob = (c: pg.ClientBase, id: string, attempt: number): Promise<unknown> =>
  c.query("SELECT idemq.complete($1, $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id, attempt]);

describe("a key's admissions under interleavings (K = 1)", () => {
  it("an enqueue waits for a completion holding the key's lock, then sees its promotion: one admitted, the new job waits", async () => {
    const queue = unique("i1");
    const key = unique("k");
    const holder = await makeJob(db.pool, { queue, concurrency_key: key });
    const waiting = await makeJob(db.pool, { queue, concurrency_key: key });
    const attempt = await claimJob(db.pool, holder);
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => completeJob(c, holder, attempt),
      second: b,
      blocks: (c) => enqueueKeyed(c, queue, key),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    const late = await run.second;
    expect(await states(db.pool, [holder, waiting, late])).toEqual({ [holder]: "succeeded", [waiting]: "enqueued", [late]: "awaiting" });
    expect(await admitted(key)).toBe(1);
  });

  it("a completion waits for an enqueue that counted its job as admitted, then admits that new job: never 0 admitted with work waiting", async () => {
    const queue = unique("i2");
    const key = unique("k");
    const holder = await makeJob(db.pool, { queue, concurrency_key: key });
    const attempt = await claimJob(db.pool, holder);
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      // The key is busy in a's snapshot: the new job waits.
      holds: (c) => enqueueKeyed(c, queue, key),
      second: b,
      // The completion's release needs the key's lock, which a holds until it commits.
      blocks: (c) => completeJob(c, holder, attempt),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    await run.second;
    expect(await stateOf(db.pool, run.held)).toBe("enqueued");
    expect(await admitted(key)).toBe(1);
  });

  const takeNext = (c: pg.ClientBase, id: string, attempt: number): Promise<pg.QueryResult> =>
    c.query(
      "SELECT * FROM idemq.complete_and_take_next(ARRAY[$1::bigint], ARRAY[$2::int], ARRAY[(SELECT lease_token FROM idemq.jobs WHERE id = $1)], 'w-next')",
      [id, attempt],
    );

  it("an enqueue waits for complete_and_take_next holding the key's lock, then sees the hand-off: one admitted (processing), the new job waits", async () => {
    const queue = unique("i1h");
    const key = unique("k");
    const holder = await makeJob(db.pool, { queue, concurrency_key: key });
    const waiting = await makeJob(db.pool, { queue, concurrency_key: key });
    const attempt = await claimJob(db.pool, holder);
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => takeNext(c, holder, attempt),
      second: b,
      blocks: (c) => enqueueKeyed(c, queue, key),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    expect(run.held.rows.filter((r) => r.completed === null).map((r) => r.job_id)).toEqual([waiting]);
    const late = await run.second;
    expect(await states(db.pool, [holder, waiting, late])).toEqual({ [holder]: "succeeded", [waiting]: "processing", [late]: "awaiting" });
    expect(await admitted(key)).toBe(1);
  });

  it("complete_and_take_next waits for an enqueue that counted the key busy, then hands over the job it left waiting: never two admitted, never none", async () => {
    const queue = unique("i2h");
    const key = unique("k");
    const holder = await makeJob(db.pool, { queue, concurrency_key: key });
    const attempt = await claimJob(db.pool, holder);
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => enqueueKeyed(c, queue, key),
      second: b,
      blocks: (c) => takeNext(c, holder, attempt),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    const out = await run.second;
    expect(out.rows.filter((r) => r.completed === null).map((r) => r.job_id)).toEqual([run.held]);
    expect(await stateOf(db.pool, run.held)).toBe("processing");
    expect(await admitted(key)).toBe(1);
  });

  it("two enqueues of one idle key: the second waits for the first's lock and then waits for the key", async () => {
    const queue = unique("i3");
    const key = unique("k");
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => enqueueKeyed(c, queue, key),
      second: b,
      blocks: (c) => enqueueKeyed(c, queue, key),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    const second = await run.second;
    expect(await states(db.pool, [run.held, second])).toEqual({ [run.held]: "enqueued", [second]: "awaiting" });
  });

  it("the same with the first enqueue rolled back: the second is admitted", async () => {
    const queue = unique("i4");
    const key = unique("k");
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => enqueueKeyed(c, queue, key),
      second: b,
      blocks: (c) => enqueueKeyed(c, queue, key),
      end: "ROLLBACK",
    });
    const second = await run.second;
    expect(await stateOf(db.pool, second)).toBe("enqueued");
    expect(await admitted(key)).toBe(1);
  });
});

describe("many connections", () => {
  it("8 sessions claiming and completing 20 keys x 15 jobs (K = 1, one key K = 3) never overlap more than K per key", { timeout: 120_000 }, async () => {
    const queue = unique("stress");
    const wide = `${queue}:wide`;
    await db.pool.query("SELECT idemq.set_limit(task => 'wide_task', per_key => 3)");
    await db.pool.query(
      `CREATE TABLE IF NOT EXISTS public.key_events (seq bigserial PRIMARY KEY, job_id bigint NOT NULL, key text NOT NULL, kind text NOT NULL)`,
    );
    const jobs: { task: string; queue: string; concurrency_key: string; priority: number }[] = [];
    for (let i = 0; i < 300; i++) {
      const key = i % 20 === 0 ? wide : `${queue}:${i % 20}`;
      jobs.push({ task: key === wide ? "wide_task" : "test_task", queue, concurrency_key: key, priority: i % 3 });
    }
    // Enqueued from 4 sessions at once, interleaved with the workers below.
    const producers = [0, 1, 2, 3].map(async (p) => {
      const c = await db.newClient();
      for (const job of jobs.filter((_, i) => i % 4 === p)) {
        await c.query("SELECT idemq.enqueue($1, queue => $2, concurrency_key => $3, priority => $4)", [
          job.task, job.queue, job.concurrency_key, job.priority,
        ]);
      }
    });
    let producing = true;
    const produced = Promise.all(producers).finally(() => {
      producing = false;
    });
    const workers = Array.from({ length: 8 }, async (_, w) => {
      const c = await db.newClient();
      for (;;) {
        await c.query("BEGIN");
        const { rows } = await c.query<{ job_id: string; attempt: number }>(
          "SELECT job_id::text, attempt FROM idemq.claim($1, ARRAY[$2], 3)",
          [`w${w}`, queue],
        );
        // The start, in the claim's transaction (the sequence orders it in real time).
        for (const r of rows) {
          await c.query("INSERT INTO public.key_events (job_id, key, kind) SELECT id, concurrency_key, 'start' FROM idemq.jobs WHERE id = $1", [r.job_id]);
        }
        await c.query("COMMIT");
        if (rows.length === 0) {
          if (!producing && (await count(c, "SELECT 1 FROM idemq.jobs WHERE queue = $1 AND state <> 'succeeded'", [queue])) === 0) return;
          continue;
        }
        for (const r of rows) {
          await c.query("BEGIN");
          // The end, in the completion's transaction, before the commit that frees the place.
          await c.query("INSERT INTO public.key_events (job_id, key, kind) SELECT id, concurrency_key, 'end' FROM idemq.jobs WHERE id = $1", [r.job_id]);
          await completeJob(c, r.job_id, r.attempt);
          await c.query("COMMIT");
        }
      }
    });
    await Promise.all([produced, ...workers]);
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE queue = $1 AND state = 'succeeded'", [queue])).toBe(300);
    // The most jobs of one key between a start and an end, replayed in sequence order.
    const { rows } = await db.pool.query<{ key: string; most: number }>(
      `SELECT key, max(running)::int AS most FROM (
         SELECT key, sum(CASE kind WHEN 'start' THEN 1 ELSE -1 END) OVER (PARTITION BY key ORDER BY seq) AS running
         FROM public.key_events WHERE key LIKE $1) r
       GROUP BY key`,
      [`${queue}:%`],
    );
    expect(rows).toHaveLength(20);
    for (const r of rows) expect(r.most, r.key).toBeLessThanOrEqual(r.key === wide ? 3 : 1);
    // The sessions did run jobs side by side (of different keys), so the check above could have failed.
    const overall = await db.pool.query<{ most: number }>(
      `SELECT max(running)::int AS most FROM (
         SELECT sum(CASE kind WHEN 'start' THEN 1 ELSE -1 END) OVER (ORDER BY seq) AS running
         FROM public.key_events WHERE key LIKE $1) r`,
      [`${queue}:%`],
    );
    expect(overall.rows[0]!.most).toBeGreaterThan(1);
    expect(await count(db.pool, "SELECT 1 FROM public.key_events WHERE key LIKE $1 AND kind = 'start'", [`${queue}:%`])).toBe(300);
  });
});
