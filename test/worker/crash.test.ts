// Crash mid-job: a worker process is SIGKILLed while its handler runs.
// Nothing hands the job back but the lease: once it runs out, rescue() (run
// by the other worker) returns the job, the other worker claims it with
// ctx.job.reclaimed = true and completes it, and the job's errors record
// "lease expired" for the killed attempt.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { killAllWorkers, startedWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query(
    "CREATE TABLE public.runs (job_id bigint NOT NULL, attempt int NOT NULL, reclaimed boolean NOT NULL, worker_pid int NOT NULL)",
  );
});
afterEach(async () => {
  await killAllWorkers();
});

// A short lease (heartbeats every 300 ms keep it while the process lives) and a frequent rescue.
const shortLease = { IDEMQ_TEST_LEASE: "1s", IDEMQ_TEST_HEARTBEAT: "300ms", IDEMQ_TEST_RESCUE: "200ms" };

describe("a worker killed mid-job", () => {
  it("another worker rescues the job after the lease, runs it with ctx.job.reclaimed, completes it; errors show lease expired", async () => {
    const first = await startedWorker({ tasks: "crash-tasks.ts", databaseUrl: db.url, env: shortLease });
    const { jobId } = await client.enqueue("slow", {});
    await waitFor(
      async () => (await db.pool.query("SELECT 1 FROM public.runs WHERE job_id = $1", [jobId])).rowCount === 1,
      { what: "the first attempt's handler to start" },
    );
    first.child.kill("SIGKILL");
    expect(await first.exited).toEqual({ code: null, signal: "SIGKILL" });
    // The killed worker still holds the job until its lease runs out.
    const held = await client.getJob(jobId);
    expect(held).toMatchObject({ state: "processing", attempt: 1 });

    const second = await startedWorker({ tasks: "crash-tasks.ts", databaseUrl: db.url, env: shortLease });
    const job = await waitFor(
      async () => {
        const j = await client.getJob(jobId);
        return j?.state === "succeeded" ? j : undefined;
      },
      { what: "the job to succeed on the second worker" },
    );
    expect(job.attempt).toBe(2);
    expect(job.result).toEqual({ finishedBy: second.pid });

    const { rows: runs } = await db.pool.query<{ attempt: number; reclaimed: boolean; worker_pid: number }>(
      "SELECT attempt, reclaimed, worker_pid FROM public.runs WHERE job_id = $1 ORDER BY attempt",
      [jobId],
    );
    expect(runs).toEqual([
      { attempt: 1, reclaimed: false, worker_pid: first.pid },
      { attempt: 2, reclaimed: true, worker_pid: second.pid },
    ]);
    expect(job.errors).toHaveLength(1);
    expect(job.errors[0]).toMatchObject({ attempt: 1, class: "LeaseExpired" });
    expect((job.errors[0] as { message: string }).message).toContain("lease expired");
    expect((job.errors[0] as { worker: string }).worker).toContain(`:${first.pid}:`);

    const start = await second.waitForEvent((e) => e.event === "job:start" && e.jobId === jobId, "job:start");
    expect(start).toMatchObject({ attempt: 2, reclaimed: true });
    second.child.kill("SIGTERM");
    expect((await second.exited).code).toBe(0);
  });
});
