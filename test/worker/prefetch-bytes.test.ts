// The worker's buffer (claimed jobs waiting for a slot) is bounded in bytes
// as well as in jobs: its payloads total at most prefetchBytes, or it holds a
// single job. Proved with real payloads: a running worker whose handlers are
// held is sampled from the database (every claimed job not yet started is in
// the buffer, or in a claim on its way to it) after every job it starts; and
// HeldJobs, fed the jobs of real claims, gives back what a claim of larger
// payloads than it expected brought beyond the budget.
import { describe, expect, it } from "vitest";
import * as sql from "../../src/sql/index.ts";
import { createWorker } from "../../src/index.ts";
import { HeldJobs } from "../../src/worker/held-jobs.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 4 });

const KB = 1024;

async function enqueueBlobs(queue: string, sizes: readonly number[]): Promise<void> {
  await db.pool.query(
    `SELECT * FROM idemq.enqueue_many(jobs => (
       SELECT jsonb_agg(jsonb_build_object('task', 'blob', 'queue', $1::text,
                                           'payload', jsonb_build_object('i', s.i, 'blob', repeat('x', s.size)))
                        ORDER BY s.i)
       FROM unnest($2::int[]) WITH ORDINALITY AS s(size, i)))`,
    [queue, sizes],
  );
}

/** The jobs `workerId` claimed and did not start: in its buffer, or in a claim on the way there. */
let started: string[] = [];
let queueOf = "";
async function bufferOf(workerId: string): Promise<{ jobs: number; bytes: number }> {
  const { rows } = await db.pool.query<{ jobs: number; bytes: string | null }>(
    `SELECT count(*)::int AS jobs, sum(octet_length(payload::text)) AS bytes FROM idemq.jobs
      WHERE queue = $1 AND state = 'processing' AND locked_by = $2 AND NOT (id = ANY ($3::bigint[]))`,
    [queueOf, workerId, started],
  );
  return { jobs: rows[0]!.jobs, bytes: Number(rows[0]!.bytes ?? 0) };
}

describe("prefetchBytes", () => {
  it("a running worker's buffer never holds more than prefetchBytes of payload, beyond a single job, and still holds several jobs", async () => {
    const queue = unique("bytes");
    const budget = 1000 * KB;
    const size = 250 * KB; // four are the whole budget; with their JSON text just over it, three fit
    const total = 16;
    await enqueueBlobs(queue, Array(total).fill(size));
    queueOf = queue;
    started = [];
    const release = new Map<string, () => void>();
    const worker = createWorker({
      connectionString: db.url,
      queues: [queue],
      concurrency: 2,
      prefetch: 10,
      prefetchBytes: budget,
      pollInterval: "100ms",
      handleSignals: false,
      tasks: {
        blob: async (_payload: unknown, ctx) => {
          started.push(ctx.job.id);
          await new Promise<void>((resolve) => {
            release.set(ctx.job.id, resolve);
          });
        },
      },
    });
    const errors: unknown[] = [];
    worker.on("worker:error", (e) => errors.push(e.error));
    await worker.start();
    try {
      const buffers: { jobs: number; bytes: number }[] = [];
      while (started.length < total) {
        // Two handlers hold their slots: anything else this worker holds waits in its buffer.
        const running = Math.min(2, total - (started.length - release.size));
        await waitFor(() => release.size >= running, { what: `${running} handlers running` });
        // Every sample keeps to the budget; the buffer fills up to what the bytes allow.
        const fill = Math.min(3, total - started.length);
        await waitFor(
          async () => {
            const buffered = await bufferOf(worker.workerId);
            buffers.push(buffered);
            expect(buffered.jobs <= 1 || buffered.bytes <= budget, `buffer ${JSON.stringify(buffered)} over ${budget} bytes`).toBe(true);
            return buffered.jobs === fill;
          },
          { what: `${fill} jobs in the buffer` },
        );
        // Let the oldest running job finish; the next buffered one starts.
        const [id, done] = [...release][0]!;
        release.delete(id);
        done();
      }
      for (const done of release.values()) done();
      await waitFor(
        async () =>
          (await db.pool.query("SELECT 1 FROM idemq.jobs WHERE queue = $1 AND state = 'succeeded'", [queue])).rowCount === total,
        { what: `${total} jobs succeeded` },
      );
      // The bytes, not the count (10), bounded the buffer, and it still batched.
      expect(Math.max(...buffers.map((b) => b.jobs))).toBe(3);
      expect(new Set(started).size).toBe(total);
      expect(errors).toEqual([]);
    } finally {
      for (const done of release.values()) done();
      await worker.stop();
    }
  });

  it("HeldJobs sizes a claim by the largest recent payload and gives back, newest first, what a claim of larger payloads brought beyond the budget", async () => {
    const queue = unique("bytes");
    const budget = 100 * KB;
    await enqueueBlobs(queue, [...Array(4).fill(1 * KB), ...Array(6).fill(40 * KB)]);
    const held = new HeldJobs(new Map(), { concurrency: 1, prefetch: 10, prefetchBytes: budget }, () => {});
    const claim = (batchSize: number) => sql.claim(db.pool, { workerId: "bytes-test", queues: [queue], batchSize });

    // Nothing known yet: the free slot and one job to learn the sizes from.
    expect(held.room()).toBe(2);
    const first = await claim(2);
    const { rows: measured } = await db.pool.query<{ bytes: number }>(
      "SELECT octet_length(payload::text) AS bytes FROM idemq.jobs WHERE id = ANY ($1::bigint[]) ORDER BY id",
      [first.map((j) => j.id)],
    );
    expect(first.map((j) => j.payloadBytes)).toEqual(measured.map((r) => r.bytes));
    held.claimed(first);
    expect(held.startNext()?.job.id).toBe(first[0]!.id);
    expect(held.releaseOverBudget()).toEqual([]);
    expect(held.buffered).toEqual({ jobs: 1, bytes: first[1]!.payloadBytes });

    // Small payloads seen: the count (10 places) bounds the next claim, not the bytes.
    const room = held.room();
    expect(room).toBe(9);
    // Two small ones are left, then the large ones: more bytes than the guess.
    const second = await claim(room);
    expect(second.map((j) => j.payloadBytes > 40 * KB)).toEqual([false, false, true, true, true, true, true, true, true].slice(0, second.length));
    held.claimed(second);
    const over = held.releaseOverBudget();
    expect(over.map((h) => h.job.id)).toEqual(second.slice(-over.length).map((j) => j.id).reverse());
    expect(over.every((h) => h.phase === "released")).toBe(true);
    expect(held.buffered.bytes).toBeLessThanOrEqual(budget);
    expect(held.buffered.jobs).toBe(1 + 2 + 2);

    // Large payloads seen: no room by bytes for another until the buffer drains.
    expect(held.room()).toBe(0);
    for (const h of over) held.remove(h);
    expect(held.buffered.jobs).toBe(5);
  });

  it("a buffer may always hold one job, whatever its size", async () => {
    const queue = unique("bytes");
    await enqueueBlobs(queue, [50 * KB, 50 * KB, 50 * KB]);
    const held = new HeldJobs(new Map(), { concurrency: 1, prefetch: 5, prefetchBytes: 10 * KB }, () => {});
    const jobs = await sql.claim(db.pool, { workerId: "bytes-test", queues: [queue], batchSize: held.room() });
    expect(jobs).toHaveLength(2);
    held.claimed(jobs);
    held.startNext();
    expect(held.releaseOverBudget()).toEqual([]);
    expect(held.buffered).toEqual({ jobs: 1, bytes: jobs[1]!.payloadBytes });
    expect(held.buffered.bytes).toBeGreaterThan(10 * KB);
    expect(held.room()).toBe(0);
  });
});
