// `idemq doctor`, run as a real subprocess: healthy (exit 0), each finding
// with what to do about it (warnings exit 7, problems exit 8), checked at the
// boundaries. The retry horizon it reports is idemq.retry_horizon's
// (test/sql/retry-horizon.test.ts).
import { describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { migrate } from "../../src/migrate.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabases, type TestDatabase } from "../helpers/db.ts";
import { enqueue, enqueueMany, unique } from "../helpers/jobs.ts";
import { jobIn } from "../helpers/work.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const makeDatabase = useTestDatabases();

async function database(options: { empty?: boolean } = {}): Promise<TestDatabase> {
  const db = await makeDatabase(options);
  return db;
}

interface Finding {
  check: string;
  status: string;
  message: string;
  fix?: string;
  [key: string]: unknown;
}

async function doctor(db: TestDatabase, args: string[] = []): Promise<{ code: number; status: string; checks: Record<string, Finding> }> {
  const result = await runCli(["doctor", "--json", "--database-url", db.url, ...args]);
  expect(result.stderr).toBe("");
  const out = JSON.parse(result.stdout) as { status: string; checks: Finding[] };
  expect(out.checks.map((c) => c.check)).toEqual(["server", "schema", "keys", "leases", "backlog", "schedules", "workers", "flow", "bloat", "transactions"]);
  return { code: result.code, status: out.status, checks: Object.fromEntries(out.checks.map((c) => [c.check, c])) };
}

describe("idemq doctor", () => {
  it("a fresh database is healthy: every check ok, exit 0; the human report ends with Healthy.", async () => {
    const db = await database();
    const { code, status, checks } = await doctor(db);
    expect({ code, status }).toEqual({ code: EXIT.OK, status: "ok" });
    for (const check of Object.values(checks)) expect(check.status, check.check).toBe("ok");
    const { rows } = await db.pool.query<{ v: string }>("SELECT current_setting('server_version') AS v");
    expect(checks.server).toMatchObject({ message: `PostgreSQL ${rows[0]!.v}`, version: rows[0]!.v });
    expect(checks.schema).toMatchObject({ applied: [...MIGRATION_NAMES], pending: [], unknown: [] });
    expect(checks.keys).toMatchObject({ retention: "14 days", retentionSeconds: 14 * 86400 });

    const human = await runCli(["doctor", "--database-url", db.url]);
    expect(human).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = human.stdout.trimEnd().split("\n");
    expect(lines.slice(0, 10).map((line) => line.split(/\s+/).slice(0, 2).join(" "))).toEqual([
      "ok server",
      "ok schema",
      "ok keys",
      "ok leases",
      "ok backlog",
      "ok schedules",
      "ok workers",
      "ok flow",
      "ok bloat",
      "ok transactions",
    ]);
    expect(lines.at(-1)).toBe("Healthy.");
  });

  it("an older schema, one without retry_horizon() (as before the pre-release 0003), is a problem with its migrations pending; keys is skipped, leases and bloat still run", async () => {
    const db = await database({ empty: true });
    const before = 1;
    expect(MIGRATION_NAMES.length, "a migration after the release is pending").toBeGreaterThan(before);
    expect(await migrate({ connectionString: db.url, count: before })).toEqual(MIGRATION_NAMES.slice(0, before));
    // Every release has retry_horizon(): the older schema is made by hand.
    await db.pool.query("DROP FUNCTION idemq.retry_horizon");
    const { code, checks } = await doctor(db);
    expect(code).toBe(EXIT.DOCTOR_PROBLEMS);
    expect(checks.schema).toMatchObject({ status: "problem", pending: MIGRATION_NAMES.slice(before) });
    expect(checks.keys).toMatchObject({ status: "skipped", message: expect.stringContaining("retry_horizon") });
    expect(checks.leases!.status).toBe("ok");
    expect(checks.bloat!.status).toBe("ok");
  });

  it("a database without the idemq schema is a problem (exit 8), naming `idemq migrate`; the checks needing it are skipped", async () => {
    const db = await database({ empty: true });
    const { code, status, checks } = await doctor(db);
    expect({ code, status }).toEqual({ code: EXIT.DOCTOR_PROBLEMS, status: "problem" });
    expect(checks.schema).toMatchObject({
      status: "problem",
      message: "the idemq schema is not installed",
      fix: expect.stringContaining("run `idemq migrate`"),
      applied: [],
      pending: [...MIGRATION_NAMES],
    });
    for (const check of ["keys", "leases", "backlog", "schedules", "workers", "flow", "bloat"]) expect(checks[check]!.status).toBe("skipped");
    expect(checks.server!.status).toBe("ok");
    const { rows } = await db.pool.query("SELECT to_regnamespace('idemq') AS ns, to_regnamespace('idemq_meta') AS meta");
    expect(rows[0]).toEqual({ ns: null, meta: null });
  });

  it("a lease expired more than a minute ago is a warning (exit 7) saying to run rescue; 30 seconds ago is not", async () => {
    const db = await database();
    // Wide margins on each side of the minute: a loaded machine takes seconds per CLI run.
    const recent = await jobIn(db.pool, "processing");
    await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '30 seconds' WHERE id = $1", [recent]);
    const inside = await doctor(db);
    expect(inside.code).toBe(EXIT.OK);
    expect(inside.checks.leases).toMatchObject({ status: "ok", stuck: 0, expired: 1 });
    // Out of the way: its lease is renewed.
    await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() + interval '1 hour' WHERE id = $1", [recent]);

    const stuck = await jobIn(db.pool, "processing");
    await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '90 seconds' WHERE id = $1", [stuck]);
    const outside = await doctor(db);
    expect({ code: outside.code, status: outside.status }).toEqual({ code: EXIT.DOCTOR_WARNINGS, status: "warning" });
    expect(outside.checks.leases).toMatchObject({
      status: "warning",
      stuck: 1,
      expired: 1,
      message: expect.stringMatching(new RegExp(`\\(oldest: job ${stuck}, held by test-worker, expired 1m \\d+s ago\\)`)),
      fix: "run `idemq rescue` or start a worker (workers rescue on a timer)",
    });

    const human = await runCli(["doctor", "--database-url", db.url]);
    expect(human.code).toBe(EXIT.DOCTOR_WARNINGS);
    expect(human.stdout).toMatch(/^WARNING +leases +1 job\(s\) in processing whose lease expired more than 1 minute ago/m);
    expect(human.stdout).toMatch(/^ +fix: run `idemq rescue` or start a worker/m);
    expect(human.stdout.trimEnd().split("\n").at(-1)).toBe("0 problem(s), 1 warning(s).");
  });

  it("a queue whose oldest runnable job waited longer than --max-wait is a warning naming queue and task; just under it is not", async () => {
    const db = await database();
    const queue = unique("q");
    const { job_id: id } = await enqueue(db.pool, { task: "orphan", queue });
    // A live worker has it (the workers check is ok): it is only slow.
    await db.pool.query("SELECT idemq.worker_seen(worker_id => 'slow', queues => ARRAY[$1], tasks => '{orphan}')", [queue]);
    // 20 minutes against the 10-minute default; then --max-wait 30m (a wide margin each side for a loaded machine).
    await db.pool.query("UPDATE idemq.jobs SET run_at = now() - interval '20 minutes' WHERE id = $1", [id]);
    const late = await doctor(db);
    expect({ code: late.code, status: late.status }).toEqual({ code: EXIT.DOCTOR_WARNINGS, status: "warning" });
    expect(late.checks.backlog).toMatchObject({
      status: "warning",
      maxWait: "10 minutes",
      waiting: [{ queue, task: "orphan", waitedSeconds: expect.any(Number) }],
      message: expect.stringMatching(new RegExp(`^1 queue\\(s\\) with runnable jobs waiting longer than 10 minutes: ${queue} \\(oldest: task orphan in queue ${queue}, 20m`)),
      fix: expect.stringContaining("start a worker with that queue and task"),
    });
    const within = await doctor(db, ["--max-wait", "30m"]);
    expect(within.code).toBe(EXIT.OK);
    expect(within.checks.backlog).toMatchObject({ status: "ok", waiting: [] });
  });

  it("a schedule overdue by more than --max-wait (no worker ticks) is a warning; a due one within it is not", async () => {
    const db = await database();
    const name = unique("nightly");
    await db.pool.query("SELECT idemq.schedule(name => $1, cron => '@daily', task => 'report')", [name]);
    expect((await doctor(db)).checks.schedules).toMatchObject({ status: "ok", overdue: [] });
    await db.pool.query("UPDATE idemq.schedules SET next_at = now() - interval '20 minutes' WHERE name = $1", [name]);
    const late = await doctor(db);
    expect(late.code).toBe(EXIT.DOCTOR_WARNINGS);
    expect(late.checks.schedules).toMatchObject({
      status: "warning",
      overdue: [{ name, nextAt: expect.any(String), lateSeconds: expect.any(Number) }],
      message: expect.stringContaining(`1 schedule(s) have not fired when due, by more than 10 minutes (${name}: due `),
      fix: expect.stringContaining("idemq.tick()"),
    });
    expect((await doctor(db, ["--max-wait", "30m"])).checks.schedules).toMatchObject({ status: "ok" });
  });

  it("a schedule whose job tick() could not enqueue (payload_bytes lowered after it was made) is a problem naming it and the fix; raised again, the next tick clears it", async () => {
    const db = await database();
    const name = unique("report");
    await db.pool.query(`SELECT idemq.schedule(name => $1, cron => '* * * * *', task => 'report', payload => $2::jsonb)`, [
      name,
      JSON.stringify({ blob: "x".repeat(200) }),
    ]);
    // Its slot due now (on time, within misfire_grace).
    await db.pool.query("UPDATE idemq.schedules SET next_at = date_trunc('minute', now()) WHERE name = $1", [name]);
    await db.pool.query("UPDATE idemq.settings SET value = 100 WHERE name = 'payload_bytes'");
    expect((await db.pool.query("SELECT idemq.tick() AS n")).rows[0].n).toBe(0);

    const failing = await doctor(db);
    expect(failing.code).toBe(EXIT.DOCTOR_PROBLEMS);
    expect(failing.checks.schedules).toMatchObject({
      status: "problem",
      failing: [{ name, lastError: expect.stringMatching(/payload_bytes.*\(SQLSTATE 22023\)$/), lastErrorAt: expect.any(String), nextAt: expect.any(String) }],
      overdue: [],
      message: expect.stringContaining(`1 schedule(s) whose job tick() could not enqueue, so they do not fire: ${name} (payload is `),
      fix: expect.stringContaining(`idemq schedules add ${name}`),
    });
    expect(failing.checks.schedules!.fix).toContain("idemq.settings");
    const human = await runCli(["doctor", "--database-url", db.url]);
    expect(human.code).toBe(EXIT.DOCTOR_PROBLEMS);
    expect(human.stdout).toContain(name);

    await db.pool.query("UPDATE idemq.settings SET value = 1048576 WHERE name = 'payload_bytes'");
    expect((await db.pool.query("SELECT idemq.tick() AS n")).rows[0].n).toBeGreaterThanOrEqual(1);
    expect((await doctor(db)).checks.schedules).toMatchObject({ status: "ok", failing: [], overdue: [] });
  });

  it("a runnable job of a task no worker has is a warning naming the task, queue, count, age and the worker to start", async () => {
    const db = await database();
    const queue = unique("q");
    await enqueue(db.pool, { task: "orphan", queue });
    const { job_id: old } = await enqueue(db.pool, { task: "orphan", queue });
    await db.pool.query("UPDATE idemq.jobs SET run_at = now() - interval '48 minutes' WHERE id = $1", [old]);
    // A live worker with other tasks does not count.
    await db.pool.query("SELECT idemq.worker_seen(worker_id => 'other', tasks => '{mail}')");
    const found = await doctor(db);
    expect({ code: found.code, status: found.status }).toEqual({ code: EXIT.DOCTOR_WARNINGS, status: "warning" });
    expect(found.checks.workers).toEqual({
      check: "workers",
      status: "warning",
      message: expect.stringMatching(
        new RegExp(`^2 runnable job\\(s\\) that no worker seen within 2 minutes claims: task orphan in queue ${queue} \\(2 job\\(s\\), oldest 48m( \\d+s)?; no worker with it has registered\\)$`),
      ),
      fix: `start a worker with task orphan on queue ${queue} (\`idemq worker --tasks <module with orphan> --queues ${queue}\`; a worker without --queues takes every queue)`,
      workerTimeout: "2 minutes",
      liveWorkers: 1,
      unserved: [{ queue, task: "orphan", jobs: 2, oldestRunnableSeconds: expect.any(Number), lastSeenAt: null }],
    });
    const human = await runCli(["doctor", "--database-url", db.url]);
    expect(human.stdout).toMatch(/^WARNING +workers +2 runnable job\(s\) that no worker seen within 2 minutes claims: task orphan/m);
    expect(human.stdout).toMatch(/^ +fix: start a worker with task orphan on queue /m);
  });

  it("a running worker with the task clears the finding; once it stopped, the job is reported again", async () => {
    const db = await database();
    const queue = unique("q");
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    // One slot, no prefetch: the first job runs (held), the second stays runnable while the worker is there.
    const { worker } = await startTestWorker(db.url, { orphan: () => held }, { queues: [queue], concurrency: 1, prefetch: 0 });
    try {
      await enqueue(db.pool, { task: "orphan", queue });
      await waitFor(async () => (await db.pool.query("SELECT 1 FROM idemq.jobs WHERE queue = $1 AND state = 'processing'", [queue])).rowCount === 1, {
        what: "the first job running",
      });
      await enqueue(db.pool, { task: "orphan", queue });
      const covered = await doctor(db);
      expect(covered.checks.workers).toMatchObject({ status: "ok", liveWorkers: 1, unserved: [] });
      expect(covered.checks.workers!.message).toBe("every runnable job has a worker for its queue and task (1 worker(s) seen within 2 minutes)");
    } finally {
      // Stopping first (it claims nothing more), then the held job finishes: the second stays runnable.
      const stopping = worker.stop();
      release();
      await stopping;
      await stopWorkers();
    }
    // Stopped cleanly: its row is gone at once, so the job it left runnable is reported.
    expect((await doctor(db)).checks.workers).toMatchObject({ status: "warning", liveWorkers: 0, unserved: [{ queue, task: "orphan", jobs: 1 }] });
  });

  it("a stale worker row (not seen within --worker-timeout) does not count: the finding says when it was last seen", async () => {
    const db = await database();
    const queue = unique("q");
    await enqueue(db.pool, { task: "orphan", queue });
    await db.pool.query("SELECT idemq.worker_seen(worker_id => 'crashed', queues => ARRAY[$1], tasks => '{orphan}')", [queue]);
    // 10 minutes against the 2-minute default; then --worker-timeout 30m (a wide margin each side for a loaded machine).
    await db.pool.query("UPDATE idemq.workers SET last_seen_at = now() - interval '10 minutes'");
    const stale = await doctor(db);
    expect(stale.code).toBe(EXIT.DOCTOR_WARNINGS);
    expect(stale.checks.workers).toMatchObject({
      status: "warning",
      liveWorkers: 0,
      message: expect.stringMatching(/; the last worker with it was seen 10m( \d+s)? ago\)$/),
      unserved: [{ queue, task: "orphan", jobs: 1, lastSeenAt: expect.any(String) }],
    });
    const within = await doctor(db, ["--worker-timeout", "30m"]);
    expect(within.code).toBe(EXIT.OK);
    expect(within.checks.workers).toMatchObject({ status: "ok", workerTimeout: "30 minutes", liveWorkers: 1, unserved: [] });
  });

  it("key retention shorter than the longest retry horizon of an active keyed job is a warning, at the exact boundary", async () => {
    const db = await database();
    // A live worker of every queue and task: only the keys check speaks here.
    await db.pool.query("SELECT idemq.worker_seen(worker_id => 'any')");
    // Unkeyed jobs do not count, however long their retries.
    await enqueue(db.pool, { task: "unkeyed", max_attempts: 1000 });
    expect((await doctor(db)).checks.keys).toMatchObject({ status: "ok", message: expect.stringContaining("no active keyed jobs") });

    // Polynomial backoff, 25 attempts: 24 delays of at most (a-1)^4 + 15 + 29a seconds.
    const id = (await enqueue(db.pool, { task: "sync", idempotency_key: unique("key"), max_attempts: 25 })).job_id;
    let horizon = 0;
    for (let a = 1; a <= 24; a++) horizon += (a - 1) ** 4 + 15 + 29 * a;
    expect(horizon).toBe(1_440_304); // about 16.7 days

    const byDefault = await doctor(db);
    expect(byDefault.code).toBe(EXIT.DOCTOR_WARNINGS);
    expect(byDefault.checks.keys).toMatchObject({
      status: "warning",
      retention: "14 days",
      longestHorizonSeconds: horizon,
      activeKeyedJobs: 1,
      example: { jobId: id, task: "sync", backoff: "polynomial", retriesLeft: 24 },
      message: expect.stringContaining("key retention 14 days is shorter than the longest retry horizon"),
      fix: expect.stringContaining("keep keys at least 16d 16h"),
    });

    const justEnough = await doctor(db, ["--key-retention", `${horizon} seconds`]);
    expect(justEnough.code).toBe(EXIT.OK);
    expect(justEnough.checks.keys!.status).toBe("ok");
    const justShort = await doctor(db, ["--key-retention", `${horizon - 1} seconds`]);
    expect(justShort.code).toBe(EXIT.DOCTOR_WARNINGS);
    expect(justShort.checks.keys!.status).toBe("warning");
  });

  it("dead rows outnumbering live ones in idemq.jobs are a warning saying to VACUUM", async () => {
    const db = await database();
    await db.pool.query("ALTER TABLE idemq.jobs SET (autovacuum_enabled = false)");
    const writer = await db.newClient();
    await enqueueMany(writer, Array.from({ length: 1200 }, (_, i) => ({ task: "bulk", payload: { i } })));
    for (let round = 0; round < 4; round++) await writer.query("UPDATE idemq.jobs SET priority = priority + 1");
    await writer.query("SELECT pg_stat_force_next_flush()");
    // Statistics reach the shared view when the writer's session goes idle: wait for them.
    const deadline = Date.now() + 20_000;
    for (;;) {
      const { rows } = await db.pool.query<{ live: string; dead: string }>(
        "SELECT n_live_tup AS live, n_dead_tup AS dead FROM pg_stat_user_tables WHERE relid = 'idemq.jobs'::regclass",
      );
      if (Number(rows[0]!.live) === 1200 && Number(rows[0]!.dead) > 1200) break;
      if (Date.now() > deadline) throw new Error(`statistics never showed the dead rows: ${JSON.stringify(rows[0])}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const { code, checks } = await doctor(db);
    expect(code).toBe(EXIT.DOCTOR_WARNINGS);
    expect(checks.bloat).toMatchObject({
      status: "warning",
      liveRows: 1200,
      message: expect.stringMatching(/^idemq\.jobs holds \d+ dead rows for 1200 live ones \(last vacuum: never\)/),
      fix: expect.stringContaining("run `VACUUM (ANALYZE) idemq.jobs`"),
    });
    expect(checks.bloat!.deadRows as number).toBeGreaterThan(1200);
  });

  it("a transaction holding back xmin longer than --long-transaction is a warning naming its PID and the fix", async () => {
    const db = await database();
    const holder = await db.newClient();
    await holder.query("SET application_name = 'report-exporter'");
    await holder.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
    await holder.query("SELECT count(*) FROM idemq.jobs");
    const pid = (await holder.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]!.pid;

    const short = await doctor(db, ["--long-transaction", "0s"]);
    expect(short.code).toBe(EXIT.DOCTOR_WARNINGS);
    expect(short.checks.transactions).toMatchObject({
      status: "warning",
      message: expect.stringContaining(`the oldest, PID ${pid} (report-exporter, postgres), idle in transaction for`),
      fix: expect.stringContaining(`SELECT pg_terminate_backend(${pid})`),
      transactions: [expect.objectContaining({ pid, application: "report-exporter", state: "idle in transaction" })],
    });

    const long = await doctor(db, ["--long-transaction", "1h"]);
    expect(long.code).toBe(EXIT.OK);
    expect(long.checks.transactions).toMatchObject({ status: "ok", message: "no transaction open longer than 1 hour" });
    await holder.query("ROLLBACK");
  });

  it("a bad --key-retention, --long-transaction or --worker-timeout: one line, exit 2", async () => {
    const db = await database();
    for (const args of [["--key-retention", "forever"], ["--long-transaction", "5 parsecs"], ["--worker-timeout", "soon"]]) {
      const result = await runCli(["doctor", "--database-url", db.url, ...args]);
      expect(result).toMatchObject({ code: EXIT.USAGE, stdout: "" });
      expect(result.stderr.trimEnd().split("\n")).toHaveLength(1);
    }
  });
});
