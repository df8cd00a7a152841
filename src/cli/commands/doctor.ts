// idemq doctor [--key-retention 14d] [--long-transaction 5m]
//
// Nearly 600 lines for a reason: one function per check, each with its own
// query, message and fix; split up, one report would live in several files.
//
// Checks, each with what to do about a finding:
//   server       PostgreSQL 15 or later
//   schema       the migrations applied match this package's (none pending, none unknown)
//   keys         the key retention outlives the longest retry horizon of the
//                active keyed jobs (the sum of their remaining backoff delays,
//                worst case), so a retried or replayed enqueue still finds its key
//   leases       no job in processing whose lease expired more than a minute ago
//   backlog      no queue whose oldest runnable job has waited longer than --max-wait
//                (the age idemq.stats() reports: no worker takes that queue or task)
//   schedules    no schedule whose job tick() could not enqueue (a problem: a limit
//                lowered after the schedule was made; schedules().last_error says
//                which), and none whose next slot is overdue by more than --max-wait
//                (no worker runs tick(): schedules fire only while one does)
//   workers      no runnable job whose queue and task no worker seen within
//                --worker-timeout claims (idemq.unserved_jobs(): workers
//                refresh their row in idemq.workers every 15 seconds)
//   flow         no paused queue or task with runnable jobs, no concurrency limit with
//                every slot held while its runnable jobs waited longer than --max-wait
//                (doctor-flow.ts)
//   bloat        dead rows in idemq.jobs do not outnumber live ones
//   transactions no transaction open longer than --long-transaction holding back
//                VACUUM's horizon (xmin) in this database
// Exit 0 when healthy, 7 with warnings, 8 with problems.
//
// These are diagnostic reads: catalog and statistics views, and one grouped
// read of idemq.jobs for the backoff of active keyed jobs, whose retry horizon
// idemq.retry_horizon() computes (the backoff model lives in SQL only).
import { readdir } from "node:fs/promises";
import type { Command } from "commander";
import pg from "pg";
import { DEFAULT_MIGRATIONS_DIR, migrationStatus } from "../../migrate.ts";
import * as sql from "../../sql/index.ts";
import { runQuery, type Queryable } from "../../sql/index.ts";
import { openDatabase, type OpenDatabase } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { EXIT } from "../exit-codes.ts";
import { age } from "../format.ts";
import { action, emit } from "../output.ts";
import { parseDuration } from "../parse.ts";
import { checkFlow } from "./doctor-flow.ts";

interface Options extends CommonOptions {
  keyRetention?: string;
  longTransaction: string;
  maxWait: string;
  workerTimeout: string;
}

type Status = "ok" | "warning" | "problem" | "skipped";

export interface Finding {
  check: "server" | "schema" | "keys" | "leases" | "backlog" | "schedules" | "workers" | "flow" | "bloat" | "transactions";
  status: Status;
  message: string;
  fix?: string;
  [detail: string]: unknown;
}

const MIN_SERVER_VERSION = 150000;
/** Leases expired for longer than this are "stuck": a worker's rescuer would have taken them. */
const STUCK_LEASE = "1 minute";
/** Bloat: dead rows above this count and above the live rows. */
const MIN_DEAD_ROWS = 1000;
/** idemq.retry_horizon's cap (36500 days), reported as "over 100 years"; test/sql/retry-horizon.test.ts holds it equal to SQL's. */
export const HORIZON_CAP_SECONDS = 36500 * 86400;

export function registerDoctorCommand(program: Command): void {
  const command = program
    .command("doctor")
    .description(
      "check the server, schema, key retention, leases, backlog, schedules, jobs no worker claims, table bloat and long transactions; say what to do",
    )
    .option(
      "--key-retention <duration>",
      "the key retention your workers and prune-keys use (default: prune_keys' default, 14 days)",
      parseDuration,
    )
    .option(
      "--long-transaction <duration>",
      "report transactions open longer than this (default 5m)",
      parseDuration,
      "5 minutes",
    )
    .option(
      "--max-wait <duration>",
      "report queues whose oldest runnable job has waited longer than this, and schedules overdue by more (default 10m)",
      parseDuration,
      "10 minutes",
    )
    .option(
      "--worker-timeout <duration>",
      "count a worker as gone when it has not refreshed its presence for this long (default 2m; workers refresh every 15s)",
      parseDuration,
      "2 minutes",
    )
    .action(
      action(async (_options: Options, cmd: Command) => {
        const options = cmd.optsWithGlobals<Options>();
        const db = await openDatabase({ ...options, requireSchema: false });
        try {
          const findings = await diagnose(db, options);
          const problems = findings.filter((f) => f.status === "problem").length;
          const warnings = findings.filter((f) => f.status === "warning").length;
          const status = problems > 0 ? "problem" : warnings > 0 ? "warning" : "ok";
          emit(options, { status, checks: findings }, renderFindings(findings, warnings, problems));
          process.exitCode = problems > 0 ? EXIT.DOCTOR_PROBLEMS : warnings > 0 ? EXIT.DOCTOR_WARNINGS : EXIT.OK;
        } finally {
          await db.close();
        }
      }),
    );
  databaseCommand(command, [
    "idemq doctor",
    "idemq doctor --key-retention 30d --json",
    "idemq doctor --max-wait 2m",
    "idemq doctor --worker-timeout 5m",
    "",
    "Exit codes: 0 healthy, 7 warnings, 8 problems (1 when the database cannot be reached).",
  ]);
}

async function diagnose(db: OpenDatabase, options: Options): Promise<Finding[]> {
  const client = new pg.Client({ connectionString: db.url });
  client.on("error", () => {});
  await client.connect();
  try {
    const findings: Finding[] = [await checkServer(client)];
    const schema = await checkSchema(db.url);
    findings.push(schema);
    const installed = await runQuery<{ installed: boolean; horizon: boolean; schedules: boolean; scheduleErrors: boolean; workers: boolean }>(
      client,
      `SELECT to_regclass('idemq.jobs') IS NOT NULL AND to_regprocedure('idemq.prune_keys(interval)') IS NOT NULL AS installed,
              to_regprocedure('idemq.retry_horizon(jsonb, int, int)') IS NOT NULL AS horizon,
              to_regprocedure('idemq.schedules()') IS NOT NULL AS schedules,
              coalesce((SELECT 'last_error' = ANY (p.proargnames) FROM pg_proc p
                         WHERE p.oid = to_regprocedure('idemq.schedules()')), false) AS "scheduleErrors",
              to_regprocedure('idemq.unserved_jobs(interval)') IS NOT NULL AS workers`,
      [],
    );
    if (!installed[0]?.installed) {
      for (const check of ["keys", "leases", "backlog", "schedules", "workers", "flow", "bloat"] as const) {
        findings.push({ check, status: "skipped", message: "needs the idemq schema (see schema)" });
      }
    } else {
      // A schema from before 0003_one_backoff_model has no retry_horizon(): the other checks still run.
      findings.push(
        installed[0].horizon
          ? await checkKeys(client, options.keyRetention)
          : { check: "keys", status: "skipped", message: "needs idemq.retry_horizon(), added by migration 0003 (see schema)" },
      );
      findings.push(await checkLeases(client));
      findings.push(await checkBacklog(client, options.maxWait));
      findings.push(
        installed[0].schedules
          ? await checkSchedules(client, options.maxWait, installed[0].scheduleErrors)
          : { check: "schedules", status: "skipped", message: "needs idemq.schedules(), added by migration 0010 (see schema)" },
      );
      findings.push(
        installed[0].workers
          ? await checkWorkers(client, options.workerTimeout)
          : { check: "workers", status: "skipped", message: "needs idemq.unserved_jobs(), added by migration 0017 (see schema)" },
      );
      findings.push(await checkFlow(client, options.maxWait));
      findings.push(await checkBloat(client));
    }
    findings.push(await checkTransactions(client, options.longTransaction));
    return findings;
  } finally {
    await client.end().catch(() => {});
  }
}

// ------------------------------------------------------------------ checks

async function checkServer(client: pg.Client): Promise<Finding> {
  const rows = await runQuery<{ num: number; version: string }>(
    client,
    "SELECT current_setting('server_version_num')::int AS num, current_setting('server_version') AS version",
    [],
  );
  const { num, version } = rows[0]!;
  if (num < MIN_SERVER_VERSION) {
    return {
      check: "server",
      status: "problem",
      message: `PostgreSQL ${version} is too old: idemq needs 15 or later`,
      fix: "upgrade the server to PostgreSQL 15 or later (idemq is tested on 15 and 18)",
      version,
    };
  }
  return { check: "server", status: "ok", message: `PostgreSQL ${version}`, version };
}

async function checkSchema(url: string): Promise<Finding> {
  const files = (await readdir(DEFAULT_MIGRATIONS_DIR)).filter((f) => f.endsWith(".sql")).map((f) => f.replace(/\.sql$/, ""));
  const { applied, pending } = await migrationStatus({ connectionString: url });
  const unknown = applied.filter((name) => !files.includes(name));
  if (pending.length > 0) {
    return {
      check: "schema",
      status: "problem",
      message:
        applied.length === 0
          ? "the idemq schema is not installed"
          : `${pending.length} migration(s) pending: ${pending.join(", ")} (applied: ${applied.join(", ")})`,
      fix: "run `idemq migrate` (or `idemq migrate sql` for a script to apply with psql)",
      applied,
      pending,
      unknown,
    };
  }
  if (unknown.length > 0) {
    return {
      check: "schema",
      status: "warning",
      message: `the database has migrations this idemq package does not know: ${unknown.join(", ")}`,
      fix: "upgrade idemq to the version that applied them",
      applied,
      pending,
      unknown,
    };
  }
  return { check: "schema", status: "ok", message: `up to date (${applied.join(", ")})`, applied, pending, unknown };
}

/** prune_keys' default retention, read from the catalog so it stays defined once, in SQL. */
export async function keyRetentionDefault(db: Queryable): Promise<string> {
  const rows = await runQuery<{ expr: string | null }>(
    db,
    "SELECT pg_get_expr(p.proargdefaults, 0) AS expr FROM pg_proc p WHERE p.oid = to_regprocedure('idemq.prune_keys(interval)')",
    [],
  );
  const match = /^'([^']+)'::interval$/.exec(rows[0]?.expr ?? "");
  if (match?.[1] === undefined) throw new Error("cannot read the default of idemq.prune_keys(older_than); pass --key-retention");
  return match[1];
}

interface BackoffGroup {
  kind: string;
  max_attempts: number;
  counted: number;
  jobs: string;
  example_id: string;
  example_task: string;
  horizon_s: number;
}

async function checkKeys(client: pg.Client, given: string | undefined): Promise<Finding> {
  const retention = given ?? (await keyRetentionDefault(client));
  const seconds = await runQuery<{ s: string }>(client, "SELECT extract(epoch FROM $1::interval) AS s", [retention]);
  const retentionSeconds = Number(seconds[0]!.s);
  // One row per (backoff, max_attempts): the job with the fewest counted
  // attempts has the longest horizon of its group.
  const groups = await runQuery<BackoffGroup>(
    client,
    `SELECT coalesce(g.backoff->>'kind', 'polynomial') AS kind, g.max_attempts, g.counted, g.jobs, g.example_id, g.example_task,
            extract(epoch FROM idemq.retry_horizon(g.backoff, g.counted, g.max_attempts))::float8 AS horizon_s
       FROM (SELECT j.backoff, j.max_attempts, min(j.attempt - j.uncounted) AS counted, count(*) AS jobs,
                    (array_agg(j.id ORDER BY j.attempt - j.uncounted, j.id))[1] AS example_id,
                    (array_agg(j.task ORDER BY j.attempt - j.uncounted, j.id))[1] AS example_task
               FROM idemq.jobs j
              WHERE j.idempotency_key IS NOT NULL
                AND j.state = ANY (idemq.active_states())
              GROUP BY j.backoff, j.max_attempts) g`,
    [],
  );
  const keyedJobs = groups.reduce((sum, g) => sum + Number(g.jobs), 0);
  if (groups.length === 0) {
    return {
      check: "keys",
      status: "ok",
      message: `key retention ${retention}; no active keyed jobs to check it against`,
      retention,
      retentionSeconds,
      longestHorizonSeconds: 0,
    };
  }
  let longest = { seconds: -1, group: groups[0]! };
  for (const group of groups) {
    if (group.horizon_s > longest.seconds) longest = { seconds: group.horizon_s, group };
  }
  const { group } = longest;
  const horizonText = longest.seconds >= HORIZON_CAP_SECONDS ? "over 100 years" : age(longest.seconds * 1000);
  const retriesLeft = Math.max(0, group.max_attempts - Math.max(group.counted, 1));
  const details = {
    retention,
    retentionSeconds,
    longestHorizonSeconds: longest.seconds,
    activeKeyedJobs: keyedJobs,
    example: { jobId: group.example_id, task: group.example_task, backoff: group.kind, retriesLeft },
  };
  const about = `job ${group.example_id} (${group.example_task}): ${retriesLeft} retr${retriesLeft === 1 ? "y" : "ies"} left with ${group.kind} backoff`;
  if (longest.seconds > retentionSeconds) {
    return {
      check: "keys",
      status: "warning",
      message:
        `key retention ${retention} is shorter than the longest retry horizon of the ${keyedJobs} active keyed job(s): ` +
        `${horizonText}, ${about}; a retried or replayed enqueue after its key is released makes a new job`,
      fix:
        `keep keys at least ${age(longest.seconds * 1000)}: run workers with that key retention ` +
        "and `idemq prune-keys --older-than <it>` (then `idemq doctor --key-retention <it>`), or lower max_attempts or the backoff",
      ...details,
    };
  }
  return {
    check: "keys",
    status: "ok",
    message: `key retention ${retention} outlives the longest retry horizon of the ${keyedJobs} active keyed job(s) (${horizonText}, ${about})`,
    ...details,
  };
}

async function checkLeases(client: pg.Client): Promise<Finding> {
  const rows = await runQuery<{ stuck: string; expired: string; oldest_s: string | null; example_id: string | null; worker: string | null }>(
    client,
    `SELECT count(*) FILTER (WHERE j.lease_expires_at < now() - $1::interval) AS stuck,
            count(*) AS expired,
            extract(epoch FROM now() - min(j.lease_expires_at)) AS oldest_s,
            (array_agg(j.id ORDER BY j.lease_expires_at))[1] AS example_id,
            (array_agg(j.locked_by ORDER BY j.lease_expires_at))[1] AS worker
       FROM idemq.jobs j
      WHERE j.state = 'processing' AND j.lease_expires_at < now()`,
    [STUCK_LEASE],
  );
  const row = rows[0]!;
  const stuck = Number(row.stuck);
  const expired = Number(row.expired);
  if (stuck > 0) {
    return {
      check: "leases",
      status: "warning",
      message:
        `${stuck} job(s) in processing whose lease expired more than ${STUCK_LEASE} ago ` +
        `(oldest: job ${row.example_id}, held by ${row.worker}, expired ${age(Number(row.oldest_s) * 1000)} ago); no rescuer is running`,
      fix: "run `idemq rescue` or start a worker (workers rescue on a timer)",
      stuck,
      expired,
    };
  }
  return {
    check: "leases",
    status: "ok",
    message:
      expired === 0
        ? "no expired lease"
        : `${expired} lease(s) expired within the last minute (a worker's rescuer takes them back)`,
    stuck,
    expired,
  };
}

/**
 * Queues whose oldest runnable job has waited longer than maxWait, from
 * idemq.stats()'s oldest_runnable_seconds (per queue and task), so "runnable"
 * is defined once, in SQL.
 */
async function checkBacklog(client: pg.Client, maxWait: string): Promise<Finding> {
  const rows = await runQuery<{ queue: string; task: string; waited_s: number; max_s: number }>(
    client,
    `SELECT s.queue, s.task, s.value::float8 AS waited_s, extract(epoch FROM $1::interval)::float8 AS max_s
       FROM idemq.stats() s
      WHERE s.metric = 'oldest_runnable_seconds' AND s.queue IS NOT NULL
      ORDER BY s.value DESC, s.queue, s.task`,
    [maxWait],
  );
  const late = rows.filter((r) => r.waited_s > r.max_s);
  const waiting = late.map((r) => ({ queue: r.queue, task: r.task, waitedSeconds: r.waited_s }));
  if (late.length === 0) {
    return { check: "backlog", status: "ok", message: `no runnable job has waited longer than ${maxWait}`, maxWait, waiting };
  }
  const oldest = late[0]!;
  const queues = [...new Set(late.map((r) => r.queue))];
  return {
    check: "backlog",
    status: "warning",
    message:
      `${queues.length} queue(s) with runnable jobs waiting longer than ${maxWait}: ${queues.slice(0, 5).join(", ")}${queues.length > 5 ? ", ..." : ""} ` +
      `(oldest: task ${oldest.task} in queue ${oldest.queue}, ${age(oldest.waited_s * 1000)})`,
    fix: "start a worker with that queue and task (`idemq worker --queues <queue>`; a worker claims only the tasks it has), or add workers if they cannot keep up",
    maxWait,
    waiting,
  };
}

/**
 * Schedules whose job tick() could not enqueue (a problem: they stay due and
 * never fire until fixed), then those whose next slot is overdue by more than
 * maxWait (a warning: nothing runs tick(); workers do, on a timer). A schema
 * before 0.2.0 records no errors (`withErrors` false).
 */
async function checkSchedules(client: pg.Client, maxWait: string, withErrors: boolean): Promise<Finding> {
  const rows = await runQuery<{ name: string; next_at: Date; late_s: number; last_error: string | null; last_error_at: Date | null }>(
    client,
    `SELECT s.name, s.next_at, extract(epoch FROM now() - s.next_at)::float8 AS late_s,
            ${withErrors ? "s.last_error, s.last_error_at" : "NULL::text AS last_error, NULL::timestamptz AS last_error_at"}
       FROM idemq.schedules() s
      WHERE s.next_at < now() - $1::interval${withErrors ? " OR s.last_error IS NOT NULL" : ""}
      ORDER BY s.next_at, s.name`,
    [maxWait],
  );
  const failing = rows
    .filter((r) => r.last_error !== null)
    .map((r) => ({ name: r.name, lastError: r.last_error!, lastErrorAt: r.last_error_at!.toISOString(), nextAt: r.next_at.toISOString() }));
  const overdue = rows
    .filter((r) => r.last_error === null)
    .map((r) => ({ name: r.name, nextAt: r.next_at.toISOString(), lateSeconds: r.late_s }));
  const details = { maxWait, overdue, ...(withErrors ? { failing } : {}) };
  if (failing.length > 0) {
    const first = failing[0]!;
    return {
      check: "schedules",
      status: "problem",
      message:
        `${failing.length} schedule(s) whose job tick() could not enqueue, so they do not fire: ` +
        `${first.name} (${first.lastError}; last tried ${first.lastErrorAt.replace(/\.\d{3}Z$/, "Z")})` +
        (failing.length > 1 ? `, and ${failing.slice(1, 5).map((f) => f.name).join(", ")}${failing.length > 5 ? ", ..." : ""}` : "") +
        (overdue.length > 0 ? `; ${overdue.length} more overdue by more than ${maxWait}` : ""),
      fix:
        `make the job acceptable again: raise the limit it breaks (UPDATE idemq.settings SET value = ... WHERE name = ...), ` +
        `or redefine the schedule (\`idemq schedules add ${first.name} ...\`, e.g. a smaller payload); the next tick() fires it and clears the error`,
      ...details,
    };
  }
  if (overdue.length === 0) {
    return { check: "schedules", status: "ok", message: `no schedule overdue by more than ${maxWait}`, ...details };
  }
  const first = overdue[0]!;
  return {
    check: "schedules",
    status: "warning",
    message:
      `${overdue.length} schedule(s) have not fired when due, by more than ${maxWait} ` +
      `(${first.name}: due ${first.nextAt.replace(/\.\d{3}Z$/, "Z")}, ${age(first.lateSeconds * 1000)} ago)`,
    fix: "start a worker (workers fire schedules on a timer), or call `SELECT idemq.tick()` from pg_cron",
    ...details,
  };
}

/**
 * Runnable jobs whose queue and task no live worker claims, from
 * idemq.unserved_jobs() (runnable as stats() counts it; a worker covers a job
 * as claim() would hand it the job): the case the backlog check sees only
 * once --max-wait has passed, and cannot tell from slow workers.
 */
async function checkWorkers(client: pg.Client, workerTimeout: string): Promise<Finding> {
  // One after the other: they share one pg.Client, which runs one query at a
  // time (queued concurrent calls are deprecated in pg 8 and removed in pg 9).
  const unserved = await sql.unservedJobs(client, workerTimeout);
  const live = await runQuery<{ n: number }>(
    client,
    // A cleanly stopped worker's row is kept a while (stopped_at, since 0.2.0): it is not live. Read
    // through to_jsonb so an installation whose workers() has no stopped_at (0.1.0) is checked too.
    "SELECT count(*)::int AS n FROM idemq.workers() w WHERE w.last_seen_at >= now() - $1::interval AND to_jsonb(w)->>'stopped_at' IS NULL",
    [workerTimeout],
  );
  const liveWorkers = live[0]!.n;
  const groups = unserved.map((u) => ({
    queue: u.queue,
    task: u.task,
    jobs: u.jobs,
    oldestRunnableSeconds: u.oldestRunnableSeconds,
    lastSeenAt: u.lastSeenAt?.toISOString() ?? null,
  }));
  if (groups.length === 0) {
    return {
      check: "workers",
      status: "ok",
      message: `every runnable job has a worker for its queue and task (${liveWorkers} worker(s) seen within ${workerTimeout})`,
      workerTimeout,
      liveWorkers,
      unserved: groups,
    };
  }
  const jobs = groups.reduce((sum, g) => sum + g.jobs, 0);
  const first = unserved[0]!;
  const seen =
    first.lastSeenAt === null
      ? "no worker with it has registered"
      : `the last worker with it was seen ${age(Date.now() - first.lastSeenAt.getTime())} ago`;
  const others = groups.length > 1 ? `; and ${groups.length - 1} more queue/task pair(s)` : "";
  return {
    check: "workers",
    status: "warning",
    message:
      `${jobs} runnable job(s) that no worker seen within ${workerTimeout} claims: ` +
      `task ${first.task} in queue ${first.queue} (${first.jobs} job(s), oldest ${age(first.oldestRunnableSeconds * 1000)}; ${seen})${others}`,
    fix:
      `start a worker with task ${first.task} on queue ${first.queue} ` +
      `(\`idemq worker --tasks <module with ${first.task}> --queues ${first.queue}\`; a worker without --queues takes every queue)` +
      (groups.length > 1 ? ", and likewise for each pair listed in --json's unserved" : ""),
    workerTimeout,
    liveWorkers,
    unserved: groups,
  };
}

async function checkBloat(client: pg.Client): Promise<Finding> {
  const rows = await runQuery<{ live: string; dead: string; vacuumed_s: string | null }>(
    client,
    `SELECT s.n_live_tup AS live, s.n_dead_tup AS dead,
            extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum)) AS vacuumed_s
       FROM pg_stat_user_tables s
      WHERE s.relid = 'idemq.jobs'::regclass`,
    [],
  );
  const live = Number(rows[0]?.live ?? 0);
  const dead = Number(rows[0]?.dead ?? 0);
  const vacuumed = rows[0]?.vacuumed_s == null ? "never" : `${age(Number(rows[0].vacuumed_s) * 1000)} ago`;
  const details = { liveRows: live, deadRows: dead, lastVacuum: vacuumed };
  if (dead >= MIN_DEAD_ROWS && dead > live) {
    return {
      check: "bloat",
      status: "warning",
      message: `idemq.jobs holds ${dead} dead rows for ${live} live ones (last vacuum: ${vacuumed}); every claim scans past them`,
      fix:
        "run `VACUUM (ANALYZE) idemq.jobs`; if dead rows keep piling up, end long transactions (see transactions), " +
        "check that autovacuum runs, and purge finished jobs (`idemq purge --older-than 7d`)",
      ...details,
    };
  }
  return { check: "bloat", status: "ok", message: `idemq.jobs: ${live} live rows, ${dead} dead (last vacuum: ${vacuumed})`, ...details };
}

async function checkTransactions(client: pg.Client, threshold: string): Promise<Finding> {
  const rows = await runQuery<{ pid: number; usename: string | null; application_name: string | null; state: string | null; age_s: string; query: string | null }>(
    client,
    `SELECT a.pid, a.usename, a.application_name, a.state,
            extract(epoch FROM now() - a.xact_start) AS age_s, left(a.query, 80) AS query
       FROM pg_stat_activity a
      WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
        AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
        AND a.xact_start < now() - $1::interval
      ORDER BY a.xact_start
      LIMIT 5`,
    [threshold],
  );
  const transactions = rows.map((r) => ({
    pid: r.pid,
    user: r.usename,
    application: r.application_name,
    state: r.state,
    ageSeconds: Math.floor(Number(r.age_s)),
    query: r.query,
  }));
  if (transactions.length === 0) {
    return { check: "transactions", status: "ok", message: `no transaction open longer than ${threshold}`, transactions };
  }
  const oldest = transactions[0]!;
  const who = [oldest.application || null, oldest.user].filter((part) => part !== null && part !== "").join(", ");
  return {
    check: "transactions",
    status: "warning",
    message:
      `${transactions.length === 5 ? "5 or more" : transactions.length} transaction(s) open longer than ${threshold}; ` +
      `the oldest, PID ${oldest.pid}${who ? ` (${who})` : ""}, ${oldest.state ?? "?"} for ${age(oldest.ageSeconds * 1000)}, ` +
      "holds back VACUUM: dead rows in idemq.jobs cannot be removed",
    fix:
      `end it (SELECT pg_terminate_backend(${oldest.pid})) and fix the client that leaves it open; ` +
      "idle_in_transaction_session_timeout ends such sessions automatically",
    transactions,
  };
}

// ------------------------------------------------------------------ output

const LABEL: Record<Status, string> = { ok: "ok", warning: "WARNING", problem: "PROBLEM", skipped: "skipped" };

function renderFindings(findings: readonly Finding[], warnings: number, problems: number): string[] {
  const lines: string[] = [];
  for (const f of findings) {
    lines.push(`${LABEL[f.status].padEnd(8)} ${f.check.padEnd(13)}${f.message}`);
    if (f.fix !== undefined && (f.status === "warning" || f.status === "problem")) lines.push(`${"".padEnd(22)}fix: ${f.fix}`);
  }
  lines.push(
    problems + warnings === 0
      ? "Healthy."
      : `${problems} problem(s), ${warnings} warning(s).`,
  );
  return lines;
}
