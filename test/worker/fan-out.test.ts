// Fan-out, fan-in, batches and results with real workers: ctx.spawn parks
// the parent without holding its slot (a worker of concurrency 1 runs the
// children meanwhile) or spending its attempt, and the parent's rerun gets
// the children's results; failFast fails the parent at the first child that
// did not succeed; Client.enqueueBatch's callback runs once with the
// outcomes; Client.result waits for a job a worker in another process
// finishes (LISTEN), or polls, and rejects clearly.
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { ChildFailedError, Client, JobNotFoundError, JobNotSucceededError, PermanentError, RESULT_BYTES, ResultTimeoutError } from "../../src/index.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { killAllWorkers, startedWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { jobRow, makeJob, stateOf, unique } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 4 });
const clients: Client[] = [];

function client(options: { listenConnectionString?: string } = {}): Client {
  const c = new Client({ connectionString: db.url, ...options });
  clients.push(c);
  return c;
}

afterEach(async () => {
  await stopWorkers();
  await killAllWorkers();
  await Promise.all(clients.splice(0).map((c) => c.close()));
});

afterAll(async () => {
  await db.drop();
});

describe("ctx.spawn", () => {
  it("parks the parent without holding its slot or spending its attempt; its rerun returns the children's results", async () => {
    const queue = unique("fan");
    const runs: number[] = [];
    const w = await startTestWorker(
      db.url,
      {
        double: async (payload: { n: number }) => payload.n * 2,
        total: async (payload: { numbers: number[] }, ctx) => {
          runs.push(ctx.job.attempt);
          const children = await ctx.spawn(payload.numbers.map((n) => ({ name: `n${n}`, task: "double", queue, payload: { n } })));
          expect((await ctx.children()).map((c) => c.name)).toEqual(children.map((c) => c.name));
          return children.reduce((sum, c) => sum + (c.result as number), 0);
        },
      },
      // One slot: the children can only run while the parent does not hold it.
      { queues: [queue], concurrency: 1 },
    );
    const id = await makeJob(db.pool, { task: "total", queue, payload: { numbers: [1, 2, 3] } });
    const result = await client().result(id, { timeout: "30s" });
    expect(result).toBe(12);
    expect(runs).toEqual([1, 2]);
    const row = await jobRow(db.pool, id);
    expect(row.attempt - row.uncounted).toBe(1); // the parked attempt was not counted
    expect(w.of("job:snoozed")).toEqual([expect.objectContaining({ jobId: id, delay: "children", children: 3 })]);
    expect(w.of("job:success").filter((e) => e.task === "double")).toHaveLength(3);
  });

  it("children that finished before the park (wait_for_children says false): the job runs again at once, attempt not spent", async () => {
    const queue = unique("fan");
    const runs: number[] = [];
    const w = await startTestWorker(
      db.url,
      {
        quick: async () => "quick",
        parent: async (_payload, ctx) => {
          runs.push(ctx.job.attempt);
          try {
            return (await ctx.spawn([{ name: "a", task: "quick", queue }])).map((c) => c.result);
          } catch (error) {
            // Hold the attempt until the child has finished: the park then finds nothing to wait for.
            await waitFor(async () => (await ctx.children())[0]?.state === "succeeded", { what: "the child done" });
            throw error;
          }
        },
      },
      { queues: [queue], concurrency: 2 },
    );
    const id = await makeJob(db.pool, { task: "parent", queue });
    expect(await client().result(id, { timeout: "30s" })).toEqual(["quick"]);
    expect(runs).toEqual([1, 2]);
    const row = await jobRow(db.pool, id);
    expect(row.attempt - row.uncounted).toBe(1);
    expect(w.of("job:snoozed")).toEqual([expect.objectContaining({ jobId: id, delay: "0" })]);
  });

  it("failFast: the first child that does not succeed releases the parent, whose ctx.spawn throws ChildFailedError (permanent)", async () => {
    const queue = unique("fan");
    const w = await startTestWorker(
      db.url,
      {
        ok: async () => "fine",
        broken: async () => {
          throw new PermanentError("no such file");
        },
        parent: async (_payload, ctx) => {
          await ctx.spawn(
            [
              { name: "a", task: "ok", queue },
              { name: "b", task: "broken", queue },
            ],
            { failFast: true },
          );
          return "unreachable";
        },
      },
      { queues: [queue], concurrency: 1 },
    );
    const id = await makeJob(db.pool, { task: "parent", queue });
    const error = await client()
      .result(id, { timeout: "30s" })
      .then(() => undefined, (e: unknown) => e);
    expect(error).toBeInstanceOf(JobNotSucceededError);
    expect(error).toMatchObject({ jobId: id, state: "failed", lastError: { class: "ChildFailedError" } });
    expect(String((error as JobNotSucceededError).lastError?.message)).toMatch(/child "b" \(job \d+\) of job \d+ failed \(PermanentError: no such file\)/);
    // The worker emits job:failed once its fail() call has returned; the
    // result's NOTIFY can reach the client first, so the event is awaited.
    const failed = await waitFor(() => w.of("job:failed").find((e) => e.jobId === id), { what: "the parent's job:failed event" });
    expect(failed).toMatchObject({ permanent: true });
    expect(ChildFailedError.prototype).toBeInstanceOf(PermanentError);
  });
});

describe("Client.enqueueBatch", () => {
  it("runs the callback once, after every job of the batch finished, with their outcomes", async () => {
    const queue = unique("batch");
    const seen: unknown[] = [];
    await startTestWorker(
      db.url,
      {
        part: async (payload: { i: number }) => {
          if (payload.i === 2) throw new PermanentError("bad part");
          return payload.i;
        },
        report: async (_payload, ctx) => {
          const outcomes = await ctx.children();
          seen.push(outcomes.map((c) => [c.name, c.state, c.result]));
          return outcomes.length;
        },
      },
      { queues: [queue], concurrency: 2 },
    );
    const c = client();
    const { callback, jobs } = await c.enqueueBatch(
      [1, 2, 3].map((i) => ({ task: "part", queue, payload: { i } })),
      { task: "report", queue, idempotencyKey: unique("batch") },
    );
    expect(jobs.map((j) => j.outcome)).toEqual(["created", "created", "created"]);
    expect(await c.result(callback.jobId!, { timeout: "30s" })).toBe(3);
    expect(seen).toEqual([
      [
        ["1", "succeeded", 1],
        ["2", "failed", null],
        ["3", "succeeded", 3],
      ],
    ]);
  });
});

describe("Client.result", () => {
  it("waits, without polling, for a job that a worker in another process finishes (a spawning parent included)", async () => {
    const c = client();
    const id = await makeJob(db.pool, { task: "sum", payload: { numbers: [2, 3, 4] } });
    // Waiting before any worker exists: only the NOTIFY can end it.
    const waiting = c.result(id, { timeout: "60s" });
    await waitFor(async () => (await db.pool.query("SELECT result_watched FROM idemq.jobs WHERE id = $1", [id])).rows[0]?.result_watched, {
      what: "the wait's mark",
    });
    await startedWorker({ tasks: "fan-out-tasks.ts", databaseUrl: db.url, env: { IDEMQ_TEST_POLL: "60s" } });
    expect(await waiting).toEqual({ sum: 29, runs: 2 });
  });

  it("a return value over RESULT_BYTES: the job succeeds without a result (the work is done), with a warn line naming the size and the limit", async () => {
    const task = unique("big_result");
    const { worker } = await startTestWorker(db.url, {
      [task]: async () => ({ blob: "x".repeat(RESULT_BYTES) }),
    });
    const warnings: { message: string; jobId?: string }[] = [];
    worker.on("log", (entry) => entry.level === "warn" && warnings.push(entry));
    const id = await makeJob(db.pool, { task });
    await waitFor(async () => (await stateOf(db.pool, id)) === "succeeded", { what: "the job with the big result succeeding" });
    expect(await jobRow(db.pool, id)).toMatchObject({ state: "succeeded", result: null, attempt: 1 });
    expect(warnings).toEqual([
      expect.objectContaining({
        jobId: id,
        message: expect.stringContaining(`is ${RESULT_BYTES + 11} bytes of JSON, over the limit of ${RESULT_BYTES}; the job completes without a result`),
      }),
    ]);
  });

  it("rejects with ResultTimeoutError (the job goes on), JobNotFoundError, and JobNotSucceededError with the latest error", async () => {
    const c = client();
    const id = await makeJob(db.pool, { task: "nobody", queue: unique("q") });
    await expect(c.result(id, { timeout: "200ms" })).rejects.toMatchObject({ name: "ResultTimeoutError", jobId: id, state: "enqueued" });
    await expect(c.result(id, { timeout: 10 })).rejects.toBeInstanceOf(ResultTimeoutError);
    expect(await stateOf(db.pool, id)).toBe("enqueued");
    await expect(c.result("987654321")).rejects.toBeInstanceOf(JobNotFoundError);
    const waiting = c.result(id, { timeout: "30s" }).catch((e: unknown) => e);
    await waitFor(async () => (await db.pool.query("SELECT result_watched FROM idemq.jobs WHERE id = $1", [id])).rows[0]?.result_watched, {
      what: "the wait's mark",
    });
    await c.cancel(id);
    expect(await waiting).toMatchObject({ name: "JobNotSucceededError", state: "cancelled", lastError: null }); // cancelled before it ran: no error entry
  });

  it("pollInterval: polls job_result instead of LISTENing (a transaction pooler's way), same answers", async () => {
    const c = client({ listenConnectionString: "postgres://nobody@127.0.0.1:1/nowhere" });
    const queue = unique("poll");
    await startTestWorker(db.url, { echo: async (payload: { v: string }) => payload.v }, { queues: [queue] });
    const id = await makeJob(db.pool, { task: "echo", queue, payload: { v: "polled" } });
    // The listen connection string leads nowhere: only polling can answer.
    expect(await c.result(id, { timeout: "30s", pollInterval: "50ms" })).toBe("polled");
    const { rows } = await db.pool.query("SELECT result_watched FROM idemq.jobs WHERE id = $1", [id]);
    expect(rows).toEqual([{ result_watched: false }]);
  });
});
