// The handler's ctx is made lazily (job-context.ts) and job events only when
// someone listens: what a handler or a listener sees is as before. A signal
// first read after the lease was lost is already aborted with the
// LeaseLostError; ctx's objects are the same on every read and its methods
// work detached; listeners attached while the worker runs get every field.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, createWorker, LeaseLostError, type JobContext, type Worker } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
const bare: Worker[] = [];

beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterEach(async () => {
  await stopWorkers();
  await Promise.all(bare.splice(0).map((w) => w.stop()));
});

describe("the handler context, made on first use", () => {
  it("a signal first read after the lease was lost is aborted already, with the LeaseLostError; ctx.effect refuses", async () => {
    const queue = unique("late-signal");
    let watcherAborted = false;
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let late: { aborted: boolean; reason: unknown; effect: unknown } | undefined;
    const w = await startTestWorker(
      db.url,
      {
        // Reads its signal at once: its abort says the heartbeat has fenced out what was cancelled before it.
        watcher: async (_p: unknown, ctx: JobContext) => {
          await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
          watcherAborted = true;
        },
        // Reads nothing of ctx until released.
        late: async (_p: unknown, ctx: JobContext) => {
          await released;
          const effect = await ctx.effect("k", () => "ran").catch((e: unknown) => e);
          late = { aborted: ctx.signal.aborted, reason: ctx.signal.reason, effect };
        },
      },
      { queues: [queue], heartbeatInterval: "100ms", lease: "30s" },
    );
    const lateJob = await client.enqueue("late", {}, { queue });
    const watcherJob = await client.enqueue("watcher", {}, { queue });
    await waitFor(() => w.of("job:start").length === 2, { what: "both jobs to start" });
    expect(await client.cancel(lateJob.jobId)).toBe("cancelled");
    expect(await client.cancel(watcherJob.jobId)).toBe("cancelled");
    await waitFor(() => watcherAborted, { what: "the watcher's signal to abort" });
    release();
    await waitFor(() => late, { what: "the late handler to read its ctx" });
    expect(late!.aborted).toBe(true);
    expect(late!.reason).toBeInstanceOf(LeaseLostError);
    expect(late!.effect).toBe(late!.reason);
    // Cancelled, not a lease run out: the complete() that found out says so (cancel-running.test.ts).
    await waitFor(() => w.of("job:cancelled").some((e) => e.jobId === lateJob.jobId), { what: "job:cancelled of the late job" });
  });

  it("ctx.job and ctx.log are the same objects on every read; log and snooze work detached", async () => {
    const queue = unique("detached");
    const seen: { sameJob?: boolean; sameLog?: boolean; sameSignal?: boolean; job?: unknown } = {};
    const w = await startTestWorker(
      db.url,
      {
        t: async (_p: unknown, ctx: JobContext) => {
          seen.sameJob = ctx.job === ctx.job;
          seen.sameLog = ctx.log === ctx.log;
          seen.sameSignal = ctx.signal === ctx.signal;
          seen.job = ctx.job;
          const { log, snooze } = ctx;
          const { info } = log;
          info("detached", { extra: 1 });
          snooze("1 hour");
        },
      },
      { queues: [queue] },
    );
    const { jobId } = await client.enqueue("t", { a: 1 }, { queue, idempotencyKey: unique("k") });
    await waitFor(() => w.of("job:snoozed").some((e) => e.jobId === jobId), { what: "the job to snooze" });
    expect(seen).toMatchObject({ sameJob: true, sameLog: true, sameSignal: true });
    expect(seen.job).toEqual({ id: jobId, task: "t", queue, attempt: 1, maxAttempts: 10, key: expect.any(String), reclaimed: false, payload: { a: 1 } });
    expect(w.of("log").find((e) => e.message === "detached")).toMatchObject({ level: "info", extra: 1, jobId, task: "t", attempt: 1 });
  });
});

describe("job events when someone listens", () => {
  it("listeners attached while the worker runs get job:start and job:success with every field", async () => {
    const queue = unique("late-listener");
    const worker = createWorker({ connectionString: db.url, queues: [queue], pollInterval: "200ms", handleSignals: false, tasks: { t: async () => {} } });
    bare.push(worker);
    await worker.start();
    const unheard = await client.enqueue("t", {}, { queue });
    await waitFor(async () => (await client.getJob(unheard.jobId))?.state === "succeeded", { what: "the unheard job to succeed" });

    const events: [string, object][] = [];
    worker.on("job:start", (e) => events.push(["job:start", e]));
    worker.on("job:success", (e) => events.push(["job:success", e]));
    const { jobId } = await client.enqueue("t", {}, { queue });
    await waitFor(() => events.length === 2, { what: "both events" });
    const common = { jobId, task: "t", queue, attempt: 1, workerId: worker.workerId };
    expect(events[0]).toEqual(["job:start", { ...common, reclaimed: false }]);
    expect(events[1]).toEqual(["job:success", { ...common, durationMs: expect.any(Number) }]);
  });
});
