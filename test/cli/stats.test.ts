// `idemq stats` and `stats --watch`, run as real subprocesses: counts per
// queue, task and state, expired leases, the oldest runnable job, events per
// task, as a table and as --json; --watch redraws until SIGINT and exits 0.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { installationRoles } from "../../src/roles.ts";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { runCli } from "../helpers/cli.ts";
import { killAll, startCli } from "../helpers/cli-spawn.ts";
import { useTestDatabases, type TestDatabase } from "../helpers/db.ts";
import { enqueue, enqueueMany, unique } from "../helpers/jobs.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";
import { jobIn } from "../helpers/work.ts";

const makeDatabase = useTestDatabases();
let db: TestDatabase;
let queue: string;
let task: string;

beforeAll(async () => {
  db = await makeDatabase();
  queue = unique("q");
  task = unique("task");
  // 1 failed, 1 processing whose lease ran out (each made while alone in the
  // queue, so its claim takes it), 1 scheduled tomorrow, 3 enqueued (one of
  // them runnable for an hour).
  await jobIn(db.pool, "failed", { task, queue });
  const lost = await jobIn(db.pool, "processing", { task, queue });
  await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [lost]);
  await jobIn(db.pool, "scheduled", { task, queue });
  const key = unique("key");
  const keyed = await enqueue(db.pool, { task, queue, idempotency_key: key, payload: { n: 1 } });
  await enqueue(db.pool, { task, queue });
  await enqueue(db.pool, { task, queue });
  await db.pool.query("UPDATE idemq.jobs SET run_at = now() - interval '1 hour', created_at = now() - interval '1 hour' WHERE id = $1", [keyed.job_id]);
  // Events: 2 deduplicated enqueues, 1 bulk rejection, 1 guard duplicate.
  await enqueue(db.pool, { task, queue, idempotency_key: key, payload: { n: 1 } });
  await enqueue(db.pool, { task, queue, idempotency_key: key, payload: { n: 1 } });
  const done = unique("done");
  await jobIn(db.pool, "succeeded", { task, queue: unique("q"), idempotency_key: done });
  await enqueueMany(db.pool, [{ task, idempotency_key: done, duplicate_policy: "reject_always" }]);
  const guardKey = unique("guard");
  await db.pool.query("SELECT idemq.guard(key => $1, task => $2)", [guardKey, task]);
  await db.pool.query("SELECT idemq.guard(key => $1, task => $2)", [guardKey, task]);
});
afterAll(async () => {
  killAll();
});

describe("idemq stats", () => {
  it("--json: counts per queue, task and state, expired leases, oldest runnable age, events per task", async () => {
    const result = await runCli(["stats", "--json", "--database-url", db.url]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const report = JSON.parse(result.stdout);
    const row = report.jobs.find((j: { queue: string; task: string }) => j.queue === queue && j.task === task);
    expect(row).toEqual({
      queue,
      task,
      scheduled: 1,
      enqueued: 3,
      processing: 1,
      awaiting: 0,
      succeeded: 0,
      failed: 1,
      expired: 0,
      cancelled: 0,
      leaseExpired: 1,
      oldestRunnableSeconds: expect.any(Number),
      waitingFor: "worker",
    });
    expect(row.oldestRunnableSeconds).toBeGreaterThanOrEqual(3600);
    expect(row.oldestRunnableSeconds).toBeLessThan(3600 + 60);
    expect(report.events).toContainEqual({ task, deduplicated: 2, rejected: 1, conflict: 0, guardDuplicate: 1 });
    expect(report.totals).toMatchObject({ enqueued: 3, scheduled: 1, processing: 1, failed: 1, succeeded: 1, leaseExpired: 1 });
    expect(report.totals.oldestRunnableSeconds).toBe(row.oldestRunnableSeconds);
    expect(Date.parse(report.at)).not.toBeNaN();
  });

  it("prints a table per queue and task with a total row, an events table, and what to do about expired leases", async () => {
    const result = await runCli(["stats", "--database-url", db.url]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = result.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(
      /^QUEUE +TASK +SCHEDULED {2}ENQUEUED {2}PROCESSING {2}AWAITING {2}SUCCEEDED {2}FAILED {2}EXPIRED {2}CANCELLED {2}LEASE EXPIRED {2}OLDEST RUNNABLE {2}WAITING FOR$/,
    );
    const row = lines.find((line) => line.startsWith(`${queue} `));
    expect(row?.split(/\s{2,}/)).toEqual([queue, task, "1", "3", "1", "0", "0", "1", "0", "0", "1", expect.stringMatching(/^1h( \d+m)?$/), "worker"]);
    // Right-aligned numbers: the enqueued count ends where its header ends.
    const end = lines[0]!.indexOf("ENQUEUED") + "ENQUEUED".length;
    expect(row!.slice(end - "ENQUEUED".length, end)).toBe("       3");
    expect(lines.find((line) => line.startsWith("total "))?.split(/\s{2,}/).slice(1, 10)).toEqual(["1", "3", "1", "0", "1", "1", "0", "0", "1"]);
    expect(lines).toContainEqual(expect.stringMatching(/^TASK +DEDUPLICATED {2}REJECTED {2}CONFLICT {2}GUARD DUPLICATE$/));
    expect(lines.find((line) => line.startsWith(`${task} `))?.split(/\s{2,}/)).toEqual([task, "2", "1", "0", "1"]);
    expect(lines.at(-1)).toBe("1 job(s) hold an expired lease: run `idemq rescue` or start a worker.");
  });

  it("--queue and --task keep only their rows, and the totals are theirs; events (per task) go with --task only", async () => {
    const byQueue = await runCli(["stats", "--queue", queue, "--json", "--database-url", db.url]);
    expect(byQueue).toMatchObject({ code: EXIT.OK, stderr: "" });
    const report = JSON.parse(byQueue.stdout);
    expect(report.jobs.map((j: { queue: string; task: string }) => [j.queue, j.task])).toEqual([[queue, task]]);
    expect(report.events).toEqual([]);
    // The succeeded job of this task is in another queue: not counted.
    expect(report.totals).toMatchObject({ scheduled: 1, enqueued: 3, processing: 1, failed: 1, succeeded: 0, leaseExpired: 1 });

    const byTask = JSON.parse((await runCli(["stats", "--task", task, "--json", "--database-url", db.url])).stdout);
    expect(new Set(byTask.jobs.map((j: { task: string }) => j.task))).toEqual(new Set([task]));
    expect(byTask.jobs).toHaveLength(2);
    expect(byTask.events).toEqual([{ task, deduplicated: 2, rejected: 1, conflict: 0, guardDuplicate: 1 }]);
    expect(byTask.totals).toMatchObject({ enqueued: 3, succeeded: 1 });

    const human = await runCli(["stats", "--queue", queue, "--task", task, "--database-url", db.url]);
    const lines = human.stdout.trimEnd().split("\n");
    // The counts table is the first block; the rates table below repeats the queue.
    const counts = lines.slice(0, lines.indexOf(""));
    expect(counts.filter((line) => line.startsWith(`${queue} `))).toHaveLength(1);
    expect(lines.some((line) => line.startsWith("TASK "))).toBe(false);
    expect(lines.filter((line) => /^QUEUE +TASK +SUCCEEDED \(5 MIN\)/.test(line))).toHaveLength(1);
  });

  it("an empty queue says so", async () => {
    const empty = await makeDatabase();
    const human = await runCli(["stats", "--database-url", empty.url]);
    expect(human).toMatchObject({ code: EXIT.OK, stdout: "No jobs yet.\n", stderr: "" });
    const json = JSON.parse((await runCli(["stats", "--json", "--database-url", empty.url])).stdout);
    expect(json).toMatchObject({ jobs: [], events: [], totals: { enqueued: 0, oldestRunnableSeconds: null } });
    expect(json.waiting).toEqual({ paused: 0, held: 0, concurrency: 0, rate: 0, worker: 0 });
  });

  it("says why each queue and task's runnable jobs wait (paused, held, concurrency, rate, worker) and splits the enqueued jobs by it, in the table and --json", async () => {
    const own = await makeDatabase();
    const q = unique("q");
    const [paused, full, rated, free] = ["paused", "full", "rated", "free"].map((t) => unique(t)) as [string, string, string, string];
    for (const t of [paused, full, full, rated, rated, free]) await enqueue(own.pool, { task: t, queue: q });
    await enqueue(own.pool, { task: free, queue: q, run_at: new Date(Date.now() + 86_400_000) });
    await own.pool.query("SELECT idemq.pause(task => $1)", [paused]);
    await own.pool.query("SELECT idemq.set_limit(task => $1, concurrency => 1)", [full]);
    await own.pool.query("SELECT idemq.set_limit(task => $1, rate => 1, per => '1 hour')", [rated]);
    for (const t of [full, rated]) await own.pool.query("SELECT * FROM idemq.claim(worker_id => 'w', tasks => $1)", [[t]]);

    const result = await runCli(["stats", "--json", "--database-url", own.url]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const report = JSON.parse(result.stdout);
    const waitingOf = Object.fromEntries(report.jobs.map((j: { task: string; waitingFor: string | null }) => [j.task, j.waitingFor]));
    expect(waitingOf).toEqual({ [paused]: "paused", [full]: "concurrency", [rated]: "rate", [free]: "worker" });
    expect(report.waiting).toEqual({ paused: 1, held: 0, concurrency: 1, rate: 1, worker: 1 });

    const human = (await runCli(["stats", "--database-url", own.url])).stdout.trimEnd().split("\n");
    const cell = (t: string) => human.find((line) => line.startsWith(`${q} `) && line.includes(` ${t} `))?.split(/\s{2,}/).at(-1);
    expect([paused, full, rated, free].map(cell)).toEqual(["paused", "concurrency", "rate", "worker"]);
    expect(human).toContain(
      "Not running: 4 enqueued (1 wait for a worker, 1 paused, 1 wait for a slot (concurrency), 1 wait for the rate (no start left in the period)); 1 scheduled.",
    );
  });

  it("--watch --json prints a report per interval until SIGINT, then exits 0", async () => {
    const watcher = startCli(["stats", "--watch", "0.2", "--json", "--database-url", db.url]);
    await watcher.waitForLine((line) => line.startsWith("{"));
    // A second report: the first line is complete, so wait for two lines.
    await watcher.waitForLine(() => watcher.stdout().split("\n").filter((l) => l !== "").length >= 2);
    watcher.child.kill("SIGINT");
    const { code, signal, stdout, stderr } = await watcher.exited;
    expect({ code, signal, stderr }).toEqual({ code: EXIT.OK, signal: null, stderr: "" });
    const reports = stdout.trimEnd().split("\n").map((line) => JSON.parse(line));
    expect(reports.length).toBeGreaterThanOrEqual(2);
    for (const report of reports) {
      expect(report.jobs.find((j: { queue: string }) => j.queue === queue)).toMatchObject({ enqueued: 3, failed: 1 });
    }
    expect(Date.parse(reports[1].at)).toBeGreaterThan(Date.parse(reports[0].at));
  });

  it("--watch without --json redraws the table under a header line; SIGTERM also ends it with 0", async () => {
    const watcher = startCli(["stats", "--watch", "0.2", "--database-url", db.url]);
    await watcher.waitForLine(() => (watcher.stdout().match(/^idemq stats at /gm) ?? []).length >= 2);
    watcher.child.kill("SIGTERM");
    const { code, stdout, stderr } = await watcher.exited;
    expect({ code, stderr }).toEqual({ code: EXIT.OK, stderr: "" });
    expect(stdout).toMatch(/^idemq stats at \S+Z \(every 0\.2s; Ctrl-C to stop\)\nQUEUE +TASK/m);
    expect(stdout).not.toContain("\x1b["); // not a terminal: no screen clearing
  });

  it("rates over --window: jobs finished per minute and the share that failed, per queue and task, from overview()", async () => {
    const json = JSON.parse((await runCli(["stats", "--json", "--database-url", db.url])).stdout);
    expect(json.windowMinutes).toBe(5);
    expect(json.rates).toContainEqual({ queue, task, succeeded: 0, failed: 1, perMinute: 0.2, failureRate: 1 });
    expect(json.rates.find((r: { task: string; queue: string }) => r.task === task && r.queue !== queue)).toMatchObject({
      succeeded: 1,
      failed: 0,
      failureRate: 0,
    });
    expect(json).not.toHaveProperty("ratesUnavailable");

    const hour = JSON.parse((await runCli(["stats", "--window", "60", "--queue", queue, "--json", "--database-url", db.url])).stdout);
    expect(hour).toMatchObject({ windowMinutes: 60, rates: [{ queue, task, succeeded: 0, failed: 1, failureRate: 1 }] });
    expect(hour.rates[0].perMinute).toBeCloseTo(1 / 60, 10);

    const human = (await runCli(["stats", "--queue", queue, "--database-url", db.url])).stdout.trimEnd().split("\n");
    const header = human.findIndex((line) => /^QUEUE +TASK +SUCCEEDED \(5 MIN\) {2}FAILED \(5 MIN\) {2}PER MIN {2}FAILURE RATE$/.test(line));
    expect(header).toBeGreaterThan(0);
    expect(human[header + 1]?.split(/\s{2,}/)).toEqual([queue, task, "0", "1", "0.2", "100.0 %"]);
  });

  it("a role that may not call overview() gets the counts and one line saying the rates need the installation's admin or viewer role", async () => {
    const worker = await createLoginRole("stats_rates", { memberOf: [(await installationRoles(db.pool)).worker] });
    try {
      const json = await runCli(["stats", "--queue", queue, "--json", "--database-url", worker.urlFor(db.name)]);
      expect(json).toMatchObject({ code: EXIT.OK, stderr: "" });
      const report = JSON.parse(json.stdout);
      expect(report.jobs.find((j: { queue: string }) => j.queue === queue)).toMatchObject({ enqueued: 3, failed: 1 });
      expect(report.rates).toBeNull();
      expect(report.ratesUnavailable).toBe("rates need EXECUTE on idemq.overview() (the installation's admin or viewer role, `idemq roles list`); the counts are complete");
      const human = await runCli(["stats", "--queue", queue, "--database-url", worker.urlFor(db.name)]);
      expect(human.stdout.trimEnd().split("\n")).toContain(
        "No rates: rates need EXECUTE on idemq.overview() (the installation's admin or viewer role, `idemq roles list`); the counts are complete.",
      );
    } finally {
      await dropLoginRoles();
    }
  });

  it("the viewer role may call overview(): it gets the rates, as the message about the rates says", async () => {
    const viewer = await createLoginRole("stats_viewer", { memberOf: [(await installationRoles(db.pool)).viewer] });
    try {
      const json = await runCli(["stats", "--queue", queue, "--json", "--database-url", viewer.urlFor(db.name)]);
      expect(json).toMatchObject({ code: EXIT.OK, stderr: "" });
      const report = JSON.parse(json.stdout);
      expect(report).not.toHaveProperty("ratesUnavailable");
      expect(report.rates).toEqual([expect.objectContaining({ queue, task, succeeded: 0, failed: 1 })]);
    } finally {
      await dropLoginRoles();
    }
  });

  it("a bad --window: one line naming the range, exit 2", async () => {
    for (const bad of ["0", "1.5", "1441", "an hour"]) {
      const result = await runCli(["stats", "--window", bad, "--database-url", db.url]);
      expect(result.code).toBe(EXIT.USAGE);
      expect(result.stderr.trimEnd().split("\n")).toEqual([expect.stringContaining("give the window in whole minutes, from 1 to 1440")]);
    }
  });

  it("a bad --watch interval: one line, exit 2", async () => {
    const result = await runCli(["stats", "--watch", "0", "--database-url", db.url]);
    expect(result.code).toBe(EXIT.USAGE);
    expect(result.stderr.trimEnd().split("\n")).toEqual([expect.stringContaining("give the seconds between redraws, from 0.1 to 3600")]);
  });
});
