// idemq.claim filtered by queues or tasks, and unfiltered (every (task, queue)
// pair present is a key): jobs_runnable_by_task_queue walked one (task, queue)
// key at a time (claim.sql). The order across keys is the global claim order,
// jobs another transaction holds are skipped without shortening the batch, and
// a backlog elsewhere is never read.
import { describe, expect, it } from "vitest";
import { useTestDatabase, inRollback } from "../helpers/db.ts";
import { makeJob, sql, unique, type Queryable } from "../helpers/jobs.ts";
import { claim } from "../helpers/work.ts";

const db = useTestDatabase();

interface Spec {
  task: string;
  queue: string;
  priority: number;
  ago: number; // run_at = now() - ago minutes
}

/** Jobs of several tasks and queues, priorities and run_at interleaved across keys; ids in creation order. */
async function mixedJobs(c: Queryable, prefix: string): Promise<Map<string, Spec>> {
  const specs: Spec[] = [];
  const tasks = [`${prefix}-t1`, `${prefix}-t2`];
  const queues = [`${prefix}-q1`, `${prefix}-q2`, `${prefix}-q3`];
  let n = 0;
  for (const priority of [0, 5, 5, 9, 0, 5]) {
    for (const queue of queues) {
      for (const task of tasks) {
        specs.push({ task, queue, priority, ago: (n * 7) % 11 });
        n++;
      }
    }
  }
  const jobs = new Map<string, Spec>();
  for (const s of specs) {
    const id = await makeJob(c, { task: s.task, queue: s.queue, priority: s.priority, run_at: sql(`now() - interval '${s.ago} minutes'`) });
    jobs.set(id, s);
  }
  return jobs;
}

/** The ids of the jobs passing `keep`, in claim order: priority desc, run_at (ago desc), id. */
function claimOrder(jobs: Map<string, Spec>, keep: (s: Spec) => boolean): string[] {
  return [...jobs]
    .filter(([, s]) => keep(s))
    .sort(([a, x], [b, y]) => y.priority - x.priority || y.ago - x.ago || Number(BigInt(a) - BigInt(b)))
    .map(([id]) => id);
}

describe("claim with queues or tasks: the global claim order across keys", () => {
  it("a list of queues, a list of tasks, and both: batches come in priority desc, run_at, id order over all the keys listed", async () => {
    await inRollback(db.pool, async (c) => {
      const p = unique("order");
      const jobs = await mixedJobs(c, p);
      const cases = [
        { queues: [`${p}-q3`, `${p}-q1`], tasks: null, keep: (s: Spec) => s.queue !== `${p}-q2` },
        { queues: null, tasks: [`${p}-t2`], keep: (s: Spec) => s.task === `${p}-t2` },
        { queues: [`${p}-q2`, `${p}-q1`], tasks: [`${p}-t2`, `${p}-t1`], keep: (s: Spec) => s.queue !== `${p}-q3` },
        { queues: [`${p}-q2`], tasks: [`${p}-t1`], keep: (s: Spec) => s.queue === `${p}-q2` && s.task === `${p}-t1` },
      ];
      for (const { queues, tasks, keep } of cases) {
        await c.query("SAVEPOINT each_case");
        const expected = claimOrder(jobs, keep);
        expect(expected.length).toBeGreaterThan(4);
        const got: string[] = [];
        for (;;) {
          const rows = await claim(c, { queues, tasks, batch_size: 4 });
          if (rows.length === 0) break;
          got.push(...rows.map((r) => r.job_id));
        }
        expect(got, JSON.stringify({ queues, tasks })).toEqual(expected);
        await c.query("ROLLBACK TO SAVEPOINT each_case");
      }
    });
  });

  it("the same job set claimed unfiltered and by the list of all its queues comes in the same order", async () => {
    await inRollback(db.pool, async (c) => {
      const p = unique("same");
      const jobs = await mixedJobs(c, p);
      await c.query("DELETE FROM idemq.jobs WHERE NOT (queue LIKE $1)", [`${p}-%`]);
      await c.query("SAVEPOINT before");
      const all = (await claim(c, { batch_size: 1000 })).map((r) => r.job_id);
      await c.query("ROLLBACK TO SAVEPOINT before");
      const listed = (await claim(c, { queues: [`${p}-q1`, `${p}-q2`, `${p}-q3`], batch_size: 1000 })).map((r) => r.job_id);
      expect(all).toEqual(claimOrder(jobs, () => true));
      expect(listed).toEqual(all);
    });
  });
});

describe("claim with several keys skips jobs another transaction holds", () => {
  it("fills the batch past the held jobs, in claim order, and the held ones stay untouched", async () => {
    const p = unique("held");
    const ids: string[] = [];
    // Committed: the holder is another session. Priorities make the claim
    // order alternate between the two queues.
    for (let i = 0; i < 8; i++) {
      ids.push(await makeJob(db.pool, { queue: `${p}-q${i % 2}`, priority: 100 - i }));
    }
    const holder = await db.newClient();
    try {
      await holder.query("BEGIN");
      // The first three in claim order, across both queues.
      await holder.query("SELECT id FROM idemq.jobs WHERE id = ANY ($1::bigint[]) FOR UPDATE", [ids.slice(0, 3)]);
      const rows = await claim(db.pool, { queues: [`${p}-q1`, `${p}-q0`], batch_size: 4 });
      expect(rows.map((r) => r.job_id)).toEqual(ids.slice(3, 7));
      await holder.query("ROLLBACK");
      const { rows: states } = await db.pool.query<{ id: string; state: string }>(
        "SELECT id::text, state::text FROM idemq.jobs WHERE id = ANY ($1::bigint[]) ORDER BY id",
        [ids],
      );
      expect(states.map((s) => s.state)).toEqual(["enqueued", "enqueued", "enqueued", "processing", "processing", "processing", "processing", "enqueued"]);
      const rest = await claim(db.pool, { queues: [`${p}-q0`, `${p}-q1`], batch_size: 10 });
      expect(rest.map((r) => r.job_id)).toEqual([...ids.slice(0, 3), ids[7]]);
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
    }
  });

  it("held jobs at the merge's frontiers (one pair ahead of the others, read over several rounds) are skipped, and each claim is the first unheld jobs in claim order", async () => {
    const p = unique("frontier");
    const jobs = new Map<string, Spec>();
    // Committed: the holder is another session. Task t0 holds most of the
    // first jobs in claim order, so the merge cuts it at its first block and
    // reads it again (the frontier is its last job read) while the other
    // nine pairs wait in the pool.
    const specs: Spec[] = [];
    for (let i = 0; i < 30; i++) specs.push({ task: `${p}-t0`, queue: `${p}-q`, priority: 9, ago: 60 - i });
    for (let t = 1; t < 10; t++) {
      for (const [priority, ago] of [[9, 30 - t * 3], [5, 40 + t], [0, t], [9, 2 * t]] as const) {
        specs.push({ task: `${p}-t${t}`, queue: `${p}-q`, priority, ago });
      }
    }
    for (const s of specs) {
      jobs.set(await makeJob(db.pool, { task: s.task, queue: s.queue, priority: s.priority, run_at: sql(`now() - interval '${s.ago} minutes'`) }), s);
    }
    const order = claimOrder(jobs, () => true);
    const tasks = Array.from({ length: 10 }, (_, t) => `${p}-t${t}`);
    // Every third job among the first 45, so held jobs sit at the first
    // block's end, at the frontiers and bounds of the later rounds.
    const held = order.filter((_, i) => i < 45 && i % 3 === 0);
    const holder = await db.newClient();
    try {
      await holder.query("BEGIN");
      await holder.query("SELECT id FROM idemq.jobs WHERE id = ANY ($1::bigint[]) FOR UPDATE", [held]);
      const free = order.filter((id) => !held.includes(id));
      expect((await claim(db.pool, { tasks, batch_size: 20 })).map((r) => r.job_id)).toEqual(free.slice(0, 20));
      const got: string[] = [];
      for (;;) {
        const rows = await claim(db.pool, { tasks, batch_size: 7 });
        if (rows.length === 0) break;
        got.push(...rows.map((r) => r.job_id));
      }
      expect(got).toEqual(free.slice(20));
      await holder.query("ROLLBACK");
      expect((await claim(db.pool, { tasks, batch_size: 1000 })).map((r) => r.job_id)).toEqual(held);
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      await db.pool.query("DELETE FROM idemq.jobs WHERE id = ANY ($1::bigint[])", [[...jobs.keys()]]);
    }
  });
});

// The index is keyed by 64-bit hashes of the names (_name_key), which two
// names can share. Every walk compares the names too, so a collision never
// hands out another task's or queue's job. Shown with the worst collision
// there can be: _name_key replaced, in this transaction only, by a constant,
// and the index rebuilt on it.
describe("names that share a key (_name_key) never mix their jobs", () => {
  it("with every name on one key, each claim takes only jobs of the tasks and queues it names; a claim naming both takes all of them", async () => {
    await inRollback(db.pool, async (c) => {
      const p = unique("collide");
      await c.query("DELETE FROM idemq.jobs");
      await c.query("CREATE OR REPLACE FUNCTION idemq._name_key(name text) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 0");
      await c.query("REINDEX INDEX idemq.jobs_runnable_by_task_queue");
      const pair = new Map<string, string>();
      for (const task of [`${p}-a`, `${p}-b`]) {
        for (const queue of [`${p}-x`, `${p}-y`]) {
          for (const priority of [3, 1, 2]) pair.set(await makeJob(c, { task, queue, priority }), `${task}/${queue}`);
        }
      }
      const cases = [
        { args: { tasks: [`${p}-a`], queues: [`${p}-x`] }, allowed: [`${p}-a/${p}-x`], all: true },
        { args: { tasks: [`${p}-b`], queues: [`${p}-x`, `${p}-y`] }, allowed: [`${p}-b/${p}-x`, `${p}-b/${p}-y`], all: true },
        { args: { tasks: [`${p}-a`], queues: null }, allowed: [`${p}-a/${p}-x`, `${p}-a/${p}-y`], all: false },
        { args: { tasks: null, queues: [`${p}-y`] }, allowed: [`${p}-a/${p}-y`, `${p}-b/${p}-y`], all: false },
        { args: { tasks: null, queues: null }, allowed: [...new Set(pair.values())], all: false },
      ];
      for (const { args, allowed, all } of cases) {
        await c.query("SAVEPOINT each_claim");
        const got = (await claim(c, { ...args, batch_size: 100 })).map((r) => r.job_id);
        const label = JSON.stringify(args);
        expect(got.length, label).toBeGreaterThan(0);
        expect(new Set(got).size, label).toBe(got.length);
        for (const id of got) expect(allowed, `${label}: job ${id} of ${pair.get(id)}`).toContain(pair.get(id));
        if (all) expect(got.length, label).toBe([...pair.values()].filter((v) => allowed.includes(v)).length);
        await c.query("ROLLBACK TO SAVEPOINT each_claim");
      }
    });
  });
});

// The issue: an empty queue's claim took 54 ms with 200,000 runnable jobs in
// another queue, reading every one of them (the index it walked, jobs_runnable, since dropped, had no queue).
// Rows fetched by index scans in this transaction (pg_stat_xact_user_tables)
// count what a claim read, whatever the machine's speed.
describe("a filtered claim reads no job of a backlog outside its keys", () => {
  it("with 20,000 runnable jobs in another queue and of another task, and statistics that saw only them", async () => {
    await inRollback(db.pool, async (c) => {
      const busy = unique("busy");
      await c.query(
        "SELECT count(*) FROM idemq.enqueue_many((SELECT jsonb_agg(jsonb_build_object('task', 'busy-task', 'queue', $1::text)) FROM generate_series(1, 20000)))",
        [busy],
      );
      await c.query("ANALYZE idemq.jobs");
      const fetched = async () =>
        Number((await c.query("SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = 'idemq.jobs'::regclass")).rows[0].idx_tup_fetch);
      const idle = unique("idle");
      const calls = [
        { queues: [idle], tasks: null },
        { queues: [idle, unique("idle")], tasks: null },
        { queues: [idle], tasks: ["busy-task"] },
        { queues: null, tasks: ["idle-task"] },
        { queues: null, tasks: ["idle-task", "other-task"] },
      ];
      for (const args of calls) {
        // Repeated: PL/pgSQL switches plans after the fifth call.
        for (let i = 0; i < 7; i++) {
          const before = await fetched();
          expect(await claim(c, { ...args, batch_size: 10 })).toEqual([]);
          // At most one job per distinct task or queue, read by the loose index scan.
          expect(await fetched() - before, JSON.stringify(args)).toBeLessThanOrEqual(2);
        }
      }
      // The backlog's own claim still works through the same path.
      expect(await claim(c, { queues: [busy], tasks: ["busy-task"], batch_size: 10 })).toHaveLength(10);
    });
  });
});

// Unfiltered, every (task, queue) pair with runnable jobs is a key: the pairs
// are read by a loose index scan of jobs_runnable_by_task_queue, then walked
// as a filtered claim walks its keys (claim.sql).
describe("claim with neither queues nor tasks: the keys are every (task, queue) pair present", () => {
  it("batches come in priority desc, run_at, id order across tasks and queues; pairs with no due job, running or finished jobs only add nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const p = unique("all");
      await c.query("DELETE FROM idemq.jobs");
      const jobs = await mixedJobs(c, p);
      // A pair whose only job is not due yet, one whose only job is running,
      // and one whose only job succeeded: none is handed out.
      await makeJob(c, { task: `${p}-later`, queue: `${p}-q1`, priority: 100, run_at: sql("now() + interval '1 hour'") });
      const running = await makeJob(c, { task: `${p}-running`, queue: `${p}-q9`, priority: 100 });
      const done = await makeJob(c, { task: `${p}-done`, queue: `${p}-q9`, priority: 100 });
      await c.query("SELECT count(*) FROM idemq.claim('other', ARRAY[$1], 10, tasks => ARRAY[$2, $3])", [`${p}-q9`, `${p}-running`, `${p}-done`]);
      await c.query("SELECT idemq.complete($1, 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [done]);
      const expected = claimOrder(jobs, () => true);
      expect(expected).toHaveLength(36);
      for (const batchSize of [1, 4, 7]) {
        await c.query("SAVEPOINT each_size");
        const got: string[] = [];
        for (;;) {
          const rows = await claim(c, { batch_size: batchSize });
          if (rows.length === 0) break;
          expect(rows.length).toBeLessThanOrEqual(batchSize);
          got.push(...rows.map((r) => r.job_id));
        }
        expect(got, `batch_size ${batchSize}`).toEqual(expected);
        expect(got).not.toContain(running);
        await c.query("ROLLBACK TO SAVEPOINT each_size");
      }
    });
  });

  it("skips jobs another transaction holds, across pairs, and fills the batch past them", async () => {
    const p = unique("allheld");
    const ids: string[] = [];
    // Committed: the holder is another session. Priorities above every other
    // job of this database make these the first in claim order, alternating
    // over four (task, queue) pairs.
    for (let i = 0; i < 8; i++) {
      ids.push(await makeJob(db.pool, { task: `${p}-t${i % 2}`, queue: `${p}-q${Math.floor(i / 2) % 2}`, priority: 1_000_000 - i }));
    }
    const holder = await db.newClient();
    try {
      await holder.query("BEGIN");
      await holder.query("SELECT id FROM idemq.jobs WHERE id = ANY ($1::bigint[]) FOR UPDATE", [[ids[0], ids[2], ids[3]]]);
      const rows = await claim(db.pool, { batch_size: 4 });
      expect(rows.map((r) => r.job_id)).toEqual([ids[1], ids[4], ids[5], ids[6]]);
      await holder.query("ROLLBACK");
      const rest = await claim(db.pool, { batch_size: 4 });
      expect(rest.map((r) => r.job_id)).toEqual([ids[0], ids[2], ids[3], ids[7]]);
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      await db.pool.query("DELETE FROM idemq.jobs WHERE id = ANY ($1::bigint[])", [ids]);
    }
  });

  it("with no runnable job (an empty table, then only running and finished jobs) claims nothing and reads no job", async () => {
    await inRollback(db.pool, async (c) => {
      const fetched = async () =>
        Number((await c.query("SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = 'idemq.jobs'::regclass")).rows[0].idx_tup_fetch);
      await c.query("DELETE FROM idemq.jobs");
      for (let i = 0; i < 7; i++) expect(await claim(c, { batch_size: 10 })).toEqual([]);
      const p = unique("none");
      const [running, done] = [await makeJob(c, { queue: p }), await makeJob(c, { queue: p })];
      await claim(c, { queues: [p], batch_size: 2 });
      await c.query("SELECT idemq.complete($1, 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [done]);
      // Repeated: PL/pgSQL switches plans after the fifth call.
      for (let i = 0; i < 7; i++) {
        const before = await fetched();
        expect(await claim(c, { batch_size: 10 })).toEqual([]);
        // The pair scan meets the index entries those jobs left (not yet
        // vacuumed), but no row it reads through them is runnable.
        expect(await fetched() - before).toBe(0);
      }
      expect((await c.query("SELECT state::text FROM idemq.jobs WHERE id = ANY ($1::bigint[]) ORDER BY id", [[running, done]])).rows.map((r) => r.state)).toEqual(["processing", "succeeded"]);
    });
  });

  it("reads the first blocks (2 x batch_size in all, plus one per pair) and one per pair for the pair scan: not batch_size per pair, nor the pairs' backlogs", async () => {
    await inRollback(db.pool, async (c) => {
      await c.query("DELETE FROM idemq.jobs");
      // 10 pairs of 500 runnable jobs each.
      await c.query(
        "SELECT count(*) FROM idemq.enqueue_many((SELECT jsonb_agg(jsonb_build_object('task', 't' || (g % 5), 'queue', 'q' || (g % 2), 'priority', g % 3)) FROM generate_series(1, 5000) g))",
      );
      await c.query("ANALYZE idemq.jobs");
      const fetched = async () =>
        Number((await c.query("SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = 'idemq.jobs'::regclass")).rows[0].idx_tup_fetch);
      const pairs = 10;
      const batchSize = 5;
      for (let i = 0; i < 7; i++) {
        const before = await fetched();
        expect(await claim(c, { batch_size: batchSize })).toHaveLength(batchSize);
        // The merge's first blocks (ceil(2 x batch_size / pairs) jobs of each
        // pair: at most pairs + 2 x batch_size; the later rounds read nothing
        // here, each pair's next job lying past the bound), the pair scan (one
        // per pair), the lock and the update (batch_size each); the jobs
        // claimed by the previous rounds are not live rows any more and do
        // not count. The merge that read batch_size jobs of every pair read
        // 70 here (pairs x batch_size + pairs + 2 x batch_size).
        expect(await fetched() - before).toBeLessThanOrEqual(pairs + 2 * batchSize + pairs + 2 * batchSize);
      }
    });
  });
});
