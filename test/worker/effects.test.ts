// ctx.effect with a fake email provider that honours Idempotency-Key and
// counts deliveries. Claim, send, die: the worker is killed after the
// provider accepted the email but before effect_done; the retry reclaims the
// stale claim and resends with the same key, and the provider delivers once.
// Two concurrent runs of one effect key deliver once: the second is `busy`
// (snoozed without spending an attempt, never a skip) until the first records
// its result.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, createWorker } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { emailTasks } from "../fixtures/worker/email-tasks.ts";
import { startFakeProvider, type FakeProvider } from "../fixtures/worker/fake-email-provider.ts";
import { killAllWorkers, startedWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let provider: FakeProvider;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterEach(async () => {
  await killAllWorkers();
  await provider?.close();
});

async function succeeded(jobId: string) {
  return waitFor(
    async () => {
      const job = await client.getJob(jobId);
      return job?.state === "succeeded" ? job : undefined;
    },
    { what: `job ${jobId} to succeed` },
  );
}

async function effectRow(key: string) {
  const { rows } = await db.pool.query<{ status: string; owner: string; reclaims: number; result: unknown }>(
    "SELECT status, owner, reclaims, result FROM idemq.effects WHERE key = $1",
    [key],
  );
  return rows[0];
}

describe("claim, send, die", () => {
  it("killed after the provider accepted the email, before effect_done: the retry resends with the same key; one delivery", async () => {
    provider = await startFakeProvider();
    provider.hold(); // accepts and counts the email, never answers the first worker
    const env = {
      IDEMQ_TEST_PROVIDER_URL: provider.url,
      IDEMQ_TEST_STALE_AFTER: "1s",
      IDEMQ_TEST_LEASE: "1s",
      IDEMQ_TEST_HEARTBEAT: "300ms",
      IDEMQ_TEST_RESCUE: "200ms",
    };
    const first = await startedWorker({ tasks: "email-tasks.ts", databaseUrl: db.url, env });
    const { jobId } = await client.enqueue("send_email", { id: 1, to: "ada@example.com" });
    await waitFor(() => provider.deliveries === 1, { what: "the provider to accept the email" });
    // Claimed and sent, not recorded as done.
    expect(await effectRow("welcome-email:1")).toMatchObject({ status: "claimed", reclaims: 0 });
    expect((await effectRow("welcome-email:1"))!.owner).toContain(`job:${jobId}:1@`);
    // The owner ends in a digest of the attempt's lease token (another worker cannot name it), never the token itself.
    const { rows: held } = await db.pool.query<{ lease_token: string }>("SELECT lease_token FROM idemq.jobs WHERE id = $1", [jobId]);
    const owner = (await effectRow("welcome-email:1"))!.owner;
    expect(owner).toMatch(/#[0-9a-f]{16}$/);
    expect(owner).not.toContain(held[0]!.lease_token);

    first.child.kill("SIGKILL");
    expect((await first.exited).signal).toBe("SIGKILL");
    provider.release();

    const second = await startedWorker({ tasks: "email-tasks.ts", databaseUrl: db.url, env });
    const job = await succeeded(jobId);

    expect(provider.deliveries).toBe(1);
    expect(provider.requests).toBe(2);
    expect(provider.keys).toEqual(["welcome-email:1", "welcome-email:1"]);
    // The replayed answer of the provider is the job's result, and the effect's.
    expect(job.result).toEqual({ messageId: "msg-1-ada@example.com" });
    expect(await effectRow("welcome-email:1")).toMatchObject({
      status: "done",
      reclaims: 1,
      result: { messageId: "msg-1-ada@example.com" },
    });
    expect(job.errors[0]).toMatchObject({ attempt: 1, class: "LeaseExpired" });
    second.child.kill("SIGTERM");
    expect((await second.exited).code).toBe(0);
  });
});

describe("two concurrent runs of one effect key", () => {
  it("deliver once: the second run is busy (snoozed, no attempt spent) while the first is in flight, then returns the stored result", async () => {
    provider = await startFakeProvider();
    provider.hold();
    const worker = createWorker({
      connectionString: db.url,
      concurrency: 2,
      handleSignals: false,
      tasks: emailTasks(() => provider.url, "1 minute"),
    });
    const snoozed: string[] = [];
    worker.on("job:snoozed", (event) => snoozed.push(event.jobId));
    await worker.start();
    try {
      // Two deliveries of the same email (keyless jobs), run at the same time,
      // with one attempt each: a busy answer that spent it would fail the job.
      const a = await client.enqueue("send_email", { id: 2, to: "grace@example.com" }, { maxAttempts: 1 });
      const b = await client.enqueue("send_email", { id: 2, to: "grace@example.com" }, { maxAttempts: 1 });
      await waitFor(() => provider.deliveries === 1, { what: "the first send to reach the provider" });
      // The other run met the fresh claim: EffectBusyError, and the job is snoozed.
      const busyId = await waitFor(() => snoozed[0], { what: "one run to be refused as busy" });
      expect([a.jobId, b.jobId]).toContain(busyId);
      const { rows } = await db.pool.query<{ state: string; uncounted: number; errors: unknown[] }>(
        "SELECT state, uncounted, errors FROM idemq.jobs WHERE id = $1",
        [busyId],
      );
      expect(["scheduled", "enqueued", "processing"]).toContain(rows[0]!.state);
      expect(rows[0]!.uncounted).toBeGreaterThanOrEqual(1);
      expect(rows[0]!.errors).toEqual([]);
      provider.release();

      const [jobA, jobB] = await Promise.all([succeeded(a.jobId), succeeded(b.jobId)]);
      expect(provider.deliveries).toBe(1);
      expect(provider.requests).toBe(1); // the second run never called fn: effect_claim answered done
      expect(jobA.result).toEqual({ messageId: "msg-1-grace@example.com" });
      expect(jobB.result).toEqual(jobA.result);
      expect(await effectRow("welcome-email:2")).toMatchObject({ status: "done", reclaims: 0 });
      // The busy run was never failed, for good or retryably, and never skipped.
      const busyJob = busyId === a.jobId ? jobA : jobB;
      expect(busyJob.errors).toEqual([]);
    } finally {
      await worker.stop();
    }
  });
});
