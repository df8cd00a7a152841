// The at-least-once experiment, with real worker processes: every order is
// delivered three times (three keyless jobs), concurrently, to a
// transactional task whose guardKey is the order. The guard turns 300
// deliveries into 100 effects; the control task without the guard writes
// 300. Then leases run out mid-job, so one job runs in two workers at once:
// the stale attempt's transaction rolls back and each job writes one row.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { killAllWorkers, startedWorker, type WorkerProcess } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 4 });
let client: Client;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query(`
    CREATE TABLE public.ledger (task text NOT NULL, order_id int NOT NULL, job_id bigint NOT NULL,
                                attempt int NOT NULL, worker_pid int NOT NULL);
    CREATE TABLE public.stalls (job_id bigint NOT NULL, attempt int NOT NULL, worker_pid int NOT NULL);`);
});
afterEach(async () => {
  await killAllWorkers();
});

async function startWorkers(n: number, env: Record<string, string> = {}, concurrency = 8): Promise<WorkerProcess[]> {
  return Promise.all(
    Array.from({ length: n }, () =>
      startedWorker({ tasks: "ledger-tasks.ts", databaseUrl: db.url, args: ["--concurrency", String(concurrency)], env }),
    ),
  );
}

/** Enqueues `perOrder` keyless jobs per order, the deliveries of one order next to each other. */
async function deliver(task: string, orders: number[], perOrder: number): Promise<string[]> {
  const results = await client.enqueueMany(
    orders.flatMap((orderId) => Array.from({ length: perOrder }, () => ({ task, payload: { orderId } }))),
  );
  expect(results.every((r) => r.outcome === "created")).toBe(true);
  return results.map((r) => r.jobId!);
}

async function waitAllSucceeded(jobIds: string[], timeoutMs = 60_000): Promise<void> {
  await waitFor(
    async () => {
      const { rows } = await db.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM idemq.jobs WHERE id = ANY($1) AND state = 'succeeded'",
        [jobIds],
      );
      return rows[0]!.n === jobIds.length;
    },
    { what: `${jobIds.length} jobs succeeded`, timeoutMs },
  );
}

async function stopAll(workers: WorkerProcess[]): Promise<void> {
  for (const w of workers) w.child.kill("SIGTERM");
  const exits = await Promise.all(workers.map((w) => w.exited));
  expect(exits.map((e) => e.code)).toEqual(workers.map(() => 0));
}

describe("at least once: 100 orders delivered 3 times each to 3 worker processes", () => {
  it("transactional task guarded by the order: exactly 100 ledger rows, 200 counted duplicates (events and stats)", async () => {
    const workers = await startWorkers(3);
    const orders = Array.from({ length: 100 }, (_, i) => i + 1);
    const jobIds = await deliver("credit", orders, 3);
    expect(jobIds).toHaveLength(300);
    await waitAllSucceeded(jobIds);

    const { rows: ledger } = await db.pool.query<{ order_id: number; n: number }>(
      "SELECT order_id, count(*)::int AS n FROM public.ledger WHERE task = 'credit' GROUP BY order_id ORDER BY order_id",
    );
    expect(ledger).toHaveLength(100);
    expect(ledger.map((r) => r.order_id)).toEqual(orders);
    expect(ledger.every((r) => r.n === 1)).toBe(true);

    const stats = await client.stats();
    expect(stats.find((r) => r.task === "credit" && r.metric === "guard_duplicate")?.value).toBe(200);
    await stopAll(workers);
    const duplicates = workers.flatMap((w) => w.events.filter((e) => e.event === "job:duplicate"));
    const successes = workers.flatMap((w) => w.events.filter((e) => e.event === "job:success" && e.task === "credit"));
    expect(duplicates).toHaveLength(200);
    expect(successes).toHaveLength(100);
    expect(new Set([...duplicates, ...successes].map((e) => e.jobId)).size).toBe(300);
    // Every order had its duplicates, on the order's guard key.
    expect(new Set(duplicates.map((e) => e.guardKey))).toEqual(
      new Set(orders.map((o) => `credit:order-${o}`)),
    );
    // The deliveries really were spread over the processes.
    expect(workers.filter((w) => w.count("job:start") > 0).length).toBeGreaterThanOrEqual(2);
  });

  it("control: the same deliveries to a plain task without the guard write 300 rows", async () => {
    const workers = await startWorkers(3);
    const orders = Array.from({ length: 100 }, (_, i) => i + 1);
    await waitAllSucceeded(await deliver("credit_unguarded", orders, 3));
    const { rows } = await db.pool.query<{ rows: number; orders: number }>(
      "SELECT count(*)::int AS rows, count(DISTINCT order_id)::int AS orders FROM public.ledger WHERE task = 'credit_unguarded'",
    );
    expect(rows[0]).toEqual({ rows: 300, orders: 100 });
    await stopAll(workers);
    expect(workers.reduce((n, w) => n + w.count("job:duplicate"), 0)).toBe(0);
  });
});

describe("at least once with leases running out mid-job", () => {
  it("each job runs in two workers at once; the stale attempt rolls back, and each job writes one ledger row", async () => {
    await db.pool.query("DELETE FROM public.ledger");
    // Leases of 1 s with no heartbeat before they run out, rescue every ~200 ms,
    // no prefetch (a buffered job would lose its lease too). Every first
    // attempt writes its row, then holds its transaction open until a newer
    // attempt has taken the job over.
    const env = {
      IDEMQ_TEST_LEASE: "1s",
      IDEMQ_TEST_HEARTBEAT: "1h",
      IDEMQ_TEST_RESCUE: "200ms",
      IDEMQ_TEST_POLL: "200ms",
      IDEMQ_TEST_PREFETCH: "0",
      IDEMQ_TEST_STALL_FIRST_ATTEMPT: "1",
    };
    // 3 x 16 slots: the 20 stalled first attempts leave room for the 20 second ones.
    const workers = await startWorkers(3, env, 16);
    const orders = Array.from({ length: 20 }, (_, i) => 1001 + i);
    const jobIds = await deliver("credit", orders, 1);
    await waitAllSucceeded(jobIds);

    // Every job was held by two attempts at once: the first stalled (its
    // transaction open, its ledger row written) until a second claimed it.
    const { rows: stalls } = await db.pool.query<{ job_id: string; attempt: number }>(
      "SELECT job_id, attempt FROM public.stalls ORDER BY job_id",
    );
    expect(stalls.map((s) => s.job_id)).toEqual(jobIds);
    expect(stalls.every((s) => s.attempt === 1)).toBe(true);

    // One ledger row per job, written by the attempt that completed it; no row of a stale attempt survived.
    const { rows: ledger } = await db.pool.query<{ job_id: string; attempt: number; job_attempt: number }>(
      `SELECT l.job_id, l.attempt, j.attempt AS job_attempt
       FROM public.ledger l JOIN idemq.jobs j ON j.id = l.job_id
       WHERE l.order_id >= 1001 ORDER BY l.job_id`,
    );
    expect(ledger.map((r) => r.job_id)).toEqual(jobIds);
    expect(ledger.every((r) => r.attempt === r.job_attempt && r.attempt >= 2)).toBe(true);

    // The stale attempts: IQ410 from complete() rolled their transactions back.
    await stopAll(workers);
    const lost = workers.flatMap((w) => w.events.filter((e) => e.event === "job:lease-lost"));
    const lostFirstAttempts = new Set(lost.filter((e) => e.attempt === 1).map((e) => e.jobId));
    expect([...lostFirstAttempts].sort()).toEqual([...jobIds].sort());
    expect(lost.every((e) => String(e.reason).includes("lease lost"))).toBe(true);
    // The lease expiries are on record in the jobs.
    const { rows: errors } = await db.pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM idemq.jobs j, jsonb_array_elements(j.errors) e WHERE j.id = ANY($1) AND e->>'class' = 'LeaseExpired' AND e->>'attempt' = '1'",
      [jobIds],
    );
    expect(errors[0]!.n).toBe(20);
  });
});
