// A time limit per job (issue 26, item 6) through a real worker: past the
// task's `timeout` (or the job's, from enqueue) ctx.signal aborts with a
// TimeoutError naming the job, the attempt and the limit, and the attempt
// fails with it and is retried by the policy, whether the handler heeds the
// signal or ignores it.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client, TimeoutError, type Job } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let w: TestWorker;
/** The handlers that ignore their signal, left waiting: let go at the end. */
const ignored: (() => void)[] = [];
/** What ctx.signal aborted with, by job id. */
const reasons = new Map<string, unknown>();

const untilAborted = (signal: AbortSignal): Promise<never> =>
  new Promise((_resolve, reject) => {
    if (signal.aborted) return reject(signal.reason as Error);
    signal.addEventListener("abort", () => reject(signal.reason as Error), { once: true });
  });

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  w = await startTestWorker(db.url, {
    ignores: {
      timeout: "300ms",
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: async (_p, ctx) => {
        if (ctx.job.attempt === 1) await new Promise<void>((resolve) => ignored.push(resolve)); // never heeds ctx.signal
        return "done";
      },
    },
    honors: {
      timeout: "300ms",
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: async (_p, ctx) => {
        if (ctx.job.attempt === 1) {
          try {
            await untilAborted(ctx.signal);
          } catch (error) {
            reasons.set(ctx.job.id, error);
            throw error;
          }
        }
        return "done";
      },
    },
    untimed: {
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: async (_p, ctx) => {
        if (ctx.job.attempt === 1) await untilAborted(ctx.signal);
        return "done";
      },
    },
  });
});

afterAll(async () => {
  for (const letGo of ignored) letGo();
  await stopWorkers();
});

type ErrorEntry = { attempt: number; class: string; message: string };

async function finished(jobId: string): Promise<Job> {
  return waitFor(
    async () => {
      const job = await client.getJob(jobId);
      return job !== null && job.state === "succeeded" ? job : undefined;
    },
    { what: `job ${jobId} to succeed` },
  );
}

describe("timeout", () => {
  it("a handler that ignores the time limit still gets its attempt failed with a TimeoutError and retried", async () => {
    const { jobId } = await client.enqueue("ignores", {});
    const job = await finished(jobId);
    expect(job).toMatchObject({ attempt: 2, result: "done" });
    const errors = job.errors as ErrorEntry[];
    expect(errors.map((e) => [e.attempt, e.class])).toEqual([[1, "TimeoutError"]]);
    expect(errors[0]!.message).toBe(`job ${jobId} (ignores, attempt 1) ran past its time limit of 300 ms; the attempt fails and is retried by the task's policy`);
    expect(w.of("job:retry").find((e) => e.jobId === jobId)).toMatchObject({ attempt: 1, error: { class: "TimeoutError" } });
    expect(ignored.length).toBeGreaterThanOrEqual(1); // its handler is still waiting: the attempt did not wait for it
  });

  it("a handler that honors ctx.signal sees the TimeoutError as the abort reason", async () => {
    const { jobId } = await client.enqueue("honors", {});
    const job = await finished(jobId);
    expect(job).toMatchObject({ attempt: 2 });
    const reason = reasons.get(jobId);
    expect(reason).toBeInstanceOf(TimeoutError);
    expect(reason).toMatchObject({ jobId, attempt: 1, limitMs: 300 });
    expect((job.errors as ErrorEntry[]).map((e) => e.class)).toEqual(["TimeoutError"]);
  });

  it("a job's own timeout (enqueue) limits a task without one", async () => {
    const { jobId } = await client.enqueue("untimed", {}, { timeout: "250ms" });
    const job = await finished(jobId);
    expect(job).toMatchObject({ attempt: 2 });
    const errors = job.errors as ErrorEntry[];
    expect(errors.map((e) => e.class)).toEqual(["TimeoutError"]);
    expect(errors[0]!.message).toContain("time limit of 250 ms");
    const many = await client.enqueueMany([{ task: "untimed", payload: {}, timeout: "250ms" }]);
    const again = await finished(many[0]!.jobId!);
    expect((again.errors as ErrorEntry[]).map((e) => e.class)).toEqual(["TimeoutError"]);
  });
});
