// A job an operator cancels while its attempt runs: the worker reports
// job:lease-lost with currentState "cancelled" and a reason that says so
// (before, a lease-lost like any other). The database tells it: complete()
// and fail() are fenced, and their IQ410 names the job's state. Whether the
// heartbeat noticed first (plain tasks: their signal aborts) or the commit
// did (a transactional task's complete() in its transaction), the report is
// the same, and the job stays cancelled.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { freshDatabase, type TestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

let db: TestDatabase;
let client: Client;
let w: TestWorker;
const releases = new Map<string, () => void>();

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve()));
}

beforeAll(async () => {
  db = await freshDatabase({ poolSize: 3 });
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
    },
    { queues: ["cancel"], heartbeatInterval: "100ms", lease: "30s" },
  );
});
afterEach(() => {
  expect(w.of("worker:error")).toEqual([]);
});
afterAll(async () => {
  await stopWorkers();
  await db?.drop();
});

async function started(jobId: string): Promise<void> {
  await waitFor(() => w.of("job:start").some((e) => e.jobId === jobId), { what: `job ${jobId} to start` });
}

async function lost(jobId: string): Promise<Record<string, unknown>> {
  return waitFor(() => w.of("job:lease-lost").find((e) => e.jobId === jobId), { what: `job:lease-lost of ${jobId}` });
}

describe("a job cancelled while it runs is reported as cancelled", () => {
  for (const task of ["polite", "stubborn", "tx"]) {
    it(`${task}: job:lease-lost with currentState "cancelled"; the job stays cancelled, no success`, async () => {
      const { jobId } = await client.enqueue(task, {}, { queue: "cancel" });
      await started(jobId);
      expect(await client.cancel(jobId)).toBe("cancelled");
      // The polite handler returns by itself; the others once released, after the heartbeat has (or has not) noticed.
      if (task !== "polite") {
        await waitFor(() => releases.has(jobId), { what: `handler of ${jobId}` });
        releases.get(jobId)!();
      }
      const event = await lost(jobId);
      expect(event).toMatchObject({ attempt: 1, currentState: "cancelled" });
      expect(String(event.reason)).toMatch(/^cancelled while this attempt ran \((complete|complete_many|fail): lease lost: attempt 1 no longer holds job/);
      const job = await client.getJob(jobId);
      expect(job).toMatchObject({ state: "cancelled", attempt: 1, result: null });
      expect(w.of("job:success").some((e) => e.jobId === jobId)).toBe(false);
    });
  }
});
