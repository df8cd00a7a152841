// Concurrency keys under faults, with real processes (issue 26, items 3 and
// 7): four `idemq worker` processes and two SQL consumers race on one queue
// whose jobs carry 6 concurrency keys (K = 1). Every handler records its start
// and end in the database (test/fixtures/worker/flow-tasks.ts). One worker is
// SIGKILLed while a handler of it runs: its job keeps its key until rescue
// takes it back and another process runs it again. The test asserts that no
// two handlers of one key ever ran at once, that different keys did run side
// by side, and that every job finished exactly once.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { createFlowRuns, FLOW_WORKER_ENV, sqlConsumer } from "../helpers/flow-runs.ts";
import { unique } from "../helpers/jobs.ts";
import { killAllWorkers, startedWorker, type WorkerProcess } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const KEYS = 6;
const JOBS = 48;

const db = useTestDatabase({ poolSize: 4 });
beforeAll(async () => {
  await createFlowRuns(db.pool);
});
afterEach(async () => {
  await killAllWorkers();
});

describe("concurrency keys with 4 worker processes and 2 SQL consumers, one worker SIGKILLed", () => {
  it("never two handlers of one key at once, keys side by side, every job finished once", async () => {
    const queue = unique("keyed");
    const workers: WorkerProcess[] = await Promise.all(
      [1, 2, 3, 4].map(() => startedWorker({ tasks: "flow-tasks.ts", databaseUrl: db.url, env: FLOW_WORKER_ENV, args: ["--queues", queue] })),
    );
    await db.pool.query(
      `SELECT idemq.enqueue(task => 'flow', queue => $1, payload => jsonb_build_object('ms', 40 + (i * 37) % 90),
                            concurrency_key => $1 || ':' || (i % $3))
       FROM generate_series(1, $2) i`,
      [queue, JOBS, KEYS],
    );
    let allDone = false;
    const consumers = [sqlConsumer(db, "sql-1", queue, () => allDone), sqlConsumer(db, "sql-2", queue, () => allDone)];

    const inside = await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ who: string; job_id: string }>(
          "SELECT who, job_id::text FROM public.flow_runs WHERE ended_at IS NULL AND who LIKE 'worker:%' LIMIT 1",
        );
        return rows[0];
      },
      { what: "a worker process inside a handler", intervalMs: 5 },
    );
    const victim = workers.find((w) => `worker:${w.pid}` === inside.who)!;
    victim.child.kill("SIGKILL");
    expect(await victim.exited).toEqual({ code: null, signal: "SIGKILL" });
    const { rows: killedRows } = await db.pool.query<{ at: Date }>("SELECT clock_timestamp() AS at");
    const killedAt = killedRows[0]!.at;

    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state = 'succeeded'",
          [queue],
        );
        return rows[0]!.n === JOBS;
      },
      { what: `all ${JOBS} jobs to succeed`, timeoutMs: 90_000 },
    );
    allDone = true;
    // The SQL consumers race the workers (woken by NOTIFY; the consumers poll): with at most 6 jobs
    // runnable they may win none, so their share is not asserted; what they ran is in flow_runs.
    await Promise.all(consumers);

    // The killed job ran again elsewhere, after rescue.
    const { rows: again } = await db.pool.query<{ who: string }>(
      "SELECT who FROM public.flow_runs WHERE job_id = $1 AND ended_at IS NOT NULL",
      [inside.job_id],
    );
    expect(again).toHaveLength(1);
    expect(again[0]!.who).not.toBe(inside.who);

    // Per key, and over all keys: the most handlers running at one instant (a killed one until the kill).
    const { rows: overlap } = await db.pool.query<{ key: string | null; max: number }>(
      `WITH spans AS (
         SELECT j.concurrency_key AS key, r.started_at AS s, coalesce(r.ended_at, $1::timestamptz) AS e
         FROM public.flow_runs r JOIN idemq.jobs j ON j.id = r.job_id WHERE j.queue = $2),
       edges AS (SELECT key, s AS at, 1 AS d FROM spans UNION ALL SELECT key, e, -1 FROM spans)
       SELECT key, max(running)::int AS max FROM (
         SELECT key, sum(d) OVER (PARTITION BY key ORDER BY at, d ROWS UNBOUNDED PRECEDING) AS running FROM edges) x
       GROUP BY key
       UNION ALL
       SELECT NULL, max(running)::int FROM (
         SELECT sum(d) OVER (ORDER BY at, d ROWS UNBOUNDED PRECEDING) AS running FROM edges) y`,
      [killedAt, queue],
    );
    const perKey = overlap.filter((r) => r.key !== null);
    expect(perKey).toHaveLength(KEYS);
    for (const r of perKey) expect(r.max, r.key!).toBe(1);
    // Keys ran side by side: one key at a time held back nobody else.
    expect(overlap.find((r) => r.key === null)!.max).toBeGreaterThan(1);

    // Exactly once: each job has one finished handler run, its last attempt's.
    const { rows: once } = await db.pool.query<{ finished: number; last_finished: boolean }>(
      `SELECT (SELECT count(*) FROM public.flow_runs r WHERE r.job_id = j.id AND r.ended_at IS NOT NULL)::int AS finished,
              EXISTS (SELECT FROM public.flow_runs r WHERE r.job_id = j.id AND r.attempt = j.attempt AND r.ended_at IS NOT NULL) AS last_finished
       FROM idemq.jobs j WHERE j.queue = $1 AND j.state = 'succeeded'`,
      [queue],
    );
    expect(once).toHaveLength(JOBS);
    expect(once.filter((r) => r.finished !== 1 || !r.last_finished)).toEqual([]);
  }, 150_000);
});
