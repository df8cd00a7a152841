// Retries decided per task: a fixed backoff computed by the worker (retry_at
// passed to fail()), PermanentError / exceptOn / onlyOn failing at once, the
// task's maxAttempts, snooze not spending an attempt, and every failed
// attempt's error (class, message, stack) kept on the job.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, PermanentError, type Job } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

class FlakyError extends Error {}
class ValidationError extends Error {}
class TransientError extends Error {}

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let w: TestWorker;
/** When the flaky handler threw, by attempt. */
const thrownAt = new Map<number, number>();

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  w = await startTestWorker(db.url, {
    flaky: {
      backoff: { kind: "fixed", delays: ["100ms", "200ms"] },
      run: async (_p, ctx) => {
        if (ctx.job.attempt < 3) {
          thrownAt.set(ctx.job.attempt, Date.now());
          throw new FlakyError(`attempt ${ctx.job.attempt} failed`);
        }
        return { attempt: ctx.job.attempt };
      },
    },
    permanent: async () => {
      throw new PermanentError("card declined for good");
    },
    validated: {
      exceptOn: [ValidationError],
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: async () => {
        throw new ValidationError("no such address");
      },
    },
    only_transient: {
      onlyOn: [TransientError],
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: async (p: { transient: boolean }, ctx) => {
        if (p.transient && ctx.job.attempt === 1) throw new TransientError("try again");
        if (!p.transient) throw new TypeError("a bug, not worth retrying");
        return "ok";
      },
    },
    capped: {
      maxAttempts: 2,
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: async () => {
        throw new Error("always fails");
      },
    },
    snooze_capped: {
      maxAttempts: 2,
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: async (_p, ctx) => {
        if (ctx.job.attempt === 1) ctx.snooze("50ms");
        throw new Error(`counted failure at attempt ${ctx.job.attempt}`);
      },
    },
    snoozer: {
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: async (_p, ctx) => {
        if (ctx.job.attempt === 1) ctx.snooze("100ms");
        if (ctx.job.attempt === 2) throw new Error("the first counted failure");
        return { attempt: ctx.job.attempt };
      },
    },
  });
});
afterEach(() => {
  expect(w.of("worker:error")).toEqual([]);
});
afterAll(async () => {
  await stopWorkers();
});

async function finished(jobId: string): Promise<Job> {
  return waitFor(
    async () => {
      const job = await client.getJob(jobId);
      return job?.state === "succeeded" || job?.state === "failed" ? job : undefined;
    },
    { what: `job ${jobId} to finish` },
  );
}

type ErrorEntry = { attempt: number; class: string; message: string; stack?: string; failed_at: string };
const entries = (job: Job) => job.errors as ErrorEntry[];

describe("fixed backoff", () => {
  it("succeeds on the third attempt; both earlier errors are kept with class, message and stack; retry_at follows the delays", async () => {
    const { jobId } = await client.enqueue("flaky", {});
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "succeeded", attempt: 3, result: { attempt: 3 } });
    const errors = entries(job);
    expect(errors.map((e) => [e.attempt, e.class, e.message])).toEqual([
      [1, "FlakyError", "attempt 1 failed"],
      [2, "FlakyError", "attempt 2 failed"],
    ]);
    // The class is the constructor's name even where the error's `name` is the inherited "Error".
    expect(errors.every((e) => e.stack?.includes(`Error: ${e.message}`) && e.stack.includes("worker/retries.test.ts"))).toBe(true);

    const retries = w.of("job:retry").filter((e) => e.jobId === jobId);
    expect(retries.map((e) => e.attempt)).toEqual([1, 2]);
    // retryAt is the run_at fail() chose: exactly that failure's failed_at (the
    // database clock) + that attempt's delay (100 ms, then 200 ms), never
    // sooner than the handler's throw + the delay ...
    const gaps = retries.map((e) => (e.retryAt as Date).getTime() - thrownAt.get(e.attempt as number)!);
    // (The gap beyond the delay is the throw-to-fail() latency: a few ms, more on a loaded machine.)
    expect(gaps[0]).toBeGreaterThanOrEqual(100);
    expect(gaps[0]).toBeLessThan(100 + 1000);
    expect(gaps[1]).toBeGreaterThanOrEqual(200);
    expect(gaps[1]).toBeLessThan(200 + 1000);
    expect(retries.map((e, i) => (e.retryAt as Date).getTime() - new Date(errors[i]!.failed_at).getTime())).toEqual([100, 200]);
    // ... and the job's run_at is the second failure's failed_at + 200 ms.
    const secondFailedAt = new Date(errors[1]!.failed_at as string).getTime();
    expect(job.runAt!.getTime() - secondFailedAt).toBe(200);
    expect(w.of("job:success").filter((e) => e.jobId === jobId)).toHaveLength(1);
  });
});

describe("errors that skip retries", () => {
  it("PermanentError fails the job at once, whatever attempts remain", async () => {
    const { jobId } = await client.enqueue("permanent", {}, { maxAttempts: 5 });
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "failed", attempt: 1 });
    expect(entries(job).map((e) => [e.class, e.message])).toEqual([["PermanentError", "card declined for good"]]);
    expect(w.of("job:failed").find((e) => e.jobId === jobId)).toMatchObject({ attempt: 1, permanent: true });
  });

  it("an error of an exceptOn class fails the job at once", async () => {
    const { jobId } = await client.enqueue("validated", {}, { maxAttempts: 5 });
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "failed", attempt: 1 });
    expect(entries(job).map((e) => e.class)).toEqual(["ValidationError"]);
  });

  it("with onlyOn, an error of another class fails at once and an onlyOn class is retried", async () => {
    const bug = await client.enqueue("only_transient", { transient: false }, { maxAttempts: 5 });
    const transient = await client.enqueue("only_transient", { transient: true }, { maxAttempts: 5 });
    const [failed, succeeded] = await Promise.all([finished(bug.jobId), finished(transient.jobId)]);
    expect(failed).toMatchObject({ state: "failed", attempt: 1 });
    expect(entries(failed).map((e) => e.class)).toEqual(["TypeError"]);
    expect(succeeded).toMatchObject({ state: "succeeded", attempt: 2, result: "ok" });
    expect(entries(succeeded).map((e) => e.class)).toEqual(["TransientError"]);
  });

  it("the task's maxAttempts ends the retries before the job's own max_attempts", async () => {
    const { jobId } = await client.enqueue("capped", {}, { maxAttempts: 10 });
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "failed", attempt: 2, maxAttempts: 10 });
    expect(entries(job).map((e) => e.attempt)).toEqual([1, 2]);
    expect(w.of("job:failed").find((e) => e.jobId === jobId)).toMatchObject({ attempt: 2, permanent: false });
  });

  it("a snooze does not count against the task's maxAttempts: maxAttempts 2 with a snooze ends after the third claim", async () => {
    const { jobId } = await client.enqueue("snooze_capped", {}, { maxAttempts: 10 });
    const job = await finished(jobId);
    // attempt 1 snoozed (uncounted); attempts 2 and 3 are the task's two counted attempts.
    expect(job).toMatchObject({ state: "failed", attempt: 3 });
    expect(entries(job).map((e) => e.attempt)).toEqual([2, 3]);
  });

  it("a job of a task the worker does not have is not claimed (no attempt spent); a worker that has the task runs it", async () => {
    const { jobId } = await client.enqueue("nobody_has_this_task", {}, { maxAttempts: 1 });
    // Enqueued after it, in the same queue: done once the worker has walked past the job it lacks.
    const later = await client.enqueue("only_transient", { transient: false }, { maxAttempts: 1 });
    await finished(later.jobId);
    expect(await client.getJob(jobId)).toMatchObject({ state: "enqueued", attempt: 0 });
    expect(w.of("job:start").some((e) => e.jobId === jobId)).toBe(false);

    const other = await startTestWorker(db.url, { nobody_has_this_task: async () => "mine" });
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "succeeded", attempt: 1, result: "mine" });
    expect(other.of("job:success").map((e) => e.jobId)).toContain(jobId);
  });
});

describe("snooze", () => {
  it("does not spend an attempt: with max_attempts 2, a snooze and a failure still leave a third claim that succeeds", async () => {
    const { jobId } = await client.enqueue("snoozer", {}, { maxAttempts: 2 });
    const job = await finished(jobId);
    // attempt 1 snoozed (uncounted), attempt 2 failed (1 of 2 counted), attempt 3 succeeded.
    expect(job).toMatchObject({ state: "succeeded", attempt: 3, result: { attempt: 3 } });
    expect(entries(job).map((e) => [e.attempt, e.message])).toEqual([[2, "the first counted failure"]]);
    expect(w.of("job:snoozed").filter((e) => e.jobId === jobId)).toMatchObject([{ attempt: 1, delay: "100ms" }]);
  });
});
