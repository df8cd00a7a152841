// Lease loss: while a handler runs, its job is taken over by a newer attempt
// (the lease made to run out, rescued and claimed by another worker, in one
// transaction). The worker's next heartbeat misses the job: ctx.signal aborts
// with a LeaseLostError and the attempt's result is discarded. A
// transactional task's complete() is refused with IQ410 and its writes roll back.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, LeaseLostError } from "../../src/index.ts";
import { expectSqlError, useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let w: TestWorker;
/** What each handler saw when its signal aborted, by job id. */
const aborted = new Map<string, unknown>();

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the signal never aborted")), 20_000);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query("CREATE TABLE public.writes (job_id bigint NOT NULL)");
  w = await startTestWorker(
    db.url,
    {
      hold: async (_p, ctx) => {
        await untilAborted(ctx.signal);
        aborted.set(ctx.job.id, ctx.signal.reason);
        return { finished: "after the loss" }; // discarded
      },
      hold_tx: {
        transactional: true,
        run: async (_p, ctx) => {
          await ctx.tx.query("INSERT INTO public.writes (job_id) VALUES ($1)", [ctx.job.id]);
          await untilAborted(ctx.signal);
          aborted.set(ctx.job.id, ctx.signal.reason);
          // Returns normally: the worker still calls complete() in this transaction, which refuses.
        },
      },
    },
    { queues: ["lease"], heartbeatInterval: "100ms", lease: "30s" },
  );
});
afterEach(() => {
  expect(w.of("worker:error")).toEqual([]);
});
afterAll(async () => {
  await stopWorkers();
});

/** Makes the lease run out, rescues the job and claims it as "thief", all in one transaction. */
async function takeOver(jobId: string): Promise<void> {
  const thief = await db.pool.connect();
  try {
    await thief.query("BEGIN");
    await thief.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [jobId]);
    await thief.query("SELECT idemq.rescue()");
    const { rows } = await thief.query<{ id: string; attempt: number }>(
      "SELECT job_id AS id, attempt FROM idemq.claim(worker_id => 'thief', queues => ARRAY['lease'], batch_size => 1)",
    );
    expect(rows).toEqual([{ id: jobId, attempt: 2 }]);
    await thief.query("COMMIT");
  } finally {
    thief.release();
  }
}

async function started(jobId: string): Promise<void> {
  await waitFor(() => w.of("job:start").some((e) => e.jobId === jobId), { what: `job ${jobId} to start` });
}

async function lost(jobId: string): Promise<Record<string, unknown>> {
  return waitFor(() => w.of("job:lease-lost").find((e) => e.jobId === jobId), { what: `job:lease-lost of ${jobId}` });
}

describe("a plain task whose lease is taken over", () => {
  it("sees ctx.signal abort with LeaseLostError; its result is discarded and the job stays the new attempt's", async () => {
    const { jobId } = await client.enqueue("hold", {}, { queue: "lease" });
    await started(jobId);
    await takeOver(jobId);
    const event = await lost(jobId);
    expect(event).toMatchObject({ attempt: 1 });
    expect(aborted.get(jobId)).toBeInstanceOf(LeaseLostError);

    const job = await client.getJob(jobId);
    expect(job).toMatchObject({ state: "processing", attempt: 2, lockedBy: "thief", result: null });
    expect(w.of("job:success").some((e) => e.jobId === jobId)).toBe(false);
    // The fence the worker relies on: attempt 1 can no longer complete the job.
    await expectSqlError(db.pool.query("SELECT idemq.complete(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [jobId]), {
      code: "IQ410",
      detail: { job_id: Number(jobId), attempt: 1, current_state: "processing" },
    });
  });
});

describe("a transactional task whose lease is taken over", () => {
  it("sees ctx.signal abort; complete() in its transaction is refused (IQ410) and its writes roll back", async () => {
    const { jobId } = await client.enqueue("hold_tx", {}, { queue: "lease" });
    await started(jobId);
    // Its write is in the open transaction, invisible to others.
    expect((await db.pool.query("SELECT 1 FROM public.writes WHERE job_id = $1", [jobId])).rowCount).toBe(0);
    await takeOver(jobId);
    const event = await lost(jobId);
    expect(event).toMatchObject({ attempt: 1 });
    expect(String(event.reason)).toMatch(/^complete: lease lost: attempt 1 no longer holds job/);
    expect(aborted.get(jobId)).toBeInstanceOf(LeaseLostError);

    expect((await db.pool.query("SELECT 1 FROM public.writes WHERE job_id = $1", [jobId])).rowCount).toBe(0);
    expect(await client.getJob(jobId)).toMatchObject({ state: "processing", attempt: 2, lockedBy: "thief" });
  });
});
