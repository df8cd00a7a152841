// A job an operator cancels while this worker holds it: the worker reports
// job:cancelled, with a reason that says so (before, job:lease-lost with
// currentState "cancelled", as if the lease had run out). The database tells
// it: complete(), fail() and snooze() are fenced, and their IQ410 names the
// job's state. Whether the heartbeat noticed first (plain tasks: their signal
// aborts) or the commit did (a transactional task's complete() in its
// transaction), whether the handler returned or threw, or the job was still
// waiting in the buffer, the report is the same, and the job stays cancelled.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, collectWorkerMetrics } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { parsePrometheusText, sampleValue } from "../helpers/prometheus-text.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let w: TestWorker;
/** One slot, so a second job waits in the buffer. */
let single: TestWorker;
const releases = new Map<string, () => void>();

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve()));
}

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  w = await startTestWorker(
    db.url,
    {
      // Returns a result once its signal aborts (the heartbeat found the lease gone).
      polite: async (_p, ctx) => {
        await untilAborted(ctx.signal);
        return { finished: "after the cancel" };
      },
      // Ignores its signal; returns nothing when the test releases it.
      stubborn: async (_p, ctx) => new Promise<void>((resolve) => releases.set(ctx.job.id, resolve)),
      // complete() in its own transaction is what finds out.
      tx: {
        transactional: true,
        run: async (_p, ctx) => new Promise<void>((resolve) => releases.set(ctx.job.id, resolve)),
      },
      // Throws once its signal aborts, as a fetch given ctx.signal does: fail() is what finds out.
      thrower: async (_p, ctx) => {
        await untilAborted(ctx.signal);
        throw ctx.signal.reason;
      },
    },
    { queues: ["cancel"], heartbeatInterval: "100ms", lease: "30s" },
  );
  single = await startTestWorker(
    db.url,
    { occupy: async (_p, ctx) => new Promise<void>((resolve) => releases.set(ctx.job.id, resolve)), waiting: async () => {} },
    { queues: ["cancel-buffered"], concurrency: 1, heartbeatInterval: "100ms", lease: "30s" },
  );
});
afterEach(() => {
  expect(w.of("worker:error")).toEqual([]);
  expect(single.of("worker:error")).toEqual([]);
});
afterAll(async () => {
  await stopWorkers();
});

async function started(jobId: string, on: TestWorker = w): Promise<void> {
  await waitFor(() => on.of("job:start").some((e) => e.jobId === jobId), { what: `job ${jobId} to start` });
}

async function cancelled(on: TestWorker, jobId: string): Promise<Record<string, unknown>> {
  return waitFor(() => on.of("job:cancelled").find((e) => e.jobId === jobId), { what: `job:cancelled of ${jobId}` });
}

describe("a job cancelled while it runs is reported as cancelled", () => {
  for (const task of ["polite", "stubborn", "tx", "thrower"]) {
    it(`${task}: job:cancelled, not job:lease-lost; the job stays cancelled, no success`, async () => {
      const { jobId } = await client.enqueue(task, {}, { queue: "cancel" });
      await started(jobId);
      expect(await client.cancel(jobId)).toBe("cancelled");
      // The polite and throwing handlers return by themselves; the others once released, after the heartbeat has (or has not) noticed.
      if (task === "stubborn" || task === "tx") {
        await waitFor(() => releases.has(jobId), { what: `handler of ${jobId}` });
        releases.get(jobId)!();
      }
      const event = await cancelled(w, jobId);
      expect(event).toMatchObject({ attempt: 1, task, queue: "cancel" });
      expect(event.durationMs).toBeGreaterThan(0);
      expect(String(event.reason)).toMatch(/^cancelled while this attempt ran \((complete|complete_many|fail): lease lost: attempt 1 no longer holds job/);
      const job = await client.getJob(jobId);
      expect(job).toMatchObject({ state: "cancelled", attempt: 1, result: null });
      expect(w.of("job:success").some((e) => e.jobId === jobId)).toBe(false);
      expect(w.of("job:lease-lost").filter((e) => e.jobId === jobId)).toEqual([]);
    });
  }

  it("a job cancelled while it waits in the buffer: job:cancelled once the heartbeat misses it, not job:lease-lost; it never starts", async () => {
    const occupy = await client.enqueue("occupy", {}, { queue: "cancel-buffered" });
    await started(occupy.jobId, single);
    const { jobId } = await client.enqueue("waiting", {}, { queue: "cancel-buffered" });
    // Claimed into the buffer behind the running job (processing, this worker's), not started.
    await waitFor(() => single.worker.buffered.jobs === 1, { what: `job ${jobId} in the buffer` });
    expect(await client.getJob(jobId)).toMatchObject({ state: "processing", lockedBy: single.worker.workerId });
    expect(await client.cancel(jobId)).toBe("cancelled");
    const event = await cancelled(single, jobId);
    expect(event).toMatchObject({ attempt: 1, task: "waiting", queue: "cancel-buffered" });
    expect(String(event.reason)).toMatch(/^cancelled while waiting in this worker's buffer \(snooze: lease lost: attempt 1 no longer holds job/);
    expect(single.of("job:lease-lost").filter((e) => e.jobId === jobId)).toEqual([]);
    releases.get(occupy.jobId)!();
    await waitFor(async () => (await client.getJob(occupy.jobId))?.state === "succeeded", { what: `job ${occupy.jobId} done` });
    expect(single.of("job:start").some((e) => e.jobId === jobId)).toBe(false);
    expect(await client.getJob(jobId)).toMatchObject({ state: "cancelled", attempt: 1 });
  });

  it("counts in idemq_worker_jobs_cancelled_total, not in idemq_worker_jobs_lease_lost_total", async () => {
    const { registry, close } = await collectWorkerMetrics(w.worker);
    try {
      const { jobId } = await client.enqueue("polite", {}, { queue: "cancel" });
      await started(jobId);
      await client.cancel(jobId);
      await cancelled(w, jobId);
      const families = parsePrometheusText(await registry.metrics());
      expect(sampleValue(families, "idemq_worker_jobs_cancelled_total", { task: "polite", queue: "cancel" })).toBe(1);
      expect(families.get("idemq_worker_jobs_lease_lost_total")!.samples).toEqual([]);
    } finally {
      await close();
    }
  });
});
