// Workers behind a transaction-pooling PgBouncer (a stock one: no
// ignore_startup_parameters), in front of a private cluster, with `idemq
// worker` processes:
//   poll    --wake-up poll: every job done, each started within the poll interval;
//   split   --listen-url to the server: LISTEN and the wait marker there, each
//           job started by NOTIFY, far sooner than the (60 s) poll;
//   listen  the default through the pooler: the worker finds out at start,
//           says so in one line, and polls;
//   fan-out ctx.spawn through the pooler, and Client.result polling through it
//           (pollInterval) or LISTENing on a direct listenConnectionString.
// After each worker stops, every server connection PgBouncer holds is lent to
// this test at once and inspected: no advisory lock, no LISTEN, no prepared
// statement, no session SET was left behind (no worker there prepares its
// calls: poll mode never does, listen mode finds the pooler at start). The
// probe never fires against the server directly or through a session-pooling
// PgBouncer, where a listen-mode worker prepares.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { killAllWorkers, startedWorker, type WorkerProcess } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { type PgBouncer, startPgBouncer } from "../helpers/pgbouncer.ts";
import { type PrivateCluster, startMigratedCluster } from "../helpers/private-cluster.ts";

const POOL_SIZE = 20;
/** The test's own direct connections, told apart from PgBouncer's server connections by this name. */
const DIRECT = "pgbouncer-test-direct";
/** Session settings PgBouncer itself keeps in step on its server connections (SET as it lends them). */
const POOLER_TRACKED = ["application_name", "client_encoding", "DateStyle", "TimeZone", "standard_conforming_strings"];

let cluster: PrivateCluster;
let bouncer: PgBouncer;
let direct: pg.Pool;
let producer: Client;

beforeAll(async () => {
  ({ cluster } = await startMigratedCluster());
  direct = new pg.Pool({ connectionString: cluster.url("idemq"), application_name: DIRECT, max: 3 });
  direct.on("error", () => {});
  bouncer = await startPgBouncer({ serverPort: cluster.port, poolMode: "transaction", poolSize: POOL_SIZE, ignoreStartupParameters: [] });
  // Producers go through the pooler too, as an application's would.
  producer = new Client({ connectionString: bouncer.url("idemq"), onError: () => {} });
}, 120_000);

afterAll(async () => {
  await killAllWorkers();
  await stopWorkers();
  await producer?.close().catch(() => {});
  await direct?.end().catch(() => {});
  await bouncer?.stop();
  await cluster?.destroy();
});

interface ServerState {
  pid: number;
  channels: string[];
  advisory_locks: number;
  prepared: string[];
  settings: string[];
}

/**
 * What each server connection PgBouncer holds for the database carries over
 * from earlier clients: each is lent to a client of this test at once (one
 * open transaction each, so no two share one) and asked.
 */
async function pooledSessionState(): Promise<ServerState[]> {
  const { rows } = await direct.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity
      WHERE datname = 'idemq' AND backend_type = 'client backend' AND application_name IS DISTINCT FROM $1`,
    [DIRECT],
  );
  const servers = new Set(rows.map((r) => r.pid));
  const seen = new Map<number, ServerState>();
  const clients: pg.Client[] = [];
  try {
    while ([...servers].some((pid) => !seen.has(pid))) {
      if (clients.length >= POOL_SIZE) throw new Error(`server connections never lent to the test: ${[...servers].filter((p) => !seen.has(p))}`);
      const client = new pg.Client({ connectionString: bouncer.url("idemq"), application_name: "pgbouncer-test-inspect" });
      client.on("error", () => {});
      await client.connect();
      clients.push(client);
      await client.query("BEGIN");
      const { rows: [state] } = await client.query<ServerState>(
        `SELECT pg_backend_pid() AS pid,
                ARRAY(SELECT pg_listening_channels()) AS channels,
                (SELECT count(*)::int FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory') AS advisory_locks,
                ARRAY(SELECT name FROM pg_prepared_statements) AS prepared,
                ARRAY(SELECT name FROM pg_settings WHERE source = 'session' AND name <> ALL ($1::text[])) AS settings`,
        [POOLER_TRACKED],
      );
      seen.set(state!.pid, state!);
    }
  } finally {
    await Promise.all(clients.map((c) => c.query("ROLLBACK").finally(() => c.end()).catch(() => {})));
  }
  expect(servers.size, "PgBouncer holds server connections for the database").toBeGreaterThan(0);
  return [...seen.values()].filter((s) => servers.has(s.pid));
}

/** A stopped worker left nothing on the server: no advisory lock anywhere, nothing on any pooled connection. */
async function expectNoSessionStateLeft(): Promise<void> {
  const { rows } = await direct.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'");
  expect(rows[0]!.n, "advisory locks on the server").toBe(0);
  const states = await pooledSessionState();
  expect(states.filter((s) => s.channels.length > 0 || s.advisory_locks > 0 || s.prepared.length > 0 || s.settings.length > 0)).toEqual([]);
}

/** Enqueues jobs one at a time (each after the last started) and returns ms from each enqueue to its job:start. */
async function pickUpLatencies(worker: WorkerProcess, count: number, idleBeforeMs = 0): Promise<number[]> {
  const latencies: number[] = [];
  for (let i = 0; i < count; i++) {
    // A deliberate idle period (the poll's gap grows meanwhile), not a condition to await.
    if (idleBeforeMs > 0) await new Promise((resolve) => setTimeout(resolve, idleBeforeMs));
    const enqueuedAt = Date.now();
    const { jobId } = await producer.enqueue("ping", { i });
    const started = await worker.waitForEvent((e) => e.event === "job:start" && e.jobId === jobId, `job ${jobId} started`);
    latencies.push(Date.parse(started.time) - enqueuedAt);
    await worker.waitForEvent((e) => e.event === "job:success" && e.jobId === jobId, `job ${jobId} succeeded`);
  }
  return latencies;
}

function summary(latencies: number[]): { p50: number; max: number; text: string } {
  const sorted = [...latencies].sort((a, b) => a - b);
  const p50 = sorted[Math.floor((sorted.length - 1) / 2)]!;
  const max = sorted.at(-1)!;
  return { p50, max, text: `p50 ${p50} ms, max ${max} ms over ${sorted.length} jobs` };
}

async function stopped(worker: WorkerProcess): Promise<void> {
  worker.child.kill("SIGTERM");
  expect((await worker.exited).code, worker.stderr()).toBe(0);
}

function poolerLines(worker: WorkerProcess): unknown[] {
  return worker.events.filter((e) => e.event === "log" && String(e.message).includes("transaction pooler"));
}

async function succeededCount(): Promise<{ all: number; succeeded: number }> {
  const { rows } = await direct.query<{ all: number; succeeded: number }>(
    "SELECT count(*)::int AS all, (count(*) FILTER (WHERE state = 'succeeded'))::int AS succeeded FROM idemq.jobs",
  );
  return rows[0]!;
}

describe("a worker behind a transaction-pooling PgBouncer", () => {
  it("--wake-up poll: every job done, each started within the poll interval, no session state left", async () => {
    const worker = await startedWorker({
      tasks: "ping-tasks.ts",
      databaseUrl: bouncer.url("idemq"),
      args: ["--wake-up", "poll"],
      env: { IDEMQ_TEST_POLL: "1s" },
    });
    // Right after activity (each job enqueued once the last started), then after idle spells long
    // enough for the poll's gap to grow to its 1 s maximum.
    const busy = await pickUpLatencies(worker, 20);
    const idle = await pickUpLatencies(worker, 3, 2000);
    console.log(`poll mode through PgBouncer: after activity ${summary(busy).text}; after 2 s idle ${summary(idle).text}`);
    // Bounded by the 1 s poll (jittered +25%), with room for a loaded machine.
    for (const ms of [...busy, ...idle]) expect(ms).toBeLessThan(1250 + 1000);
    expect(poolerLines(worker)).toEqual([]);
    expect(worker.count("worker:error")).toBe(0);
    await stopped(worker);
    expect(await succeededCount()).toEqual({ all: 23, succeeded: 23 });
    await expectNoSessionStateLeft();
  }, 120_000);

  it("--listen-url to the server: LISTEN and the marker there, each job started by NOTIFY far sooner than the 60 s poll, no session state left", async () => {
    const before = (await succeededCount()).all;
    const worker = await startedWorker({
      tasks: "ping-tasks.ts",
      databaseUrl: bouncer.url("idemq"),
      args: ["--listen-url", cluster.url("idemq")],
      env: { IDEMQ_TEST_POLL: "60s" },
    });
    // The idle worker waits: its marker is held, on a connection of its own to the server.
    await waitFor(
      async () => {
        const { rows } = await direct.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'idemq-wait-marker'`,
        );
        return rows[0]!.n === 1;
      },
      { what: "the wait marker held on the direct connection", timeoutMs: 10_000 },
    );
    const latencies = await pickUpLatencies(worker, 20);
    console.log(`split mode (claims through PgBouncer, LISTEN direct): ${summary(latencies).text}`);
    for (const ms of latencies) expect(ms).toBeLessThan(3000);
    expect(poolerLines(worker)).toEqual([]);
    expect(worker.count("worker:error")).toBe(0);
    await stopped(worker);
    expect(await succeededCount()).toEqual({ all: before + 20, succeeded: before + 20 });
    await expectNoSessionStateLeft();
  }, 120_000);

  it("the default (listen) through the pooler: one line saying so with the fix, then it polls; jobs done, no session state left", async () => {
    const before = (await succeededCount()).all;
    const worker = await startedWorker({
      tasks: "ping-tasks.ts",
      databaseUrl: bouncer.url("idemq"),
      env: { IDEMQ_TEST_POLL: "1s" },
    });
    // The probe runs before worker:started.
    const lines = poolerLines(worker) as { level: string; message: string }[];
    expect(lines).toHaveLength(1);
    expect(lines[0]!.level).toBe("warn");
    expect(lines[0]!.message).toMatch(/--wake-up poll/);
    expect(lines[0]!.message).toMatch(/--listen-url/);
    const latencies = await pickUpLatencies(worker, 10);
    console.log(`listen mode through PgBouncer (detected, polling): ${summary(latencies).text}`);
    for (const ms of latencies) expect(ms).toBeLessThan(1250 + 1000);
    expect(poolerLines(worker)).toHaveLength(1);
    await stopped(worker);
    expect(await succeededCount()).toEqual({ all: before + 10, succeeded: before + 10 });
    await expectNoSessionStateLeft();
  }, 120_000);

  it("fan-out and results: ctx.spawn through the pooler; result() polls through it, or LISTENs on listenConnectionString; no session state left", async () => {
    const before = (await succeededCount()).all;
    const worker = await startedWorker({
      tasks: "fan-out-tasks.ts",
      databaseUrl: bouncer.url("idemq"),
      args: ["--wake-up", "poll"],
      env: { IDEMQ_TEST_POLL: "1s" },
    });
    const split = new Client({ connectionString: bouncer.url("idemq"), listenConnectionString: cluster.url("idemq"), onError: () => {} });
    try {
      const polled = await producer.enqueue("sum", { numbers: [1, 2, 3] });
      const listened = await producer.enqueue("sum", { numbers: [4, 5] });
      // LISTEN cannot work through the pooler: the producer polls job_result; the split Client LISTENs on the server.
      expect(await producer.result(polled.jobId, { timeout: "60s", pollInterval: "100ms" })).toEqual({ sum: 14, runs: 2 });
      expect(await split.result(listened.jobId, { timeout: "60s" })).toEqual({ sum: 41, runs: 2 });
    } finally {
      await split.close();
    }
    expect(worker.count("worker:error")).toBe(0);
    await stopped(worker);
    // Two parents and their five children.
    expect(await succeededCount()).toEqual({ all: before + 7, succeeded: before + 7 });
    await expectNoSessionStateLeft();
  }, 120_000);
});

describe("the transaction-pooler probe", () => {
  it("fires through the transaction pooler (worker:pooler, one log line, no prepared statements) and never directly or through a session pooler", async () => {
    const session = await startPgBouncer({ serverPort: cluster.port, poolMode: "session", poolSize: 40, ignoreStartupParameters: [] });
    try {
      const tasks = { ping: async () => "pong" };
      // A queue each, so each shows that it runs jobs.
      const pooled = await startTestWorker(bouncer.url("idemq"), tasks, { queues: ["pooled"] });
      const onServer = await startTestWorker(cluster.url("idemq"), tasks, { queues: ["server"], pollInterval: "60s" });
      const sessionPooled = await startTestWorker(session.url("idemq"), tasks, { queues: ["session"], pollInterval: "60s" });
      expect(pooled.of("worker:pooler")).toEqual([{ workerId: pooled.worker.workerId, evidence: expect.any(String), wakeUp: "poll" }]);
      // The same probe decides the hot calls' prepared statements: none through the transaction pooler.
      expect(pooled.worker.preparedStatements).toBe(false);
      expect(onServer.worker.preparedStatements).toBe(true);
      expect(sessionPooled.worker.preparedStatements).toBe(true);
      expect(pooled.of("log").filter((e) => String(e.message).includes("transaction pooler"))).toHaveLength(1);
      for (const w of [onServer, sessionPooled]) {
        expect(w.of("worker:pooler")).toEqual([]);
        expect(w.of("log").filter((e) => String(e.message).includes("transaction pooler"))).toEqual([]);
      }
      // Each runs jobs; the listen-mode ones by NOTIFY (their poll is a minute away: the
      // session pooler keeps their LISTEN session).
      for (const [queue, w] of [["pooled", pooled], ["server", onServer], ["session", sessionPooled]] as const) {
        const { jobId } = await producer.enqueue("ping", {}, { queue });
        await waitFor(async () => (await producer.getJob(jobId))?.state === "succeeded", { what: `job ${jobId} of queue ${queue} done`, timeoutMs: 10_000 });
        expect(w.of("job:success").map((e) => e.jobId)).toContain(jobId);
        expect(w.of("worker:error")).toEqual([]);
        // Nothing found a statement gone (the session pooler keeps each client on its server connection).
        expect(w.of("log").filter((e) => String(e.message).includes("prepared statement"))).toEqual([]);
      }
      expect(sessionPooled.worker.preparedStatements).toBe(true);
    } finally {
      await stopWorkers();
      await session.stop();
    }
  }, 60_000);
});

describe("poll mode on the server itself", () => {
  it("holds no listen or marker connection, no advisory lock and no prepared statement, and enqueues send no NOTIFY on its account", async () => {
    const listener = new pg.Client({ connectionString: cluster.url("idemq"), application_name: DIRECT });
    await listener.connect();
    try {
      const heard: string[] = [];
      listener.on("notification", (n) => heard.push(`${n.channel}:${n.payload ?? ""}`));
      await listener.query("LISTEN idemq_jobs");
      await listener.query("LISTEN test_sentinel");
      const w = await startTestWorker(cluster.url("idemq"), { ping: async () => "pong" }, { wakeUp: "poll", pollInterval: "1s", queues: ["polled"] });
      // No session state: not even a prepared statement, though the server would keep one.
      expect(w.worker.preparedStatements).toBe(false);
      const { jobId } = await producer.enqueue("ping", {}, { queue: "polled" });
      await waitFor(async () => (await producer.getJob(jobId))?.state === "succeeded", { what: `job ${jobId} done`, timeoutMs: 10_000 });
      // Notifications arrive in commit order: had the enqueue notified, it would be heard before the sentinel.
      await direct.query("NOTIFY test_sentinel");
      await waitFor(() => heard.includes("test_sentinel:"), { what: "the sentinel notification" });
      expect(heard).toEqual(["test_sentinel:"]);
      const { rows } = await direct.query<{ application_name: string }>(
        "SELECT application_name FROM pg_stat_activity WHERE datname = 'idemq' AND application_name LIKE 'idemq-%' ORDER BY 1",
      );
      expect(rows.map((r) => r.application_name).filter((name) => name !== "idemq-worker")).toEqual([]);
      const locks = await direct.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'");
      expect(locks.rows[0]!.n).toBe(0);
      expect(w.of("worker:error")).toEqual([]);
    } finally {
      await stopWorkers();
      await listener.end();
    }
  }, 60_000);
});

describe("durable steps behind a transaction-pooling PgBouncer", () => {
  it("a step, a sleep and a wait woken by emitEvent through the pooler: the job succeeds, no session state left", async () => {
    await direct.query("CREATE TABLE IF NOT EXISTS public.pooled_steps (job_id bigint NOT NULL)");
    try {
      await startTestWorker(
        bouncer.url("idemq"),
        {
          pooled_workflow: async (_p: unknown, ctx: import("../../src/index.ts").JobContext) => {
            await ctx.step("write", async (tx) => {
              await tx.query("INSERT INTO public.pooled_steps (job_id) VALUES ($1)", [ctx.job.id]);
              return null;
            });
            await ctx.sleep(200);
            return ctx.waitFor("pooled.go", { key: ctx.job.id, timeout: "1 minute" });
          },
        },
        { queues: ["pooled-steps"], wakeUp: "poll", pollInterval: "200ms" },
      );
      const { jobId } = await producer.enqueue("pooled_workflow", {}, { queue: "pooled-steps" });
      await waitFor(
        async () => (await direct.query("SELECT 1 FROM idemq.steps($1) WHERE name = 'wait:1' AND status = 'waiting'", [jobId])).rowCount === 1,
        { what: "the job to wait for its event" },
      );
      expect(await producer.emitEvent("pooled.go", { key: jobId, payload: { through: "pgbouncer" } })).toBe(1);
      const job = await waitFor(
        async () => {
          const j = await producer.getJob(jobId);
          return j?.state === "succeeded" ? j : undefined;
        },
        { what: "the job to succeed" },
      );
      expect(job.result).toEqual({ through: "pgbouncer" });
      expect((await direct.query("SELECT count(*)::int AS n FROM public.pooled_steps WHERE job_id = $1", [jobId])).rows[0].n).toBe(1);
    } finally {
      await stopWorkers();
    }
    await expectNoSessionStateLeft();
  }, 120_000);
});
