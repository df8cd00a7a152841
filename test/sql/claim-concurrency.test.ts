// claim under concurrency, on real connections: SKIP LOCKED hands every job
// out exactly once, and a claimer never waits for another claimer.
// Each case uses its own queue, since these transactions commit.
import { describe, expect, it } from "vitest";
import { backendPid, useTestDatabase } from "../helpers/db.ts";
import { makeJobs } from "../helpers/jobs.ts";
import { byId, claim } from "../helpers/work.ts";

const db = useTestDatabase();

describe("claim concurrency", () => {
  it("8 claimers looping claim(25) + complete_many over 2,000 jobs get every job exactly once", async () => {
    const queue = "stress";
    const ids = await makeJobs(db.pool, 2000, { queue });
    expect(ids).toHaveLength(2000);

    const workers = await Promise.all(Array.from({ length: 8 }, () => db.newClient()));
    const handedOut = new Map<string, number>();
    const perWorker = await Promise.all(
      workers.map(async (client, w) => {
        let claimedHere = 0;
        for (;;) {
          const rows = await claim(client, { worker_id: `w${w}`, queues: [queue], batch_size: 25 });
          if (rows.length === 0) return claimedHere;
          claimedHere += rows.length;
          for (const row of rows) {
            expect(row.attempt).toBe(1);
            handedOut.set(row.job_id, (handedOut.get(row.job_id) ?? 0) + 1);
          }
          const done = await client.query<{ id: string }>(
            "SELECT id FROM idemq.complete_many($1::bigint[], $2::int[], $3::uuid[]) AS id",
            [rows.map((r) => r.job_id), rows.map((r) => r.attempt), rows.map((r) => r.lease_token)],
          );
          expect(done.rows.map((r) => r.id).sort(byId)).toEqual(rows.map((r) => r.job_id).sort(byId));
        }
      }),
    );

    expect(perWorker.reduce((a, b) => a + b, 0)).toBe(2000);
    expect(perWorker.filter((n) => n > 0).length, "workers that claimed something").toBeGreaterThan(1);
    expect([...handedOut.values()].every((n) => n === 1)).toBe(true);
    expect([...handedOut.keys()].sort(byId)).toEqual([...ids].sort(byId));
    const { rows } = await db.pool.query<{ state: string; attempt: number; n: number }>(
      "SELECT state::text AS state, attempt, count(*)::int AS n FROM idemq.jobs WHERE queue = $1 GROUP BY 1, 2",
      [queue],
    );
    expect(rows).toEqual([{ state: "succeeded", attempt: 1, n: 2000 }]);
  });

  it("8 claimers looping claim(25) over 40 (task, queue) pairs (the multi-key merge, in rounds) get every job exactly once", async () => {
    const p = "stress-keys";
    const tasks = Array.from({ length: 20 }, (_, t) => `${p}-t${t}`);
    // Uneven pairs: task 0 holds a third of the jobs and the highest
    // priorities, so claims need several rounds of the merge while the other
    // claimers hold the jobs around their frontiers.
    const { rows: made } = await db.pool.query<{ id: string }>(
      `SELECT e.job_id::text AS id FROM idemq.enqueue_many((
         SELECT jsonb_agg(jsonb_build_object(
           'task', $1 || '-t' || CASE WHEN g % 3 = 0 THEN 0 ELSE g % 20 END,
           'queue', $1 || '-q' || (g % 2),
           'priority', CASE WHEN g % 3 = 0 THEN 5 + g % 4 ELSE (g * 7) % 6 END,
           'run_at', now() - ((g * 13) % 97) * interval '1 second'))
         FROM generate_series(1, 2000) g)) e`,
      [p],
    );
    const ids = made.map((r) => r.id);
    expect(ids).toHaveLength(2000);

    const workers = await Promise.all(Array.from({ length: 8 }, () => db.newClient()));
    const handedOut = new Map<string, number>();
    const perWorker = await Promise.all(
      workers.map(async (client, w) => {
        let claimedHere = 0;
        for (;;) {
          const rows = await claim(client, { worker_id: `w${w}`, tasks, batch_size: 25 });
          if (rows.length === 0) return claimedHere;
          claimedHere += rows.length;
          for (const row of rows) {
            expect(row.attempt).toBe(1);
            handedOut.set(row.job_id, (handedOut.get(row.job_id) ?? 0) + 1);
          }
          const done = await client.query<{ id: string }>(
            "SELECT id FROM idemq.complete_many($1::bigint[], $2::int[], $3::uuid[]) AS id",
            [rows.map((r) => r.job_id), rows.map((r) => r.attempt), rows.map((r) => r.lease_token)],
          );
          expect(done.rows.map((r) => r.id).sort(byId)).toEqual(rows.map((r) => r.job_id).sort(byId));
        }
      }),
    );

    expect(perWorker.reduce((a, b) => a + b, 0)).toBe(2000);
    expect(perWorker.filter((n) => n > 0).length, "workers that claimed something").toBeGreaterThan(1);
    expect([...handedOut.values()].every((n) => n === 1)).toBe(true);
    expect([...handedOut.keys()].sort(byId)).toEqual([...ids].sort(byId));
    const { rows } = await db.pool.query<{ state: string; attempt: number; n: number }>(
      "SELECT state::text AS state, attempt, count(*)::int AS n FROM idemq.jobs WHERE task LIKE $1 GROUP BY 1, 2",
      [`${p}-%`],
    );
    expect(rows).toEqual([{ state: "succeeded", attempt: 1, n: 2000 }]);
  });

  it("a claim does not wait for another session's open claim and gets the next jobs (SKIP LOCKED)", async () => {
    const queue = "pair";
    const ids = await makeJobs(db.pool, 5, { queue });
    const a = await db.newClient();
    const b = await db.newClient();
    // A claim that waited on a row lock would fail here instead of hanging.
    await b.query("SET lock_timeout = '5s'");

    await a.query("BEGIN");
    const byA = await claim(a, { worker_id: "A", queues: [queue], batch_size: 2 });
    expect(byA.map((r) => r.job_id)).toEqual(ids.slice(0, 2));

    // A's transaction is still open and holds its two rows.
    const byB = await claim(b, { worker_id: "B", queues: [queue], batch_size: 2 });
    expect(byB.map((r) => r.job_id)).toEqual(ids.slice(2, 4));
    const { rows: open } = await db.pool.query<{ state: string }>(
      "SELECT state FROM pg_stat_activity WHERE pid = $1",
      [await backendPid(a)],
    );
    expect(open[0]!.state).toBe("idle in transaction");

    await a.query("COMMIT");
    const rest = await claim(b, { worker_id: "B", queues: [queue], batch_size: 10 });
    expect(rest.map((r) => r.job_id)).toEqual(ids.slice(4));

    const { rows } = await db.pool.query<{ id: string; locked_by: string; attempt: number }>(
      "SELECT id, locked_by, attempt FROM idemq.jobs WHERE queue = $1 ORDER BY id",
      [queue],
    );
    expect(rows.map((r) => r.locked_by)).toEqual(["A", "A", "B", "B", "B"]);
    expect(rows.every((r) => r.attempt === 1)).toBe(true);
  });

  it("a rolled-back claim leaves its jobs for the next claimer, attempt unspent", async () => {
    const queue = "rollback";
    const ids = await makeJobs(db.pool, 2, { queue });
    const a = await db.newClient();
    const b = await db.newClient();
    await a.query("BEGIN");
    expect((await claim(a, { worker_id: "A", queues: [queue], batch_size: 2 })).map((r) => r.job_id)).toEqual(ids);
    expect(await claim(b, { worker_id: "B", queues: [queue], batch_size: 2 })).toEqual([]);
    await a.query("ROLLBACK");
    const byB = await claim(b, { worker_id: "B", queues: [queue], batch_size: 2 });
    expect(byB.map((r) => [r.job_id, r.attempt])).toEqual(ids.map((id) => [id, 1]));
  });
});
