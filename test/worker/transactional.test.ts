// Transactional tasks and their guard key: guardKey(payload) when the task
// defines one (falling back when it returns nothing), else the job's
// idempotency key; with neither, the task runs unguarded. A handler error
// rolls its writes back with the guard row, so a retry is not a duplicate.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, type Job, type TransactionalJobContext } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let w: TestWorker;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query("CREATE TABLE public.writes (task text NOT NULL, ref text NOT NULL, job_id bigint NOT NULL)");
  const write = (task: string) => async (p: { ref: string; failFirst?: boolean }, ctx: TransactionalJobContext) => {
    await ctx.tx.query("INSERT INTO public.writes (task, ref, job_id) VALUES ($1, $2, $3)", [task, p.ref, ctx.job.id]);
    if (p.failFirst && ctx.job.attempt === 1) throw new Error("failed after writing");
  };
  w = await startTestWorker(db.url, {
    by_job_key: { transactional: true, run: write("by_job_key") },
    by_guard_key: {
      transactional: true,
      guardKey: (p: { ref: string; noGuardKey?: boolean }) => (p.noGuardKey ? undefined : `ref:${p.ref}`),
      backoff: { kind: "fixed", delays: ["50ms"] },
      run: write("by_guard_key"),
    },
    // Records the session's idle_in_transaction_session_timeout inside its own transaction.
    session_timeout: {
      transactional: true,
      lease: "2 seconds",
      run: async (p: { ref: string }, ctx: TransactionalJobContext) => {
        const { rows } = await ctx.tx.query<{ t: string }>("SELECT current_setting('idle_in_transaction_session_timeout') AS t");
        await ctx.tx.query("INSERT INTO public.writes (task, ref, job_id) VALUES ($1, $2, $3)", [`timeout:${rows[0]!.t}`, p.ref, ctx.job.id]);
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

async function done(jobId: string): Promise<Job> {
  return waitFor(
    async () => {
      const job = await client.getJob(jobId);
      return job?.state === "succeeded" || job?.state === "failed" ? job : undefined;
    },
    { what: `job ${jobId} to finish` },
  );
}

async function writes(task: string, ref: string): Promise<number> {
  return (await db.pool.query("SELECT 1 FROM public.writes WHERE task = $1 AND ref = $2", [task, ref])).rowCount ?? 0;
}

describe("the guard key of a transactional task", () => {
  it("without guardKey is the job's idempotency key: the same key enqueued again after success is a duplicate", async () => {
    const first = await client.enqueue("by_job_key", { ref: "a" }, { idempotencyKey: "order-a" });
    await done(first.jobId);
    // The key's job succeeded, so the default policy allows a new job with it.
    const again = await client.enqueue("by_job_key", { ref: "a" }, { idempotencyKey: "order-a" });
    expect(again).toMatchObject({ deduplicated: false });
    expect(await done(again.jobId)).toMatchObject({ state: "succeeded", attempt: 1 });
    expect(await writes("by_job_key", "a")).toBe(1);
    expect(w.of("job:duplicate").find((e) => e.jobId === again.jobId)).toMatchObject({ guardKey: "order-a" });
  });

  it("with neither guardKey nor a job key, the task runs unguarded: two jobs, two writes", async () => {
    const one = await client.enqueue("by_job_key", { ref: "b" });
    const two = await client.enqueue("by_job_key", { ref: "b" });
    await Promise.all([done(one.jobId), done(two.jobId)]);
    expect(await writes("by_job_key", "b")).toBe(2);
    expect(w.of("job:duplicate").some((e) => e.jobId === one.jobId || e.jobId === two.jobId)).toBe(false);
  });

  it("guardKey wins over the job key, and when it returns undefined the job key is used", async () => {
    const guarded = await client.enqueue("by_guard_key", { ref: "c" }, { idempotencyKey: "job-key-c1" });
    const sameRef = await client.enqueue("by_guard_key", { ref: "c" }, { idempotencyKey: "job-key-c2" });
    await Promise.all([done(guarded.jobId), done(sameRef.jobId)]);
    expect(await writes("by_guard_key", "c")).toBe(1);
    const duplicate = w.of("job:duplicate").find((e) => e.jobId === guarded.jobId || e.jobId === sameRef.jobId);
    expect(duplicate).toMatchObject({ guardKey: "ref:c" });

    const fallback = await client.enqueue("by_guard_key", { ref: "d", noGuardKey: true }, { idempotencyKey: "job-key-d" });
    await done(fallback.jobId);
    const { rows } = await db.pool.query("SELECT 1 FROM idemq.processed WHERE key = 'job-key-d'");
    expect(rows).toHaveLength(1);
  });

  it("a handler error rolls back its writes and the guard row: the retry is not a duplicate and writes once", async () => {
    const { jobId } = await client.enqueue("by_guard_key", { ref: "e", failFirst: true });
    const job = await done(jobId);
    expect(job).toMatchObject({ state: "succeeded", attempt: 2 });
    expect((job.errors[0] as { message: string }).message).toBe("failed after writing");
    expect(await writes("by_guard_key", "e")).toBe(1);
    expect(w.of("job:duplicate").some((e) => e.jobId === jobId)).toBe(false);
  });
});

describe("the session of a transactional job", () => {
  it("has idle_in_transaction_session_timeout a little above the job's lease (2 s + 5 s), guarded or not", async () => {
    const plain = await client.enqueue("session_timeout", { ref: "plain" });
    const guarded = await client.enqueue("session_timeout", { ref: "guarded" }, { idempotencyKey: "timeout-guarded" });
    expect(await done(plain.jobId)).toMatchObject({ state: "succeeded" });
    expect(await done(guarded.jobId)).toMatchObject({ state: "succeeded" });
    expect(await writes("timeout:7s", "plain")).toBe(1);
    expect(await writes("timeout:7s", "guarded")).toBe(1);
  });
});
