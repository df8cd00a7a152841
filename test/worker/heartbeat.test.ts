// Heartbeats: jobs that run longer than their lease keep it, because the
// worker extends every held lease in one heartbeat() call per lease, while
// rescue() (run every ~100 ms here) finds nothing to take away.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let w: TestWorker;
const releases = new Map<string, () => void>();

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  w = await startTestWorker(
    db.url,
    {
      long: async (_p, ctx) => new Promise<void>((resolve) => releases.set(ctx.job.id, resolve)),
      long_tx: {
        transactional: true,
        lease: "2s",
        run: async (_p, ctx) => new Promise<void>((resolve) => releases.set(ctx.job.id, resolve)),
      },
    },
    { lease: "1s", heartbeatInterval: "200ms", rescueInterval: "100ms" },
  );
});
afterEach(() => {
  expect(w.of("worker:error")).toEqual([]);
});
afterAll(async () => {
  await stopWorkers();
});

async function leaseOf(jobId: string): Promise<number> {
  const { rows } = await db.pool.query<{ at: Date }>("SELECT lease_expires_at AS at FROM idemq.jobs WHERE id = $1", [jobId]);
  return rows[0]!.at.getTime();
}

describe("heartbeats", () => {
  it("keep the leases of jobs running longer than their lease (the task's own lease where it has one)", async () => {
    const plain = await client.enqueue("long", {});
    const tx = await client.enqueue("long_tx", {});
    await waitFor(() => releases.has(plain.jobId) && releases.has(tx.jobId), { what: "both handlers to start" });
    const firstLeases = [await leaseOf(plain.jobId), await leaseOf(tx.jobId)];
    // Well past the first leases: both extended, neither rescued.
    await waitFor(
      async () => (await leaseOf(plain.jobId)) > firstLeases[0]! + 1500 && (await leaseOf(tx.jobId)) > firstLeases[1]! + 1500,
      { what: "both leases to be extended past the first ones by 1.5 s", timeoutMs: 15_000 },
    );
    // The transactional task's lease is its own 2 s, the plain one the worker's 1 s.
    const { rows } = await db.pool.query<{ id: string; left_ms: number }>(
      "SELECT id, extract(epoch FROM lease_expires_at - now()) * 1000 AS left_ms FROM idemq.jobs WHERE id IN ($1, $2)",
      [plain.jobId, tx.jobId],
    );
    const left = Object.fromEntries(rows.map((r) => [r.id, Number(r.left_ms)]));
    expect(left[plain.jobId]).toBeLessThanOrEqual(1000);
    expect(left[tx.jobId]).toBeGreaterThan(1000);
    expect(left[tx.jobId]).toBeLessThanOrEqual(2000);

    releases.get(plain.jobId)!();
    releases.get(tx.jobId)!();
    for (const { jobId } of [plain, tx]) {
      const job = await waitFor(async () => {
        const j = await client.getJob(jobId);
        return j?.state === "succeeded" ? j : undefined;
      }, { what: `job ${jobId} to succeed` });
      expect(job).toMatchObject({ attempt: 1, errors: [] });
    }
    expect(w.of("job:lease-lost")).toEqual([]);
  });
});
