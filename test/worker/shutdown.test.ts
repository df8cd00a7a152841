// Graceful shutdown of `idemq worker` processes. SIGTERM: stop claiming,
// give the buffer's unstarted jobs back at once, let the running job finish,
// exit 0. A handler that ignores the signal is handed back after
// shutdownTimeout (fail, retryable, so the attempt is on record), its
// transaction rolled back, and the process still exits.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, type Job } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { killAllWorkers, startedWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query(`
    CREATE TABLE public.runs (job_id bigint NOT NULL, attempt int NOT NULL);
    CREATE TABLE public.releases (job_id bigint NOT NULL);
    CREATE TABLE public.tx_writes (job_id bigint NOT NULL);`);
});
afterEach(async () => {
  await killAllWorkers();
});

async function runsOf(jobId: string): Promise<number> {
  return (await db.pool.query("SELECT 1 FROM public.runs WHERE job_id = $1", [jobId])).rowCount ?? 0;
}

async function jobWhen(jobId: string, ok: (job: Job) => boolean, what: string): Promise<Job> {
  return waitFor(
    async () => {
      const job = await client.getJob(jobId);
      return job !== null && ok(job) ? job : undefined;
    },
    { what },
  );
}

describe("SIGTERM while a job runs", () => {
  it("stops claiming, releases the buffered job at once, lets the running job finish, and exits 0", async () => {
    const worker = await startedWorker({
      tasks: "shutdown-tasks.ts",
      databaseUrl: db.url,
      args: ["--concurrency", "1", "--queues", "drain"],
      env: { IDEMQ_TEST_PREFETCH: "1" },
    });
    const running = await client.enqueue("wait_for_release", {}, { queue: "drain" });
    const buffered = await client.enqueue("wait_for_release", {}, { queue: "drain" });
    await waitFor(async () => (await runsOf(running.jobId)) === 1, { what: "the first job to start" });
    // The second is claimed into the buffer (one slot, one prefetched job).
    await jobWhen(buffered.jobId, (j) => j.state === "processing", "the second job to be claimed into the buffer");

    worker.child.kill("SIGTERM");
    await worker.waitForEvent((e) => e.event === "log" && String(e.message).startsWith("SIGTERM: stopping"), "the SIGTERM notice");
    // Back at once, without spending an attempt or recording an error, while the first job still runs.
    const released = await jobWhen(buffered.jobId, (j) => j.state === "scheduled", "the buffered job to be released");
    expect(released).toMatchObject({ attempt: 1, lockedBy: null, errors: [] });
    expect(await client.getJob(running.jobId)).toMatchObject({ state: "processing" });

    const late = await client.enqueue("wait_for_release", {}, { queue: "drain" });
    await db.pool.query("INSERT INTO public.releases (job_id) VALUES ($1)", [running.jobId]);
    expect(await worker.exited).toEqual({ code: 0, signal: null });

    expect(await client.getJob(running.jobId)).toMatchObject({ state: "succeeded", attempt: 1, result: { released: true } });
    expect(await runsOf(buffered.jobId)).toBe(0);
    expect(await runsOf(late.jobId)).toBe(0);
    expect(await client.getJob(late.jobId)).toMatchObject({ state: "enqueued", attempt: 0 });
    expect(worker.count("job:success")).toBe(1);
    expect(worker.count("worker:stopped")).toBe(1);
  });
});

describe("SIGTERM with handlers that ignore the signal", () => {
  it("hands the jobs back after shutdownTimeout (fail, not counted: runnable at once, no attempt spent), rolls back the transactional one, and exits 0", async () => {
    const worker = await startedWorker({
      tasks: "shutdown-tasks.ts",
      databaseUrl: db.url,
      args: ["--concurrency", "2", "--queues", "handback"],
      env: { IDEMQ_TEST_SHUTDOWN_TIMEOUT: "500ms" },
    });
    // One attempt each: a hand-back that spent it would fail the jobs for good.
    const plain = await client.enqueue("wait_for_release", {}, { queue: "handback", maxAttempts: 1 });
    const tx = await client.enqueue("tx_wait_for_release", {}, { queue: "handback", maxAttempts: 1 });
    await waitFor(async () => (await runsOf(plain.jobId)) + (await runsOf(tx.jobId)) === 2, { what: "both jobs to start" });

    const signalledAt = Date.now();
    worker.child.kill("SIGTERM");
    expect(await worker.exited).toEqual({ code: 0, signal: null });
    expect(Date.now() - signalledAt).toBeGreaterThanOrEqual(500);

    for (const { jobId } of [plain, tx]) {
      const job = await client.getJob(jobId);
      expect(job).toMatchObject({ state: "scheduled", attempt: 1, lockedBy: null });
      expect(job!.errors).toHaveLength(1);
      expect(job!.errors[0]).toMatchObject({ attempt: 1, class: "WorkerShutdownError" });
      expect((job!.errors[0] as { message: string }).message).toContain("shutdownTimeout (500 ms)");
      // Not spent, and no backoff to wait out.
      const { rows } = await db.pool.query("SELECT uncounted, run_at <= now() AS due FROM idemq.jobs WHERE id = $1", [jobId]);
      expect(rows).toEqual([{ uncounted: 1, due: true }]);
    }
    // The transactional handler's write went with its transaction.
    expect((await db.pool.query("SELECT 1 FROM public.tx_writes")).rowCount).toBe(0);
    const retries = worker.events.filter((e) => e.event === "job:retry");
    expect(retries.map((e) => e.jobId).sort()).toEqual([plain.jobId, tx.jobId].sort());
    expect(retries.every((e) => (e.error as { class: string }).class === "WorkerShutdownError")).toBe(true);
  });
});

describe("a second signal", () => {
  it("exits at once (128 + signal number), leaving the running job to its lease", async () => {
    const worker = await startedWorker({ tasks: "shutdown-tasks.ts", databaseUrl: db.url, args: ["--queues", "impatient"] });
    const { jobId } = await client.enqueue("wait_for_release", {}, { queue: "impatient" });
    await waitFor(async () => (await runsOf(jobId)) === 1, { what: "the job to start" });
    worker.child.kill("SIGTERM");
    await worker.waitForEvent((e) => e.event === "log" && String(e.message).startsWith("SIGTERM: stopping"), "the SIGTERM notice");
    worker.child.kill("SIGINT");
    expect(await worker.exited).toEqual({ code: 130, signal: null });
    expect(worker.count("worker:stopped")).toBe(0);
    // Not handed back: rescue() will, once the lease runs out.
    expect(await client.getJob(jobId)).toMatchObject({ state: "processing", attempt: 1 });
  });
});
