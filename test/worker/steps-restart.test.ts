// Durable steps across a server crash: on a private cluster, a workflow job
// (test/fixtures/worker/steps-tasks.ts, every boundary passed) records its
// steps, sleeps and parks at its event wait; the server is crashed
// (-m immediate) and started again; the ledger, the parked job and the wait
// are rows, so an emit after the restart wakes it, the worker process rides
// through the outage, and the job succeeds with each write once and one
// provider call.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { killAllWorkers, startedWorker } from "../fixtures/worker/spawn.ts";
import { finishedJob, waitFor } from "../fixtures/worker/wait.ts";
import { type PrivateCluster, startMigratedCluster } from "../helpers/private-cluster.ts";

let cluster: PrivateCluster;
let url: string;
let client: Client;

beforeAll(async () => {
  ({ cluster, url } = await startMigratedCluster());
  client = new Client({ connectionString: url, onError: () => {} });
  await client.pool.query(`
    CREATE TABLE public.step_writes (job_id bigint NOT NULL, step text NOT NULL);
    CREATE TABLE public.provider (key text PRIMARY KEY, calls int NOT NULL DEFAULT 1);
    CREATE TABLE public.boundaries (name text PRIMARY KEY, attempt int NOT NULL);
    -- Every boundary passed already: the fixture never hangs here.
    INSERT INTO public.boundaries (name, attempt)
    SELECT b, 0 FROM unnest(ARRAY['after-write', 'inside-charge', 'after-charge', 'after-sleep', 'after-wait']) b`);
}, 120_000);

afterAll(async () => {
  await killAllWorkers();
  await client?.close().catch(() => {});
  await cluster?.destroy();
});

describe("durable steps across a server crash", () => {
  it("a job parked at its wait when the server crashed is woken by an emit after the restart and succeeds, each step once", async () => {
    const worker = await startedWorker({
      tasks: "steps-tasks.ts",
      databaseUrl: url,
      env: { IDEMQ_TEST_LEASE: "3s", IDEMQ_TEST_HEARTBEAT: "500ms", IDEMQ_TEST_RESCUE: "500ms", IDEMQ_TEST_POLL: "500ms" },
    });
    const { jobId } = await client.enqueue("workflow", {});
    await waitFor(
      async () => (await client.pool.query("SELECT 1 FROM idemq.steps($1) WHERE name = 'wait:1' AND status = 'waiting'", [jobId])).rowCount === 1,
      { what: "the job to wait for its event" },
    );
    await cluster.stop("immediate");
    await cluster.start();
    const woken = await waitFor(
      async () => {
        try {
          return { n: await client.emitEvent("go", { key: jobId, payload: { after: "restart" } }) }; // once: any answer ends the wait
        } catch {
          return undefined; // the server is not answering yet
        }
      },
      { what: "the server to answer and the emit to commit", timeoutMs: 30_000 },
    );
    expect(woken).toEqual({ n: 1 });
    const job = await finishedJob(client, jobId);
    expect(job).toMatchObject({ state: "succeeded", errors: [] });
    expect((job.result as { go: unknown }).go).toEqual({ after: "restart" });
    const { rows: writes } = await client.pool.query("SELECT step, count(*)::int AS n FROM public.step_writes GROUP BY step ORDER BY step");
    expect(writes).toEqual([
      { step: "final", n: 1 },
      { step: "write", n: 1 },
    ]);
    expect((await client.pool.query("SELECT calls FROM public.provider")).rows).toEqual([{ calls: 1 }]);
    expect(worker.child.exitCode).toBeNull(); // rode through the outage
    worker.child.kill("SIGTERM");
    expect((await worker.exited).code).toBe(0);
  }, 120_000);
});
