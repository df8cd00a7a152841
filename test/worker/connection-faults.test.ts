// A worker whose connections are terminated (pg_terminate_backend, as a
// failover or an administrator does) keeps its process and goes on working:
// a job whose transaction connection died is retried and commits once; the
// wait-marker connection is replaced every time, so NOTIFY keeps waking the
// worker. An unhandled 'error' event here would fail the whole run (vitest
// reports it), which is how the missing listener showed itself.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client, type Tasks } from "../../src/index.ts";
import { type TestDatabase, useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 6 });
let client: Client;
let w: TestWorker;
let openGate: () => void = () => {};
const gate = new Promise<void>((resolve) => (openGate = resolve));
let inTransaction = false;

/** A plain no-op task, and a transactional one writing its ledger row, then awaiting `inTransaction` before it commits. */
function pingAndLedger(inTransactionStep: () => Promise<void>): Tasks {
  return {
    ping: async () => "pong",
    ledger: {
      transactional: true,
      backoff: { kind: "fixed", delays: ["100ms"] },
      run: async (_payload, ctx) => {
        await ctx.tx.query("INSERT INTO ledger VALUES ($1, $2)", [ctx.job.id, ctx.job.attempt]);
        await inTransactionStep();
      },
    },
  };
}

beforeAll(async () => {
  await db.pool.query("CREATE TABLE ledger (job_id bigint, attempt int)");
  client = new Client({ pool: db.pool });
  w = await startTestWorker(
    db.url,
    // The ledger task holds its transaction open until the gate opens.
    pingAndLedger(async () => {
      inTransaction = true;
      await gate;
    }),
    // NOTIFY or nothing: a job done within seconds was woken, not polled.
    { pollInterval: "60s", rescueInterval: "60s", concurrency: 2 },
  );
});
afterAll(async () => {
  openGate();
  await stopWorkers();
});

async function pidsOf(where: string, on: TestDatabase = db): Promise<number[]> {
  const { rows } = await on.pool.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND ${where} ORDER BY pid`,
  );
  return rows.map((row) => row.pid);
}

async function terminate(pid: number): Promise<void> {
  const { rows } = await db.pool.query<{ ok: boolean }>("SELECT pg_terminate_backend($1) AS ok", [pid]);
  expect(rows[0]!.ok).toBe(true);
}

async function succeededWithin(jobId: string, ms: number): Promise<{ attempt: number }> {
  return waitFor(
    async () => {
      const { rows } = await db.pool.query<{ attempt: number }>(
        "SELECT attempt FROM idemq.jobs WHERE id = $1 AND state = 'succeeded'",
        [jobId],
      );
      return rows[0];
    },
    { what: `job ${jobId} succeeded`, timeoutMs: ms },
  );
}

describe("terminated connections do not end the worker", () => {
  it("a job whose transaction connection is terminated mid-handler is retried and commits once", async () => {
    const { jobId } = await client.enqueue("ledger", {});
    await waitFor(() => inTransaction, { what: "the handler inside its transaction" });
    const [pid] = await pidsOf("application_name = 'idemq-worker' AND state = 'idle in transaction'");
    expect(pid).toBeDefined();
    await terminate(pid!);
    openGate();
    // The first attempt's row rolled back with its connection; the retry's committed with its completion.
    expect(await succeededWithin(jobId, 15_000)).toEqual({ attempt: 2 });
    const { rows } = await db.pool.query("SELECT attempt FROM ledger WHERE job_id = $1", [jobId]);
    expect(rows).toEqual([{ attempt: 2 }]);
    const retry = w.of("job:retry").find((e) => e.jobId === jobId);
    expect(retry?.attempt).toBe(1);
    // And the worker goes on: a new job is woken and done at once.
    const ping = await client.enqueue("ping", {});
    await succeededWithin(ping.jobId, 10_000);
  });

  it("the wait marker survives five terminations in a row: each new job is still woken by NOTIFY, within milliseconds", async () => {
    const marker = "application_name = 'idemq-wait-marker'";
    const startedAt = new Map<string, number>();
    w.worker.on("job:start", (e) => startedAt.set(e.jobId, performance.now()));
    const latencies: number[] = [];
    for (let round = 1; round <= 5; round++) {
      // Idle worker: the marker's session holds its advisory lock (it waits for every queue).
      const [before] = await waitFor(
        async () => {
          const pids = await pidsOf(`${marker} AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock')`);
          return pids.length === 1 ? pids : undefined;
        },
        { what: `round ${round}: one wait-marker session holding the marker`, timeoutMs: 10_000 },
      );
      await terminate(before!);
      await waitFor(async () => !(await pidsOf(`pid = ${before}`)).length, { what: `round ${round}: the old marker session gone` });
      const enqueuedAt = performance.now();
      const { jobId } = await client.enqueue("ping", { round });
      // The poll is a minute away: only a new marker and a NOTIFY (or the claim wait_for_jobs confirms) get it done.
      await succeededWithin(jobId, 10_000);
      latencies.push(Math.round(startedAt.get(jobId)! - enqueuedAt));
    }
    console.log(`pick-up after each wait-marker termination: ${latencies.join(", ")} ms`);
    // Milliseconds, not the 60 s poll; the bound leaves room for a loaded machine.
    for (const ms of latencies) expect(ms).toBeLessThan(2000);
    // Exactly one marker session in the end: no replacement was orphaned.
    const sessions = await waitFor(
      async () => {
        const pids = await pidsOf(marker);
        return pids.length === 1 ? pids : undefined;
      },
      { what: "one wait-marker session", timeoutMs: 10_000 },
    );
    expect(sessions).toHaveLength(1);
  });
});

describe("terminations of every connection at once, while jobs flow", () => {
  const chaosDb = useTestDatabase({ poolSize: 4 });
  let chaosClient: Client;
  beforeAll(async () => {
    await chaosDb.pool.query("CREATE TABLE ledger (job_id bigint, attempt int)");
    chaosClient = new Client({ pool: chaosDb.pool });
    await startTestWorker(
      chaosDb.url,
      pingAndLedger(async () => {}),
      // A claim whose answer was cut leaves its jobs held by nobody: a short lease and rescue bring them back.
      { lease: "2s", heartbeatInterval: "500ms", rescueInterval: "500ms", concurrency: 4 },
    );
  });

  it("every connection of the worker terminated at once, three times while jobs flow: no exit, every job done, each transactional one committed once", async () => {
    const jobIds: string[] = [];
    for (let round = 1; round <= 3; round++) {
      const batch = await chaosClient.enqueueMany([
        ...Array.from({ length: 50 }, (_, i) => ({ task: "ping", payload: { round, i } })),
        ...Array.from({ length: 10 }, (_, i) => ({ task: "ledger", payload: { round, i } })),
      ]);
      jobIds.push(...batch.map((r) => r.jobId!));
      // Listener, wait marker, pool connections idle or mid-statement: all of them.
      // Whatever has reconnected since the last round (the listener at least).
      const pids = await waitFor(
        async () => {
          const found = await pidsOf("application_name LIKE 'idemq-%'", chaosDb);
          return found.length > 0 ? found : undefined;
        },
        { what: `round ${round}: the worker's connections` },
      );
      await chaosDb.pool.query("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", [pids]);
    }
    await waitFor(
      async () => {
        const { rows } = await chaosDb.pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM idemq.jobs WHERE id = ANY ($1::bigint[]) AND state = 'succeeded'",
          [jobIds],
        );
        return rows[0]!.n === jobIds.length;
      },
      // Jobs whose claim or completion was cut wait for their 2 s lease and rescue.
      { what: `${jobIds.length} jobs succeeded`, timeoutMs: 30_000 },
    );
    // Each transactional job committed its row once, whichever attempt got through.
    const { rows } = await chaosDb.pool.query<{ n: number; jobs: number }>(
      "SELECT count(*)::int AS n, count(DISTINCT job_id)::int AS jobs FROM ledger WHERE job_id = ANY ($1::bigint[])",
      [jobIds],
    );
    expect(rows[0]).toEqual({ n: 30, jobs: 30 });
    // Still working afterwards.
    const { jobId } = await chaosClient.enqueue("ping", { after: true });
    await waitFor(async () => (await chaosClient.getJob(jobId))?.state === "succeeded", { what: "a job after the chaos" });
  });
});
