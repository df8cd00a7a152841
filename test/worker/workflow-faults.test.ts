// The whole durable workflow under faults (issue 28 item 7), with real
// processes on a private cluster: a job (test/fixtures/worker/workflow-tasks.ts)
// with a transactional step, an external step (a fake provider that honours
// the idempotency key), a sleep, ten children whose results feed a
// transactional step, an event wait and a last transactional step. Its
// worker process is SIGKILLed at every boundary, each time replaced by a new
// one: after each step, inside the external step once the provider took the
// call, right after the spawn (children enqueued, the job not yet parked),
// while the children run, after the last child finished but before the job
// resumed, after it resumed; and the server crashes and restarts while the
// job is parked on its children and again while it is parked on its event.
// Every transactional step writes once, each child writes once and succeeds,
// the provider delivers once (two calls under one key), and the job succeeds
// with the recorded results.
//
// Pauses (idemq.pause, by task) hold the children back until the job has
// been killed after its spawn, and hold the released job back until the
// worker has been killed after the last child finished, so that each kill
// lands where it is meant to.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { startFakeProvider, type FakeProvider } from "../fixtures/worker/fake-email-provider.ts";
import { killAllWorkers, startedWorker, type WorkerProcess } from "../fixtures/worker/spawn.ts";
import { finishedJob, waitFor } from "../fixtures/worker/wait.ts";
import { PARTS } from "../fixtures/worker/workflow-tasks.ts";
import { type PrivateCluster, startMigratedCluster } from "../helpers/private-cluster.ts";

let cluster: PrivateCluster;
let url: string;
let client: Client;
let provider: FakeProvider;

beforeAll(async () => {
  ({ cluster, url } = await startMigratedCluster());
  client = new Client({ connectionString: url, onError: () => {} });
  await client.pool.query(`
    CREATE TABLE public.step_writes (job_id bigint NOT NULL, step text NOT NULL);
    CREATE TABLE public.boundaries (name text PRIMARY KEY, attempt int NOT NULL)`);
  provider = await startFakeProvider();
}, 120_000);

afterAll(async () => {
  await killAllWorkers();
  await client?.close().catch(() => {});
  await cluster?.destroy();
  await provider?.close();
});

// A short lease (heartbeats every 300 ms keep it while the process lives) and a frequent rescue, as steps-faults.
const shortLease = { IDEMQ_TEST_LEASE: "1s", IDEMQ_TEST_HEARTBEAT: "300ms", IDEMQ_TEST_RESCUE: "200ms", IDEMQ_TEST_POLL: "200ms" };

/** Runs `fn` until the server answers it (right after a restart the pool's old connections fail first). */
function whenAnswered<T>(what: string, fn: () => Promise<T>): Promise<{ value: T }> {
  return waitFor(
    async () => {
      try {
        return { value: await fn() };
      } catch {
        return undefined;
      }
    },
    { what, timeoutMs: 30_000 },
  );
}

async function crashAndRestart(): Promise<void> {
  await cluster.stop("immediate");
  await cluster.start();
}

describe("a workflow with ten children, its worker SIGKILLed at every boundary and the server restarted while it waits", () => {
  it("each transactional step and each child writes once, the external step is delivered once, and the job succeeds", async () => {
    const start = () => startedWorker({ tasks: "workflow-tasks.ts", databaseUrl: url, env: { ...shortLease, IDEMQ_TEST_PROVIDER_URL: provider.url } });
    const query = async (text: string, values: unknown[] = []) => (await client.pool.query(text, values)).rows;
    const reached = (name: string) =>
      waitFor(async () => (await query("SELECT 1 FROM public.boundaries WHERE name = $1", [name])).length === 1, {
        what: `the workflow to reach ${name}`,
      });
    let worker: WorkerProcess;
    const replaceWorker = async () => {
      worker.child.kill("SIGKILL");
      expect(await worker.exited).toEqual({ code: null, signal: "SIGKILL" });
      worker = await start();
    };
    const parentState = async () => (await client.getJob(jobId))?.state;

    expect(await client.pause({ task: "part" })).toBe(true); // the children wait until the job has been killed after its spawn
    worker = await start();
    const { jobId } = await client.enqueue("workflow", {});
    for (const boundary of ["after-write", "inside-charge", "after-charge", "after-sleep", "after-spawn"]) {
      await reached(boundary);
      await replaceWorker();
    }
    // Rescued, the job replays its recorded steps, finds its children (spawned once, none run) and parks on them.
    await waitFor(async () => (await parentState()) === "awaiting", { what: "the job to park on its children" });
    const spawned = await client.children(jobId);
    expect(spawned.map((c) => [c.name, c.state])).toEqual(Array.from({ length: PARTS }, (_, i) => [`part-${i + 1}`, "enqueued"]));

    await crashAndRestart(); // parked on its children
    // The last child to finish releases the job; the pause keeps it from resuming until the worker has been killed.
    expect(await whenAnswered("the server to answer the pause", () => client.pause({ task: "workflow" }))).toEqual({ value: true });
    expect(await client.resume({ task: "part" })).toBe(true);
    await reached("child-running"); // a child hangs after its write, its siblings run beside it
    await replaceWorker();
    const finished = await waitFor(
      async () => {
        const children = await client.children(jobId);
        return children.every((c) => c.state === "succeeded") && (await parentState()) === "enqueued" ? children : undefined;
      },
      { what: "every child to succeed and release the job" },
    );
    expect(finished).toHaveLength(PARTS);
    await replaceWorker(); // after the last child finished, before the job resumed
    expect(await client.resume({ task: "workflow" })).toBe(true);
    for (const boundary of ["after-children", "after-sum"]) {
      await reached(boundary);
      await replaceWorker();
    }
    await waitFor(async () => (await query("SELECT 1 FROM idemq.steps($1) WHERE name = 'wait:1' AND status = 'waiting'", [jobId])).length === 1, {
      what: "the job to park on its event",
    });

    await crashAndRestart(); // parked on its event
    expect(await whenAnswered("the server to answer the emit", () => client.emitEvent("go", { key: jobId, payload: { go: 1 } }))).toEqual({ value: 1 });
    await reached("after-wait");
    expect(worker.child.exitCode).toBeNull(); // it rode through the restart and took the woken job
    await replaceWorker();

    const job = await finishedJob(client, jobId);
    expect(job.state).toBe("succeeded");
    // Killed after the provider took the call, the next attempt resent it under the same key: one delivery, two calls.
    expect(provider.deliveries).toBe(1);
    expect(provider.keys).toEqual([expect.stringMatching(new RegExp(`^idemq-job-${jobId}-step-`)), provider.keys[0]]);
    const squares = Array.from({ length: PARTS }, (_, i) => (i + 1) ** 2);
    expect(job.result).toEqual({
      charge: { messageId: `msg-1-job-${jobId}` },
      sum: squares.reduce((a, b) => a + b, 0),
      go: { go: 1 },
    });
    // The ledger: each step recorded once (by name), every one over.
    expect((await query("SELECT name, kind, status, over FROM idemq.steps($1)", [jobId])).map((s) => `${s.kind} ${s.name} ${s.status} ${s.over}`)).toEqual([
      "step write done true",
      "step charge done true",
      "sleep sleep:1 sleeping true",
      "step sum done true",
      "wait wait:1 received true",
      "step final done true",
    ]);
    expect(await query("SELECT step, count(*)::int AS n FROM public.step_writes WHERE job_id = $1 GROUP BY step ORDER BY step", [jobId])).toEqual([
      { step: "final", n: 1 },
      { step: "sum", n: 1 },
      { step: "write", n: 1 },
    ]);
    // Eight killed attempts held the job (each errors "lease expired"); the sleep, the park on the children and the
    // wait spent none.
    expect(job.errors.map((e) => (e as { class: string }).class)).toEqual(Array(8).fill("LeaseExpired"));

    const children = await client.children(jobId);
    expect(children).toEqual(
      squares.map((square, i) => ({ name: `part-${i + 1}`, jobId: spawned[i]!.jobId, state: "succeeded", result: { square }, lastError: null })),
    );
    const partWrites = await query("SELECT job_id::text AS id, count(*)::int AS n FROM public.step_writes WHERE step = 'part' GROUP BY job_id ORDER BY job_id");
    expect(partWrites).toEqual(spawned.map((c) => ({ id: c.jobId, n: 1 })).sort((a, b) => Number(a.id) - Number(b.id)));
    // The child killed at child-running (and any sibling running beside it) was rescued; no child failed otherwise.
    const childErrors = (await Promise.all(spawned.map((c) => client.getJob(c.jobId)))).flatMap((j) => j!.errors.map((e) => (e as { class: string }).class));
    expect(childErrors.length).toBeGreaterThanOrEqual(1);
    expect(new Set(childErrors)).toEqual(new Set(["LeaseExpired"]));

    worker.child.kill("SIGTERM");
    expect((await worker.exited).code).toBe(0);
  }, 180_000);
});
