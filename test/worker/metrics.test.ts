// Prometheus metrics (issue 14 item 2): a real `idemq worker --metrics-port`
// process does known work, /metrics is scraped over HTTP and read with a
// strict text-format parser (test/helpers/prometheus-text.ts), and every
// counter and histogram count is asserted against that work. A database that
// does not answer leaves the scrape answering, with idemq_database_up 0.
// Jobs a completion hands over are counted (worker:handed), and with the
// claimed ones they are every job the worker ran.
import { spawn } from "node:child_process";
import { createServer, type Server, type Socket } from "node:net";
import type { AddressInfo } from "node:net";
import { prometheusContentType, register as globalRegistry, Registry } from "prom-client";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { installationRoles } from "../../src/roles.ts";
import { RUNNABLE_WAITS } from "../../src/contract.ts";
import { Client, collectDatabaseMetrics, collectWorkerMetrics, createWorker, serveMetrics } from "../../src/index.ts";
import { CLI, runCli } from "../helpers/cli.ts";
import { freshDatabase, useTestDatabase } from "../helpers/db.ts";
import { parsePrometheusText, sampleValue, type Family } from "../helpers/prometheus-text.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";
import { killAllWorkers, startedWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterEach(async () => {
  await killAllWorkers();
});
afterAll(async () => {
  await db.drop();
  await dropLoginRoles();
});

async function scrape(url: string): Promise<{ families: Map<string, Family>; contentType: string | null }> {
  const response = await fetch(url);
  expect(response.status).toBe(200);
  return { families: parsePrometheusText(await response.text()), contentType: response.headers.get("content-type") };
}

const N = 5; // ok: succeed
const M = 3; // flaky: fail once, then succeed
const K = 2; // nap: snooze once, then succeed

describe("idemq worker --metrics-port", () => {
  it("counts the work it did: attempts by outcome, durations, claims, and the database's figures", async () => {
    // All enqueued before the worker starts, so the second enqueue of the key finds its job active.
    for (let i = 0; i < N - 1; i++) await client.enqueue("ok", {});
    await client.enqueue("ok", { n: 1 }, { idempotencyKey: "ok-1" });
    expect((await client.enqueue("ok", { n: 1 }, { idempotencyKey: "ok-1" })).deduplicated).toBe(true);
    for (let i = 0; i < M; i++) await client.enqueue("flaky", {});
    for (let i = 0; i < K; i++) await client.enqueue("nap", {});
    await client.enqueue("doomed", {});
    await client.enqueue("credit", { order: 7 });
    await client.enqueue("credit", { order: 7 }); // the same guard key: a duplicate

    const worker = await startedWorker({ tasks: "metrics-tasks.ts", databaseUrl: db.url, args: ["--metrics-port", "0"] });
    const started = worker.events.find((e) => e.event === "worker:started")!;
    const url = String(started.metricsUrl);

    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/); // loopback unless told otherwise

    await worker.waitForEvent(
      () => worker.count("job:success") === N + M + K + 1 && worker.count("job:duplicate") === 1 && worker.count("job:failed") === 1,
      "every job finished",
    );
    // The key's job has succeeded: reject_always now rejects it (counted: enqueue_many does not raise).
    const [rejected] = await client.enqueueMany([{ task: "ok", payload: { n: 1 }, idempotencyKey: "ok-1", duplicatePolicy: "reject_always" }]);
    expect(rejected!.outcome).toBe("rejected");

    const { families, contentType } = await scrape(url);
    expect(contentType).toBe(prometheusContentType);
    const v = (name: string, labels: Record<string, string> = {}) => sampleValue(families, name, labels);

    const expected: Record<string, Record<string, number>> = {
      idemq_worker_jobs_started_total: { ok: N, flaky: 2 * M, nap: 2 * K, doomed: 1, credit: 2 },
      idemq_worker_jobs_succeeded_total: { ok: N, flaky: M, nap: K, credit: 1 },
      idemq_worker_jobs_retried_total: { flaky: M },
      idemq_worker_jobs_failed_total: { doomed: 1 },
      idemq_worker_jobs_snoozed_total: { nap: K },
      idemq_worker_jobs_duplicate_total: { credit: 1 },
      idemq_worker_job_duration_seconds_count: { ok: N, flaky: 2 * M, nap: 2 * K, doomed: 1, credit: 2 },
    };
    for (const [name, byTask] of Object.entries(expected)) {
      const family = families.get(name.replace(/_count$/, ""))!;
      expect(family, name).toBeDefined();
      // No series beyond the expected ones (e.g. no retried count for ok).
      const tasks = family.samples.filter((s) => s.name === name).map((s) => s.labels.task).sort();
      expect(tasks, name).toEqual(Object.keys(byTask).sort());
      for (const [task, n] of Object.entries(byTask)) {
        const labels: Record<string, string> = name.endsWith("_count") ? { task } : { task, queue: "default" };
        expect(v(name, labels), `${name}{task="${task}"}`).toBe(n);
      }
    }
    expect(families.get("idemq_worker_jobs_lease_lost_total")!.samples).toEqual([]);
    expect(families.get("idemq_worker_job_duration_seconds")!.type).toBe("histogram");

    const attempts = N + 2 * M + 2 * K + 1 + 2;
    expect(v("idemq_worker_claim_batch_size_sum")).toBe(attempts);
    // Second attempts come due only after first ones ended: at least two claims brought jobs.
    expect(v("idemq_worker_claim_batch_size_count") - v("idemq_worker_claim_batch_size_bucket", { le: "0" })).toBeGreaterThanOrEqual(2);

    expect(v("idemq_worker_jobs_in_flight")).toBe(0);
    expect(v("idemq_worker_buffered_jobs")).toBe(0);
    expect(v("idemq_worker_buffered_bytes")).toBe(0);
    expect(v("idemq_worker_wake_up_mode", { mode: "listen" })).toBe(1);
    expect(v("idemq_worker_wake_up_mode", { mode: "poll" })).toBe(0);
    // A direct connection keeps its session: the per-job calls are prepared. No job had a key: none was handed.
    expect(v("idemq_worker_prepared_statements")).toBe(1);
    expect(v("idemq_worker_jobs_handed_total")).toBe(0);
    expect(v("idemq_worker_reconnects_total")).toBe(0);
    expect(v("idemq_worker_errors_total")).toBe(0);

    // The database, through stats().
    expect(v("idemq_database_up")).toBe(1);
    const jobs = (task: string, state: string) => v("idemq_jobs", { queue: "default", task, state });
    expect(jobs("ok", "succeeded")).toBe(N);
    expect(jobs("flaky", "succeeded")).toBe(M);
    expect(jobs("nap", "succeeded")).toBe(K);
    expect(jobs("doomed", "failed")).toBe(1);
    expect(jobs("credit", "succeeded")).toBe(2);
    expect(jobs("ok", "enqueued")).toBe(0); // every state of a (queue, task) is there, zeros too
    expect(families.get("idemq_jobs")!.samples).toHaveLength(5 * 8);
    expect(v("idemq_jobs_lease_expired", { queue: "default", task: "ok" })).toBe(0);
    expect(v("idemq_oldest_runnable_age_seconds", { queue: "default", task: "ok" })).toBe(0);
    expect(families.get("idemq_enqueue_deduplicated_total")!.type).toBe("counter");
    expect(v("idemq_enqueue_deduplicated_total", { task: "ok" })).toBe(1);
    expect(v("idemq_enqueue_rejected_total", { task: "ok" })).toBe(1);
    expect(v("idemq_guard_duplicates_total", { task: "credit" })).toBe(1);
    expect(families.get("idemq_enqueue_conflict_total")!.samples).toEqual([]);

    // Labels stay bounded: task, queue, state, le, mode, reason (RUNNABLE_WAITS); never a job id, key or worker id.
    const labelNames = new Set([...families.values()].flatMap((f) => f.samples.flatMap((s) => Object.keys(s.labels))));
    expect([...labelNames].sort()).toEqual(["le", "mode", "queue", "reason", "state", "task"]);
    expect(new Set(families.get("idemq_jobs_waiting")!.samples.map((s) => s.labels.reason))).toEqual(new Set(RUNNABLE_WAITS));
    for (const family of families.values()) expect(family.name).toMatch(/^idemq_/);

    expect((await fetch(url.replace(/\/metrics$/, "/other"))).status).toBe(404);
  });

  it("shows a waiting job's age and a job of a task no worker has", async () => {
    const other = await freshDatabase({ poolSize: 2 });
    try {
      const otherClient = new Client({ pool: other.pool });
      await otherClient.enqueue("nobody_has_it", {}, { queue: "q2" });
      await other.pool.query("UPDATE idemq.jobs SET run_at = now() - interval '90 seconds', created_at = now() - interval '90 seconds'");
      const worker = await startedWorker({ tasks: "metrics-tasks.ts", databaseUrl: other.url, args: ["--metrics-port", "0"] });
      const { families } = await scrape(String(worker.events.find((e) => e.event === "worker:started")!.metricsUrl));
      expect(sampleValue(families, "idemq_jobs", { queue: "q2", task: "nobody_has_it", state: "enqueued" })).toBe(1);
      expect(sampleValue(families, "idemq_oldest_runnable_age_seconds", { queue: "q2", task: "nobody_has_it" })).toBeGreaterThanOrEqual(90);
    } finally {
      await killAllWorkers();
      await other.drop();
    }
  });

  it("as a non-superuser login in idemq_worker only, serves the database's metrics too (stats() is the worker role's)", async () => {
    const login = await createLoginRole("metrics_worker", { memberOf: [(await installationRoles(db.pool)).worker] });
    await client.enqueue("parked", {}, { queue: "nobody-works-this" });
    const worker = await startedWorker({
      tasks: "metrics-tasks.ts",
      databaseUrl: login.urlFor(db.name),
      args: ["--metrics-port", "0", "--queues", "metrics-role"],
    });
    const url = String(worker.events.find((e) => e.event === "worker:started")!.metricsUrl);
    const { families } = await scrape(url);
    expect(sampleValue(families, "idemq_database_up")).toBe(1);
    expect(sampleValue(families, "idemq_jobs", { queue: "nobody-works-this", task: "parked", state: "enqueued" })).toBe(1);
    expect(worker.count("worker:error")).toBe(0);
    // Still least privilege: the same login reads no payload.
    const session = await login.connect(db.name);
    await expect(session.query("SELECT payload FROM idemq.jobs LIMIT 1")).rejects.toMatchObject({ code: "42501" });
  });

  it("refuses --metrics-host without --metrics-port, a bad port, and a port in use", async () => {
    const noPort = await runCli(["worker", "--database-url", db.url, "--tasks", "test/fixtures/worker/metrics-tasks.ts", "--metrics-host", "127.0.0.1"]);
    expect(noPort.code).toBe(2);
    expect(noPort.stderr).toContain("--metrics-host needs --metrics-port");
    const badPort = await runCli(["worker", "--database-url", db.url, "--tasks", "test/fixtures/worker/metrics-tasks.ts", "--metrics-port", "70000"]);
    expect(badPort.code).toBe(2);
    expect(badPort.stderr).toContain("must be a port number from 0 to 65535");

    const taken = await listening(createServer());
    try {
      const port = (taken.address() as AddressInfo).port;
      const inUse = await runCli(["worker", "--database-url", db.url, "--tasks", "test/fixtures/worker/metrics-tasks.ts", "--metrics-port", String(port)]);
      expect(inUse.code).toBe(1);
      expect(inUse.stderr.trim().split("\n")).toEqual([`idemq: --metrics-port: 127.0.0.1:${port} is in use`]);
    } finally {
      await new Promise((resolve) => taken.close(resolve));
    }
  });
});

describe("idemq metrics", () => {
  it("serves the database's metrics alone, on loopback, until SIGTERM", async () => {
    await client.enqueue("standalone", {}, { queue: "solo" });
    const child = spawn(process.execPath, [CLI, "metrics", "--port", "0", "--database-url", db.url], { stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    try {
      const url = await waitFor(() => /metrics at (\S+)/.exec(stderr)?.[1], { what: `the metrics URL (stderr: ${stderr})` });
      expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
      const { families } = await scrape(url);
      expect(sampleValue(families, "idemq_database_up")).toBe(1);
      expect(sampleValue(families, "idemq_jobs", { queue: "solo", task: "standalone", state: "enqueued" })).toBe(1);
      expect([...families.keys()].filter((name) => name.startsWith("idemq_worker_"))).toEqual([]);
    } finally {
      child.kill("SIGTERM");
    }
    expect(await exited).toBe(0);
  });

  it("--help has an example, and idemq worker --help one with --metrics-port", async () => {
    const help = await runCli(["metrics", "--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/\nExamples:\n {2}idemq metrics /);
    const workerHelp = await runCli(["worker", "--help"]);
    expect(workerHelp.stdout).toMatch(/^ {2}idemq worker --tasks \.\/tasks\.js --metrics-port 9464 /m);
    expect(workerHelp.stdout).toContain("--metrics-host <host>");
  });
});

describe("collectWorkerMetrics", () => {
  it("uses a registry of its own or the one given, never the global one, and close() takes its metrics off", async () => {
    const worker = createWorker({ connectionString: "postgres://unused@127.0.0.1:1/x", tasks: { ok: async () => {} }, handleSignals: false });
    const own = await collectWorkerMetrics(worker);
    expect(own.registry).not.toBe(globalRegistry);
    expect(own.registry.getSingleMetric("idemq_worker_jobs_started_total")).toBeDefined();
    expect(await globalRegistry.getMetricsAsJSON()).toEqual([]);
    await own.close();
    expect(own.registry.getSingleMetric("idemq_worker_jobs_started_total")).toBeUndefined();

    const mine = new Registry();
    const given = await collectWorkerMetrics(worker, { registry: mine });
    expect(given.registry).toBe(mine);
    worker.emit("job:start", { jobId: "1", task: "ok", queue: "q", attempt: 1, workerId: worker.workerId, reclaimed: false });
    const families = parsePrometheusText(await mine.metrics());
    expect(sampleValue(families, "idemq_worker_jobs_started_total", { task: "ok", queue: "q" })).toBe(1);
    await given.close();
    worker.emit("job:start", { jobId: "2", task: "ok", queue: "q", attempt: 1, workerId: worker.workerId, reclaimed: false });
    expect(mine.getMetricsAsArray()).toEqual([]); // no metric left, no listener left to count that start
    expect(worker.listenerCount("job:start")).toBe(0);
    await worker.stop();
  });
});

describe("jobs handed over by a completion", () => {
  it("worker:handed and idemq_worker_jobs_handed_total count them; with the claimed ones they are every job run", async () => {
    const queue = `handed-${process.pid}-${Date.now()}`;
    const keys = 6;
    const perKey = 8;
    const jobs = [];
    for (let i = 0; i < perKey; i++) {
      for (let k = 0; k < keys; k++) jobs.push({ task: "keyed", queue, payload: { k, i }, concurrencyKey: `${queue}:${k}` });
    }
    await client.enqueueMany(jobs);
    const worker = createWorker({ pool: db.pool, queues: [queue], concurrency: 3, tasks: { keyed: async () => {} }, handleSignals: false });
    const registry = new Registry();
    const metrics = await collectWorkerMetrics(worker, { registry });
    let handedEvents = 0;
    worker.on("worker:handed", (e) => {
      expect(e.jobs).toBeGreaterThan(0);
      expect(e.workerId).toBe(worker.workerId);
      handedEvents += e.jobs;
    });
    try {
      await worker.start();
      await waitFor(async () => {
        const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state = 'succeeded'", [queue]);
        return rows[0].n === keys * perKey;
      }, { what: "every keyed job succeeded" });
      const families = parsePrometheusText(await registry.metrics());
      const handed = sampleValue(families, "idemq_worker_jobs_handed_total", {});
      expect(handed).toBe(handedEvents);
      expect(handed).toBeGreaterThan(0);
      // Each job ran once (attempt 1), and came either from a claim or from a hand-off.
      const { rows } = await db.pool.query("SELECT max(attempt) AS a FROM idemq.jobs WHERE queue = $1", [queue]);
      expect(rows[0].a).toBe(1);
      expect(sampleValue(families, "idemq_worker_claim_batch_size_sum", {}) + handed).toBe(keys * perKey);
    } finally {
      await worker.stop();
      await metrics.close();
    }
  });
});

describe("a database that does not answer", () => {
  it("leaves the scrape answering within the timeout, with the worker's metrics and idemq_database_up 0", async () => {
    // A server that accepts connections and never says a word: a hung database.
    const sockets = new Set<Socket>();
    const silent = await listening(createServer((socket) => sockets.add(socket)));
    const silentUrl = `postgres://nobody@127.0.0.1:${(silent.address() as AddressInfo).port}/none`;
    const worker = createWorker({ connectionString: silentUrl, tasks: { ok: async () => {} }, handleSignals: false });
    const database = await collectDatabaseMetrics({ connectionString: silentUrl, timeout: "300ms" });
    const workerMetrics = await collectWorkerMetrics(worker, { registry: database.registry });
    const server = await serveMetrics(database.registry, { port: 0 });
    try {
      const before = performance.now();
      const { families } = await scrape(server.url);
      expect(performance.now() - before).toBeLessThan(5_000);
      expect(sampleValue(families, "idemq_database_up")).toBe(0);
      expect(sampleValue(families, "idemq_database_scrape_duration_seconds")).toBeGreaterThanOrEqual(0.29);
      expect(families.get("idemq_jobs")!.samples).toEqual([]);
      expect(sampleValue(families, "idemq_worker_jobs_in_flight")).toBe(0);
      expect(sampleValue(families, "idemq_worker_wake_up_mode", { mode: "listen" })).toBe(1);
    } finally {
      await server.close();
      await workerMetrics.close();
      await database.close();
      await worker.stop();
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => silent.close(resolve));
    }
    // The same code reads a database that answers.
    const answering = await collectDatabaseMetrics({ connectionString: db.url });
    try {
      expect(sampleValue(parsePrometheusText(await answering.registry.metrics()), "idemq_database_up")).toBe(1);
    } finally {
      await answering.close();
    }
  });
});

function listening(server: Server): Promise<Server> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve(server));
  });
}
