// Flow control under concurrency, on real connections: a concurrency limit
// is never over-admitted, whatever the interleaving (pg_blocking_pids, never
// a sleep), and under 8 claimers looping claim + complete.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { backendPid, useTestDatabase, waitUntilBlocked } from "../helpers/db.ts";
import { makeJobs, unique } from "../helpers/jobs.ts";
import { claim, complete } from "../helpers/work.ts";

const db = useTestDatabase();

const processing = async (queue: string): Promise<number> =>
  (await db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state = 'processing'", [queue])).rows[0].n;

describe("concurrency limit under interleavings", () => {
  it("a claim beside an open claim transaction holding the last slot takes nothing, before and after that commit", async () => {
    const queue = unique("last-slot");
    await makeJobs(db.pool, 5, { queue });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 1)", [queue]);
    const [b, c] = await Promise.all([db.newClient(), db.newClient()]);
    await b.query("BEGIN");
    const held = await claim(b, { queues: [queue], worker_id: "b" });
    expect(held).toHaveLength(1);
    // The slot is locked by b, uncommitted: c skips it and its job and returns at once.
    expect(await claim(c, { queues: [queue], batch_size: 5, worker_id: "c" })).toEqual([]);
    await b.query("COMMIT");
    expect(await claim(c, { queues: [queue], batch_size: 5, worker_id: "c" })).toEqual([]);
    await complete(db.pool, held[0]!.job_id, 1);
    expect(await claim(c, { queues: [queue], batch_size: 5, worker_id: "c" })).toHaveLength(1);
    expect(await processing(queue)).toBe(1);
  });

  it("EvalPlanQual: a slot free in a locker's snapshot but taken and committed before it locks is passed over; a count of processing jobs is not", async () => {
    const queue = unique("epq");
    const [job1, job2] = await makeJobs(db.pool, 2, { queue });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 1)", [queue]);
    const { rows } = await db.pool.query("SELECT id::text FROM idemq.limits WHERE name = $1", [queue]);
    const limitId = rows[0].id as string;
    const [late, early] = await Promise.all([db.newClient(), db.newClient()]);
    // `late` takes its snapshot now (a cursor keeps its statement's snapshot), with the slot free...
    await late.query("BEGIN");
    await late.query(
      `DECLARE slot CURSOR FOR SELECT s.slot FROM idemq.limit_slots s WHERE s.limit_id = $1 AND s.held < s.size FOR UPDATE SKIP LOCKED`,
      [limitId],
    );
    await late.query(
      `DECLARE peer CURSOR FOR SELECT count(*)::int AS n FROM idemq.jobs j WHERE j.queue = $1 AND j.state = 'processing'`,
      [queue],
    );
    // ...then `early` claims through the slot (its stripe full) and commits: one job processing.
    const taken = await claim(early, { queues: [queue] });
    expect(taken.map((r) => r.job_id)).toEqual([job1]);
    // The stripe's test (held < size, _lock_slots') is re-checked on its newest version: nothing to lock.
    expect((await late.query("FETCH ALL FROM slot")).rows).toEqual([]);
    // The peers' way (count processing jobs in the snapshot, then take one) sees 0 running under a limit of 1.
    expect((await late.query("FETCH ALL FROM peer")).rows).toEqual([{ n: 0 }]);
    await late.query("ROLLBACK");
    // And claim itself, after the slot is freed and taken again between two claims' snapshots, never has two.
    await complete(db.pool, job1!, 1);
    expect((await claim(late, { queues: [queue] })).map((r) => r.job_id)).toEqual([job2]);
    expect(await claim(early, { queues: [queue] })).toEqual([]);
    expect(await processing(queue)).toBe(1);
  });

  it("a new concurrency limit waits for a claim in flight, counts its job, and a claim after it waits and obeys it", async () => {
    const queue = unique("in-flight");
    await makeJobs(db.pool, 5, { queue });
    const [b, admin, c] = await Promise.all([db.newClient(), db.newClient(), db.newClient()]);
    const [bPid, adminPid, cPid] = await Promise.all([backendPid(b), backendPid(admin), backendPid(c)]);
    await b.query("BEGIN");
    expect(await claim(b, { queues: [queue], worker_id: "b" })).toHaveLength(1);
    const setting = admin.query("SELECT idemq.set_limit(queue => $1, concurrency => 1)", [queue]);
    expect(await waitUntilBlocked(db.pool, adminPid)).toContain(bPid);
    const claiming = claim(c, { queues: [queue], batch_size: 5, worker_id: "c" });
    expect(await waitUntilBlocked(db.pool, cPid)).toContain(adminPid);
    await b.query("COMMIT");
    await setting;
    expect(await claiming).toEqual([]);
    const { rows } = await db.pool.query("SELECT running FROM idemq.limits() WHERE queue = $1", [queue]);
    expect(rows).toEqual([{ running: 1 }]);
    expect(await processing(queue)).toBe(1);
  });
});

describe("concurrency limit under load", () => {
  it("8 connections looping claim + complete on a queue limited to 3: the recorded runs never overlap more than 3", async () => {
    const queue = unique("stress");
    await makeJobs(db.pool, 240, { queue });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 3)", [queue]);
    await db.pool.query("CREATE TABLE IF NOT EXISTS public.runs (queue text, job_id bigint, at timestamptz, delta int)");
    const clients: pg.Client[] = await Promise.all(Array.from({ length: 8 }, () => db.newClient()));
    let done = 0;
    await Promise.all(
      clients.map(async (client, w) => {
        let idle = 0;
        while (done < 240 && idle < 2000) {
          const rows = await claim(client, { queues: [queue], batch_size: 1 + (w % 3), worker_id: `w${w}` });
          if (rows.length === 0) {
            idle++;
            continue;
          }
          for (const r of rows) {
            await client.query("INSERT INTO public.runs VALUES ($1, $2, clock_timestamp(), 1)", [queue, r.job_id]);
            await client.query("SELECT pg_catalog.md5(repeat('x', 20000))");
            await client.query("INSERT INTO public.runs VALUES ($1, $2, clock_timestamp(), -1)", [queue, r.job_id]);
            await complete(client, r.job_id, r.attempt);
            done++;
          }
        }
      }),
    );
    expect(done).toBe(240);
    const { rows } = await db.pool.query<{ peak: number }>(
      `SELECT max(running)::int AS peak FROM (
         SELECT sum(delta) OVER (ORDER BY at, delta, job_id) AS running FROM public.runs WHERE queue = $1) r`,
      [queue],
    );
    expect(rows[0]!.peak).toBeLessThanOrEqual(3);
    expect(rows[0]!.peak, "the claimers did run side by side").toBeGreaterThanOrEqual(2);
    const left = await db.pool.query("SELECT running FROM idemq.limits() WHERE queue = $1", [queue]);
    expect(left.rows).toEqual([{ running: 0 }]);
  });
});
