// One casing for every command's --json: each command that takes --json is
// run (as a real subprocess, on data that fills its output) and every key of
// what it prints must be camelCase. The list of commands is read from the
// CLI's own command tree, so a new command with --json and no invocation
// here fails the test. Values kept as stored are not the CLI's shape and are
// not walked: a job's payload and result (the user's), and its errors (the
// error history exactly as SQL records it; `jobs show`'s timeline is the
// camelCase view of it).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Command } from "commander";
import { buildProgram } from "../../src/cli/main.ts";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { runCli } from "../helpers/cli.ts";
import { badKeys } from "../helpers/json-keys.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueue, unique } from "../helpers/jobs.ts";
import { claimJob, jobIn } from "../helpers/work.ts";

/** "jobs show", "stats", ...: every command of the tree that has --json. */
function jsonCommands(): string[] {
  const found: string[] = [];
  const walk = (command: Command, path: string[]): void => {
    for (const sub of command.commands) {
      const name = [...path, sub.name()];
      if (sub.options.some((option) => option.long === "--json")) found.push(name.join(" "));
      walk(sub, name);
    }
  };
  walk(buildProgram(), []);
  return found.sort();
}

const db = useTestDatabase();
let role: string;
const limitQueue = unique("limited");
let failedJob: string;
let shownJob: string;
let waitingJob: string;
let scheduleName: string;

beforeAll(async () => {
  const queue = unique("q");
  const task = unique("task");
  // A job with a failed attempt and an operator's retry (timeline, retries), a lost lease (stats).
  shownJob = await jobIn(db.pool, "enqueued", { queue, task, idempotency_key: unique("k") });
  const attempt = await claimJob(db.pool, shownJob);
  await db.pool.query(
    `SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{"class": "E", "message": "m", "stack": "at x"}', retryable => false)`,
    [shownJob, attempt],
  );
  await db.pool.query("SELECT idemq.retry(job_id => $1)", [shownJob]);
  const lost = await jobIn(db.pool, "processing", { task });
  await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [lost]);
  failedJob = await jobIn(db.pool, "failed", { task });
  waitingJob = await jobIn(db.pool, "enqueued", { task });
  // A held concurrency key (limit keys).
  const heldQueue = unique("held");
  await enqueue(db.pool, { queue: heldQueue, task, concurrency_key: unique("customer") });
  await db.pool.query(
    `SELECT idemq.hold(job_id => c.job_id, attempt => c.attempt, scope => 'key', until => now() + interval '1 hour', lease_token => c.lease_token)
     FROM idemq.claim(worker_id => 'json-keys', queues => ARRAY[$1::text], token => true) c`,
    [heldQueue],
  );
  // Events per task (deduplicated, guard duplicate).
  const key = unique("key");
  await enqueue(db.pool, { task, idempotency_key: key });
  await enqueue(db.pool, { task, idempotency_key: key });
  await db.pool.query("SELECT idemq.guard(key => $1, task => $2)", [key, task]);
  await db.pool.query("SELECT idemq.guard(key => $1, task => $2)", [key, task]);
  scheduleName = unique("nightly");
  await db.pool.query("SELECT idemq.schedule(name => $1, cron => '@daily', task => $2)", [scheduleName, task]);
  role = unique("app_web").replace(/[^a-z0-9_]/g, "_");
  await db.pool.query(`CREATE ROLE ${role}`);
});
afterAll(async () => {
  await db.pool.query(`DROP OWNED BY ${role}`).catch(() => {});
  await db.pool.query(`DROP ROLE IF EXISTS ${role}`).catch(() => {});
});

/** A run of each command that has --json, on the data above. */
const INVOCATIONS: Record<string, () => string[]> = {
  migrate: () => ["migrate"],
  "migrate status": () => ["migrate", "status"],
  enqueue: () => ["enqueue", "report", '{"month": "2026-11"}', "--key", unique("report")],
  jobs: () => ["jobs", "--limit", "2"],
  "jobs show": () => ["jobs", "show", shownJob],
  "jobs retry": () => ["jobs", "retry", failedJob, "999999991"],
  "jobs cancel": () => ["jobs", "cancel", waitingJob],
  "jobs run-now": () => ["jobs", "run-now", "--queue", limitQueue, "--yes"],
  "jobs delete": () => ["jobs", "delete", "--state", "failed", "--dry-run"],
  "jobs reschedule": () => ["jobs", "reschedule", shownJob, "--delay", "1h"],
  "schedules list": () => ["schedules", "list"],
  "schedules add": () => ["schedules", "add", unique("sync"), "--cron", "*/5 * * * *", "--task", "sync"],
  "schedules next": () => ["schedules", "next", scheduleName, "--count", "2"],
  "schedules remove": () => ["schedules", "remove", scheduleName],
  "limit set": () => ["limit", "set", "--queue", limitQueue, "--concurrency", "3", "--rate", "10", "--per", "1m"],
  pause: () => ["pause", "--queue", limitQueue],
  "limit list": () => ["limit", "list"],
  "limit keys": () => ["limit", "keys"],
  resume: () => ["resume", "--queue", limitQueue],
  "limit clear": () => ["limit", "clear", "--queue", limitQueue],
  stats: () => ["stats"],
  rescue: () => ["rescue"],
  purge: () => ["purge", "--older-than", "7d"],
  "prune-keys": () => ["prune-keys"],
  "roles grant": () => ["roles", "grant", role, "--producer"],
  "roles list": () => ["roles", "list"],
  doctor: () => ["doctor"],
  // Its --json (minutes of work) is checked with badKeys in demo.test.ts.
  demo: () => [],
};

describe("--json: one casing (camelCase) across every command", () => {
  it("every command with --json has an invocation here", () => {
    expect(jsonCommands()).toEqual(Object.keys(INVOCATIONS).sort());
  });

  it("badKeys finds a snake_case key at any depth, and skips stored data", () => {
    expect(badKeys({ jobs: [{ leaseExpired: 1, oldest_runnable: 2 }], payload: { any_key: 1 } })).toEqual(["jobs[0].oldest_runnable"]);
  });

  // In order: later runs remove what earlier ones read.
  for (const name of Object.keys(INVOCATIONS).filter((n) => n !== "demo")) {
    it(`idemq ${name} --json prints camelCase keys only`, async () => {
      const result = await runCli([...INVOCATIONS[name]!(), "--json", "--database-url", db.url]);
      // doctor may warn (7) or find problems (8), jobs retry reports the missing id (5): the shape is the point.
      expect([EXIT.OK, EXIT.NOT_FOUND, EXIT.DOCTOR_WARNINGS, EXIT.DOCTOR_PROBLEMS], result.stderr).toContain(result.code);
      const lines = result.stdout.trimEnd().split("\n");
      expect(lines, result.stdout).toHaveLength(1);
      const value: unknown = JSON.parse(lines[0]!);
      expect(Object.keys(value as object).length).toBeGreaterThan(0);
      expect(badKeys(value)).toEqual([]);
    });
  }
});
