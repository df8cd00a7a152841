// The worker's retention service: retainer.runOnce() calls apply_retention()
// in batches of retentionBatchSize until a batch comes back short, and the
// timer (retentionInterval) runs it on its own. Finished jobs past their
// retention go; jobs a worker is processing, and every other active job, are
// never touched, even with every retention 0.
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { Client, createWorker, type Worker, type WorkerOptions } from "../../src/index.ts";
import { WorkerConfigError } from "../../src/worker/task-config.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { TERMINAL_STATES } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 6 });
let client: Client;
const workers: Worker[] = [];

beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterAll(async () => {
  await Promise.all(workers.map((w) => w.stop()));
});

function worker(options: Partial<WorkerOptions> = {}, tasks: WorkerOptions["tasks"] = { noop: async () => {} }): Worker {
  const w = createWorker({ pool: db.pool, handleSignals: false, tasks, ...options } as WorkerOptions);
  workers.push(w);
  return w;
}

/** n cancelled jobs in `queue`, finished 31 days ago (past the 30-day default). */
async function oldCancelled(queue: string, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const { jobId } = await client.enqueue("noop", { i }, { queue });
    await client.cancel(jobId);
    ids.push(jobId);
  }
  await db.pool.query("UPDATE idemq.jobs SET finished_at = now() - interval '31 days' WHERE id = ANY ($1::bigint[])", [ids]);
  return ids;
}

async function remaining(ids: string[]): Promise<number> {
  const { rows } = await db.pool.query<{ n: string }>("SELECT count(*) AS n FROM idemq.jobs WHERE id = ANY ($1::bigint[])", [ids]);
  return Number(rows[0]!.n);
}

describe("retainer.runOnce()", () => {
  it("calls apply_retention in batches of retentionBatchSize until one comes back short: 35 jobs, batches of 10, 4 calls", async () => {
    const ids = await oldCancelled("retain-batches", 35);
    const w = worker({ retentionBatchSize: 10 });
    const query = vi.spyOn(db.pool, "query");
    try {
      expect(await w.retainer.runOnce()).toBe(35);
      const calls = query.mock.calls.map(([config]) => (typeof config === "string" ? config : (config as { text: string }).text));
      expect(calls.filter((text) => text.includes("apply_retention"))).toEqual(
        Array(4).fill("SELECT * FROM idemq.apply_retention($1) AS r"),
      );
      const sizes = query.mock.calls
        .map(([config]) => config as unknown as { text?: string; values?: unknown[] })
        .filter((config) => typeof config === "object" && config.text?.includes("apply_retention"))
        .map((config) => config.values);
      expect(sizes).toEqual(Array(4).fill([10]));
    } finally {
      query.mockRestore();
    }
    expect(await remaining(ids)).toBe(0);
    expect(await w.retainer.runOnce()).toBe(0);
  });

  it("leaves every job a worker is processing (and the other active jobs) alone, even with every retention 0", async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const processing = worker({ queues: ["retain-busy"], concurrency: 3 }, { hold: async () => gate });
    const old = await oldCancelled("retain-busy-old", 3);
    const busy = await Promise.all([1, 2, 3].map((i) => client.enqueue("hold", { i }, { queue: "retain-busy" })));
    const waiting = await client.enqueue("hold", {}, { queue: "retain-elsewhere" });
    const delayed = await client.enqueue("hold", {}, { queue: "retain-busy", runAt: new Date(Date.now() + 3_600_000) });
    await processing.start();
    await waitFor(async () => {
      const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = 'retain-busy' AND state = 'processing'");
      return rows[0].n === 3;
    }, { what: "three jobs processing", timeoutMs: 10_000, intervalMs: 20 });
    for (const state of TERMINAL_STATES) await client.setRetention({ state, keep: "0 seconds" });
    try {
      expect(await worker({ retentionBatchSize: 2 }).retainer.runOnce()).toBe(3);
      expect(await remaining(old)).toBe(0);
      for (const { jobId } of busy) expect(await client.getJob(jobId)).toMatchObject({ state: "processing", attempt: 1 });
      expect(await client.getJob(waiting.jobId)).toMatchObject({ state: "enqueued" });
      expect(await client.getJob(delayed.jobId)).toMatchObject({ state: "scheduled" });
      // The held jobs finish normally; with succeeded retention 0 their completion deletes them.
      const succeeded: string[] = [];
      processing.on("job:success", (e) => succeeded.push(e.jobId));
      release();
      await waitFor(async () => succeeded.length === 3, { what: "the three held jobs to succeed", timeoutMs: 10_000, intervalMs: 20 });
      await waitFor(async () => (await remaining(busy.map((b) => b.jobId))) === 0, { what: "the completed rows to be deleted", timeoutMs: 10_000, intervalMs: 20 });
    } finally {
      release();
      await processing.stop();
      await client.setRetention({ state: "succeeded", keep: "7 days" });
      for (const state of ["failed", "cancelled", "expired"] as const) await client.setRetention({ state, keep: "30 days" });
    }
  });
});

describe("retention 0 and a stale attempt", () => {
  it("an attempt whose job another attempt completed (and retention 0 deleted) ends as job:lease-lost, not worker:error", async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const w = worker(
      { queues: ["retain-stale"], concurrency: 2 },
      {
        stale_tx: { transactional: true, run: async () => gate },
        stale_result: async () => {
          await gate;
          return { kept: false };
        },
      },
    );
    const lost: string[] = [];
    const errors: unknown[] = [];
    w.on("job:lease-lost", (e) => lost.push(e.jobId));
    w.on("worker:error", (e) => errors.push(e));
    await client.setRetention({ state: "succeeded", keep: "0 seconds" });
    try {
      const jobs = [await client.enqueue("stale_tx", {}, { queue: "retain-stale" }), await client.enqueue("stale_result", {}, { queue: "retain-stale" })];
      const ids = jobs.map((j) => j.jobId);
      await w.start();
      await waitFor(async () => {
        const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE id = ANY ($1::bigint[]) AND state = 'processing'", [ids]);
        return rows[0].n === 2;
      }, { what: "both jobs processing", timeoutMs: 10_000, intervalMs: 20 });
      // Another worker takes both over (lease run out, rescued, claimed) and completes them: deleted at once.
      const other = await db.pool.connect();
      try {
        await other.query("BEGIN");
        await other.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = ANY ($1::bigint[])", [ids]);
        await other.query("SELECT idemq.rescue()");
        const { rows } = await other.query("SELECT job_id AS id, attempt FROM idemq.claim(worker_id => 'other', queues => ARRAY['retain-stale'], batch_size => 2)");
        expect(rows.map((r) => r.id).sort()).toEqual([...ids].sort());
        for (const r of rows) await other.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [r.id, r.attempt]);
        await other.query("COMMIT");
      } finally {
        other.release();
      }
      expect(await remaining(ids)).toBe(0);
      release();
      await waitFor(async () => lost.length === 2, { what: "both stale attempts to end", timeoutMs: 10_000, intervalMs: 20 });
      expect(lost.sort()).toEqual([...ids].sort());
      expect(errors).toEqual([]);
    } finally {
      release();
      await w.stop();
      await client.setRetention({ state: "succeeded", keep: "7 days" });
    }
  });
});

describe("the retention timer", () => {
  it("runs apply_retention on its own every retentionInterval once the worker started", async () => {
    const ids = await oldCancelled("retain-timer", 2);
    const w = worker({ retentionInterval: "50 milliseconds" });
    await w.start();
    await waitFor(async () => (await remaining(ids)) === 0, { what: "the timer to delete the old jobs", timeoutMs: 10_000, intervalMs: 20 });
    await w.stop();
  });

  it("retentionBatchSize outside 1..10000 or not an integer is refused when the worker is created", () => {
    for (const retentionBatchSize of [0, 10001, 1.5]) {
      expect(() => createWorker({ pool: db.pool, handleSignals: false, tasks: {}, retentionBatchSize }), String(retentionBatchSize)).toThrow(
        WorkerConfigError,
      );
    }
  });
});
