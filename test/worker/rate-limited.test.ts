// Back-pressure from an API (issue 26, item 5), end to end through a real
// worker: a handler throws RateLimitedError, the worker calls hold(), and no
// job of the queue (or, with scope "key", of the job's concurrency key)
// starts again, in the worker or in a SQL consumer, before the hold's end by
// the database's clock; the attempt is not spent.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BadArgumentError, Client, RateLimitedError } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { claim } from "../helpers/work.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 4 });
const queue = unique("api");
const keyQueue = unique("api-key");
let client: Client;
let w: TestWorker;
let kw: TestWorker;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query("CREATE TABLE test_starts (job_id bigint, attempt int, started_at timestamptz NOT NULL DEFAULT clock_timestamp())");
  // One slot: only the first job starts before the hold; without the hold the
  // slot it frees would start the next job at once.
  await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 1)", [queue]);
  w = await startTestWorker(
    db.url,
    {
      api_call: async (payload: { limited: boolean }, ctx) => {
        await db.pool.query("INSERT INTO test_starts (job_id, attempt) VALUES ($1, $2)", [ctx.job.id, ctx.job.attempt]);
        if (payload.limited && ctx.job.attempt === 1) {
          throw new RateLimitedError(RateLimitedError.retryAfter("2")!, { scope: "queue" });
        }
        return "ok";
      },
    },
    { queues: [queue], concurrency: 4 },
  );
  // K = 2 per key, so a hold of the key is what keeps a second job of it from starting.
  await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 2)", [keyQueue]);
  kw = await startTestWorker(
    db.url,
    {
      key_call: async (payload: { limited: boolean }, ctx) => {
        await db.pool.query("INSERT INTO test_starts (job_id, attempt) VALUES ($1, $2)", [ctx.job.id, ctx.job.attempt]);
        if (payload.limited && ctx.job.attempt === 1) {
          throw new RateLimitedError(RateLimitedError.retryAfter("2")!, { scope: "key" });
        }
        return "ok";
      },
    },
    { queues: [keyQueue], concurrency: 4 },
  );
});

afterAll(async () => {
  await stopWorkers();
});

describe("RateLimitedError", () => {
  it("holds the queue back from the worker and from SQL consumers until the time; the attempt is not spent", async () => {
    const limited = await client.enqueue("api_call", { limited: true }, { queue, priority: 10 });
    const others = [];
    for (let i = 0; i < 3; i++) others.push(await client.enqueue("api_call", { limited: false }, { queue }));

    const snoozed = await waitFor(() => w.of("job:snoozed").find((e) => e.jobId === limited.jobId), { what: "the hold" });
    expect(snoozed).toMatchObject({ attempt: 1, delay: "2000ms", held: { scope: "queue", name: queue } });
    const until = (snoozed.held as { until: Date }).until;
    const { rows: limitRows } = await db.pool.query<{ held_until: Date }>("SELECT held_until FROM idemq.limits() WHERE queue = $1", [queue]);
    expect(limitRows[0]!.held_until).toEqual(until);

    // A SQL consumer, by the database's clock before the hold's end, gets nothing of the queue.
    const c = await db.pool.connect();
    try {
      await c.query("BEGIN");
      const { rows } = await c.query<{ before: boolean }>("SELECT now() < $1::timestamptz AS before", [until]);
      if (rows[0]!.before) expect(await claim(c, { queues: [queue], batch_size: 10, token: true })).toEqual([]);
      await c.query("ROLLBACK");
    } finally {
      c.release();
    }

    const ids = [limited.jobId, ...others.map((o) => o.jobId)];
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idemq.jobs WHERE id = ANY ($1) AND state = 'succeeded'", [ids]);
        return rows[0]!.n === ids.length;
      },
      { what: "every job of the queue to succeed after the hold" },
    );
    // Every start but the first was at or after the hold's end (the database's clock).
    const { rows: starts } = await db.pool.query<{ job_id: string; attempt: number; started_at: Date }>(
      "SELECT job_id::text, attempt, started_at FROM test_starts ORDER BY started_at",
    );
    expect(starts[0]).toMatchObject({ job_id: limited.jobId, attempt: 1 });
    expect(starts).toHaveLength(5);
    for (const s of starts.slice(1)) expect(s.started_at.getTime()).toBeGreaterThanOrEqual(until.getTime());
    const { rows: jobRows } = await db.pool.query<{ attempt: number; uncounted: number; errors: unknown[] }>(
      "SELECT attempt, uncounted, errors FROM idemq.jobs WHERE id = $1",
      [limited.jobId],
    );
    expect(jobRows[0]).toEqual({ attempt: 2, uncounted: 1, errors: [] });
  });

  it("scope key holds back the job's concurrency key only, new jobs of it included, until the time; another key runs", async () => {
    const key = unique("customer");
    const limited = await client.enqueue("key_call", { limited: true }, { queue: keyQueue, concurrencyKey: key });
    const snoozed = await waitFor(() => kw.of("job:snoozed").find((e) => e.jobId === limited.jobId), { what: "the key's hold" });
    expect(snoozed).toMatchObject({ attempt: 1, delay: "2000ms", held: { scope: "key", name: null } });
    const until = (snoozed.held as { until: Date }).until;
    // Enqueued while the key is held: the first has room (K = 2) and is admitted, for the hold's end; the next waits.
    const later = [
      await client.enqueue("key_call", { limited: false }, { queue: keyQueue, concurrencyKey: key }),
      await client.enqueue("key_call", { limited: false }, { queue: keyQueue, concurrencyKey: key }),
    ];
    const other = await client.enqueue("key_call", { limited: false }, { queue: keyQueue, concurrencyKey: unique("other") });

    const c = await db.pool.connect();
    try {
      await c.query("BEGIN");
      const { rows } = await c.query<{ before: boolean }>("SELECT now() < $1::timestamptz AS before", [until]);
      if (rows[0]!.before) {
        const got = await claim(c, { queues: [keyQueue], batch_size: 10, token: true });
        expect(got.map((j) => j.job_id).filter((id) => id !== other.jobId)).toEqual([]);
      }
      await c.query("ROLLBACK");
    } finally {
      c.release();
    }

    const keyed = [limited.jobId, ...later.map((j) => j.jobId)];
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idemq.jobs WHERE id = ANY ($1) AND state = 'succeeded'", [
          [...keyed, other.jobId],
        ]);
        return rows[0]!.n === keyed.length + 1;
      },
      { what: "every job to succeed after the key's hold" },
    );
    const { rows: starts } = await db.pool.query<{ job_id: string; attempt: number; started_at: Date }>(
      "SELECT job_id::text, attempt, started_at FROM test_starts WHERE job_id = ANY ($1) ORDER BY started_at",
      [[...keyed, other.jobId]],
    );
    expect(starts[0]).toMatchObject({ job_id: limited.jobId, attempt: 1 });
    const keyStarts = starts.filter((s) => keyed.includes(s.job_id));
    expect(keyStarts).toHaveLength(4);
    for (const s of keyStarts.slice(1)) expect(s.started_at.getTime()).toBeGreaterThanOrEqual(until.getTime());
    // The other key was not held: it ran before the hold's end.
    expect(starts.find((s) => s.job_id === other.jobId)!.started_at.getTime()).toBeLessThan(until.getTime());
    const { rows: jobRows } = await db.pool.query("SELECT attempt, uncounted FROM idemq.jobs WHERE id = $1", [limited.jobId]);
    expect(jobRows[0]).toEqual({ attempt: 2, uncounted: 1 });
  });

  it("scope key on a job without a concurrency key: the attempt fails with the database's error, naming the job and the fix", async () => {
    const job = await client.enqueue("key_call", { limited: true }, { queue: keyQueue, maxAttempts: 1 });
    const failed = await waitFor(() => kw.of("job:failed").find((e) => e.jobId === job.jobId), { what: "the refused hold's failure" });
    expect(failed).toMatchObject({ attempt: 1 });
    const { rows } = await db.pool.query<{ state: string; errors: { message: string }[] }>("SELECT state, errors FROM idemq.jobs WHERE id = $1", [
      job.jobId,
    ]);
    expect(rows[0]!.state).toBe("failed");
    expect(rows[0]!.errors[0]!.message).toMatch(new RegExp(`job ${job.jobId} has no concurrency_key`));
    expect(kw.of("job:snoozed").filter((e) => e.jobId === job.jobId)).toEqual([]);
  });

  it("refuses a bad retry-after or scope with 22023 and a hint; reads Retry-After", () => {
    for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => new RateLimitedError(bad)).toThrow(BadArgumentError);
    }
    try {
      new RateLimitedError(10, { scope: "customer" as never });
      expect.unreachable();
    } catch (error) {
      expect(error).toMatchObject({ code: "22023", hint: expect.stringContaining("queue") });
    }
    expect(RateLimitedError.retryAfter("120")).toBe(120_000);
    expect(RateLimitedError.retryAfter("Wed, 21 Oct 2015 07:28:30 GMT", Date.parse("Wed, 21 Oct 2015 07:28:00 GMT"))).toBe(30_000);
    expect(RateLimitedError.retryAfter("soon")).toBeUndefined();
    expect(new RateLimitedError(1500)).toMatchObject({ scope: "queue", retryAfterMs: 1500, name: "RateLimitedError" });
    expect(new RateLimitedError(1500, { scope: "key" })).toMatchObject({ scope: "key", message: "rate limited: hold the key for 1500 ms" });
  });
});
