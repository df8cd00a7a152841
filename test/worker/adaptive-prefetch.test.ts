// A worker left at its default prefetch: its buffer grows while a backlog
// keeps claims full, shrinks when claims come back
// short, and never holds more than its bound. HeldJobs is fed real claims on a
// clock the test sets (so the completion rate is exact); then real workers on
// real connections: one working off a backlog, and two sharing one queue.
import { describe, expect, it } from "vitest";
import * as sql from "../../src/sql/index.ts";
import { createWorker, type Worker } from "../../src/index.ts";
import { WORKER_DEFAULTS } from "../../src/worker/defaults.ts";
import { HeldJobs } from "../../src/worker/held-jobs.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 6 });

async function enqueueNoops(queue: string, count: number): Promise<void> {
  await db.pool.query(
    `SELECT * FROM idemq.enqueue_many(jobs => (
       SELECT jsonb_agg(jsonb_build_object('task', 'noop', 'queue', $1::text, 'payload', jsonb_build_object('i', i)) ORDER BY i)
       FROM generate_series(1, $2::int) AS i))`,
    [queue, count],
  );
}

async function succeeded(queue: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state = 'succeeded'",
    [queue],
  );
  return rows[0]!.n;
}

describe("adaptive prefetch, HeldJobs fed real claims", () => {
  it("claims grow while a backlog keeps them full, stay within the bounds and the wait budget, and shrink once claims come back short", async () => {
    const queue = unique("window");
    await enqueueNoops(queue, 400);
    let clock = 0;
    const bounds = { min: 2, max: 64, waitBudgetMs: 100 };
    const held = new HeldJobs(new Map(), { concurrency: 2, prefetch: bounds, prefetchBytes: 1 << 20 }, () => {}, () => clock);
    const asked: number[] = [];
    const claimAndRun = async (msPerJob: number): Promise<number> => {
      const window = held.prefetch;
      expect(window).toBeLessThanOrEqual(bounds.max);
      const room = held.room();
      expect(room).toBeLessThanOrEqual(2 + window);
      const jobs = await sql.claim(db.pool, { workerId: "window-test", queues: [queue], batchSize: room });
      asked.push(room);
      held.claimed(jobs, room);
      // Nothing runs yet: the claim's jobs are all in the buffer, within concurrency + the window.
      expect(held.buffered.jobs).toBeLessThanOrEqual(2 + window);
      // Every job runs and gives its slot back, `msPerJob` apart: nothing is left in the buffer at the next claim.
      for (let h = held.startNext(); h !== undefined; h = held.startNext()) {
        clock += msPerJob;
        held.finish(h);
        held.freeSlot(h);
        held.remove(h);
      }
      return jobs.length;
    };

    // 1 job/ms, a 100 ms budget: the cap (about 100) is beyond max; the window doubles up to max.
    // Asked: the free slots and one job while no payload size is known, then concurrency + window.
    for (let i = 0; i < 7; i++) await claimAndRun(1);
    expect(asked).toEqual([3, 2 + 4, 2 + 8, 2 + 16, 2 + 32, 2 + 64, 2 + 64]);
    // Jobs slow down to 0.2 jobs/ms: the cap (64 jobs over 315 ms x 100 ms: 20) takes over from max.
    for (let i = 0; i < 3; i++) await claimAndRun(5);
    expect(held.prefetch).toBe(20);
    expect(asked.slice(-2)).toEqual([2 + 20, 2 + 20]);
    // Drain the queue: a short claim halves the window; empty ones bring it back to concurrency.
    while ((await claimAndRun(1)) > 0);
    for (let i = 0; i < 5; i++) await claimAndRun(1);
    expect(held.prefetch).toBe(2);
    expect(await db.pool.query("SELECT 1 FROM idemq.jobs WHERE queue = $1 AND locked_by = 'window-test' AND state = 'processing'", [queue]).then((r) => r.rowCount)).toBe(400);
  });
});

describe("adaptive prefetch, real workers", () => {
  it("a worker at its defaults never holds more than concurrency + prefetchMax jobs (running and buffered), and buffers more than concurrency on a backlog", async () => {
    const queue = unique("deep");
    const total = 4000;
    await enqueueNoops(queue, total);
    const concurrency = 4;
    const buffered: number[] = [];
    // Running + buffered, the bound claims keep (held-jobs.ts: room = concurrency
    // + window - running - buffered). The buffer alone may briefly exceed the
    // window by the slots still free: a handler that starts first sees the jobs
    // of its batch that are about to take the other free slots (493 seen in CI).
    const held: number[] = [];
    let worker!: Worker;
    worker = createWorker({
      connectionString: db.url,
      queues: [queue],
      concurrency,
      handleSignals: false,
      tasks: {
        noop: async () => {
          buffered.push(worker.buffered.jobs);
          held.push(worker.buffered.jobs + worker.runningCount);
        },
      },
    });
    const errors: unknown[] = [];
    worker.on("worker:error", (e) => errors.push(e.error));
    await worker.start();
    try {
      await waitFor(async () => (await succeeded(queue)) === total, { what: `${total} jobs succeeded` });
    } finally {
      await worker.stop();
    }
    expect(buffered).toHaveLength(total);
    expect(held).toHaveLength(total);
    expect(Math.max(...held)).toBeLessThanOrEqual(concurrency + WORKER_DEFAULTS.prefetchMax);
    expect(Math.max(...buffered)).toBeGreaterThan(concurrency);
    expect(errors).toEqual([]);
  });

  it("two workers at their defaults on one queue both get jobs, and every job runs once", async () => {
    const queue = unique("shared");
    const total = 3000;
    const ran = new Map<string, number>();
    const counts = [0, 0];
    const workers = [0, 1].map((n) => {
      const worker = createWorker({
        connectionString: db.url,
        queues: [queue],
        concurrency: 4,
        pollInterval: "200ms",
        handleSignals: false,
        tasks: {
          noop: async (_payload: unknown, ctx) => {
            counts[n]!++;
            ran.set(ctx.job.id, (ran.get(ctx.job.id) ?? 0) + 1);
          },
        },
      });
      return worker;
    });
    const errors: unknown[] = [];
    for (const w of workers) w.on("worker:error", (e) => errors.push(e.error));
    await Promise.all(workers.map((w) => w.start()));
    try {
      // Both wait on an empty queue; the backlog arrives in one transaction.
      await enqueueNoops(queue, total);
      await waitFor(async () => (await succeeded(queue)) === total, { what: `${total} jobs succeeded` });
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
    }
    expect(ran.size).toBe(total);
    expect([...ran.values()].every((n) => n === 1)).toBe(true);
    expect(counts[0]! + counts[1]!).toBe(total);
    expect(counts[0]).toBeGreaterThan(0);
    expect(counts[1]).toBeGreaterThan(0);
    expect(errors).toEqual([]);
  });
});
