// Durable steps under faults: a workflow job whose worker process is
// SIGKILLed at every boundary between its steps (after a transactional step,
// inside an external one after its provider took the call, after it, after a sleep, after an event wait), each time
// replaced by a new process. Every transactional step's write happens once,
// the external step reaches its provider under one key (one delivery), and
// the job succeeds with the recorded results.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { killAllWorkers, startedWorker, type WorkerProcess } from "../fixtures/worker/spawn.ts";
import { finishedJob, waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query(`
    CREATE TABLE public.step_writes (job_id bigint NOT NULL, step text NOT NULL);
    CREATE TABLE public.provider (key text PRIMARY KEY, calls int NOT NULL DEFAULT 1);
    CREATE TABLE public.boundaries (name text PRIMARY KEY, attempt int NOT NULL)`);
});
afterEach(async () => {
  await killAllWorkers();
});

// A short lease (heartbeats every 300 ms keep it while the process lives) and a frequent rescue.
const shortLease = { IDEMQ_TEST_LEASE: "1s", IDEMQ_TEST_HEARTBEAT: "300ms", IDEMQ_TEST_RESCUE: "200ms", IDEMQ_TEST_POLL: "200ms" };

describe("a durable workflow, its worker SIGKILLed at every step boundary", () => {
  it("each transactional step writes once, the external step is delivered once, and the job succeeds", async () => {
    const start = () => startedWorker({ tasks: "steps-tasks.ts", databaseUrl: db.url, env: shortLease });
    let worker: WorkerProcess = await start();
    const { jobId } = await client.enqueue("workflow", {});
    for (const boundary of ["after-write", "inside-charge", "after-charge", "after-sleep", "after-wait"]) {
      if (boundary === "after-wait") {
        // The job parks at its wait (no process holds it); the event wakes it.
        await waitFor(
          async () => (await db.pool.query("SELECT 1 FROM idemq.steps($1) WHERE name = 'wait:1' AND status = 'waiting'", [jobId])).rowCount === 1,
          { what: "the job to wait for its event" },
        );
        expect(await client.emitEvent("go", { key: jobId, payload: { go: 1 } })).toBe(1);
      }
      await waitFor(async () => (await db.pool.query("SELECT 1 FROM public.boundaries WHERE name = $1", [boundary])).rowCount === 1, {
        what: `the job to reach ${boundary}`,
      });
      worker.child.kill("SIGKILL");
      expect(await worker.exited).toEqual({ code: null, signal: "SIGKILL" });
      worker = await start();
    }
    const job = await finishedJob(client, jobId);
    expect(job.state).toBe("succeeded");
    const { rows: provider } = await db.pool.query<{ key: string; calls: number }>("SELECT key, calls FROM public.provider");
    // Killed after the provider took the call: the next attempt resent it with the same key (a replay at the
    // provider: one delivery, two calls); killed after the step was recorded: never called again.
    expect(provider).toEqual([{ key: expect.stringMatching(new RegExp(`^idemq-job-${jobId}-step-`)), calls: 2 }]);
    expect(job.result).toEqual({ charge: { chargeId: provider[0]!.key, calls: 2 }, go: { go: 1 } });
    const { rows: writes } = await db.pool.query("SELECT step, count(*)::int AS n FROM public.step_writes WHERE job_id = $1 GROUP BY step ORDER BY step", [jobId]);
    expect(writes).toEqual([
      { step: "final", n: 1 },
      { step: "write", n: 1 },
    ]);
    // Five killed attempts (each errors "lease expired"), none spent by the sleep or the wait.
    expect(job.errors.map((e) => (e as { class: string }).class)).toEqual(Array(5).fill("LeaseExpired"));
    worker.child.kill("SIGTERM");
    expect((await worker.exited).code).toBe(0);
  }, 120_000);
});
