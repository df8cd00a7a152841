// The roles (docs/design.md, "Roles and privileges"), as real non-superuser
// logins: a member of the installation's producer, of its worker, of its
// admin role, and a role in none of them. Every cell of the role-by-operation
// matrix is asserted allowed (the call works) or refused (42501, nothing
// done), and a worker process logged in as a worker-role member records a
// handler's error and retries it.
import type pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { installationRoles, type InstallationRoles } from "../../src/roles.ts";
import { useTestDatabase, sqlState } from "../helpers/db.ts";
import { jobRow, makeJob, unique } from "../helpers/jobs.ts";
import { createLoginRole, dropLoginRoles, type LoginRole } from "../helpers/login-roles.ts";
import { claimOne } from "../helpers/work.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

type Who = "producer" | "worker" | "admin" | "viewer" | "stranger";

const db = useTestDatabase({ poolSize: 4 });
const logins = {} as Record<Who, LoginRole>;
const sessions = {} as Record<Who, pg.Client>;

// Committed by the superuser; each cell runs in a transaction that rolls back.
const fx = {
  queue: unique("roles"),
  heldQueue: unique("roles-held"),
  enqueued: "",
  held: "",
  heldAttempt: 0,
  heldToken: "",
  failed: "",
  payload: { secret: "only claim hands this out" },
};

let ROLES: InstallationRoles;

beforeAll(async () => {
  // This installation's roles (a clone of the test template shares the template's).
  ROLES = await installationRoles(db.pool);
  for (const who of ["producer", "worker", "admin", "viewer"] as const) logins[who] = await createLoginRole(who, { memberOf: [ROLES[who]] });
  logins.stranger = await createLoginRole("stranger");
  for (const who of Object.keys(logins) as Who[]) sessions[who] = await logins[who].connect(db.name);

  fx.enqueued = await makeJob(db.pool, { task: "roles", queue: fx.queue, payload: fx.payload });
  await db.pool.query(`SELECT idemq.schedule(name => 'roles-fixture', cron => '0 3 * * *', task => 'report', payload => $1)`, [fx.payload]);
  fx.held = await makeJob(db.pool, { task: "roles", queue: fx.heldQueue });
  const held = await claimOne(db.pool, { worker_id: "w0", queues: [fx.heldQueue], token: true });
  fx.heldAttempt = held.attempt;
  fx.heldToken = held.lease_token!;
  const failedQueue = unique("roles-failed");
  fx.failed = await makeJob(db.pool, { task: "roles", queue: failedQueue, max_attempts: 1 });
  const failing = await claimOne(db.pool, { queues: [failedQueue] });
  await db.pool.query(`SELECT idemq.fail(job_id => $1, attempt => $2, error => '"x"', retryable => false, lease_token => $3)`, [
    fx.failed,
    failing.attempt,
    failing.lease_token,
  ]);
  await db.pool.query("SELECT idemq.effect_claim(key => 'roles-effect', owner => 'o')");
}, 60_000);

afterAll(async () => {
  await dropLoginRoles();
});

interface Operation {
  name: string;
  sql: () => [string, unknown[]];
  /** Checks the answer of an allowed call (`who` made it). */
  check?: (rows: Record<string, unknown>[], who: Who) => void;
}

const OPERATIONS: Operation[] = [
  { name: "enqueue", sql: () => ["SELECT * FROM idemq.enqueue(task => 'roles', queue => $1)", [fx.queue]], check: (r) => expect(r[0]).toMatchObject({ deduplicated: false }) },
  {
    name: "enqueue_many",
    sql: () => ["SELECT * FROM idemq.enqueue_many(jobs => $1::jsonb)", [JSON.stringify([{ task: "roles", queue: fx.queue }])]],
    check: (r) => expect(r[0]).toMatchObject({ outcome: "created" }),
  },
  {
    name: "job",
    sql: () => ["SELECT job_id, state::text, payload FROM idemq.job(job_id => $1)", [fx.enqueued]],
    // A job's state for every role; its payload only for one that may read idemq.jobs.
    check: (r, who) => expect(r).toEqual([{ job_id: fx.enqueued, state: "enqueued", payload: who === "admin" ? fx.payload : null }]),
  },
  {
    name: "claim",
    sql: () => ["SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY[$1::text])", [fx.queue]],
    // The one way a worker reads a payload.
    check: (r) => expect(r).toEqual([expect.objectContaining({ job_id: fx.enqueued, payload: fx.payload })]),
  },
  { name: "complete", sql: () => ["SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", [fx.held, fx.heldAttempt, fx.heldToken]] },
  {
    name: "complete_many",
    sql: () => [
      "SELECT * FROM idemq.complete_many(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[$3::uuid])",
      [fx.held, fx.heldAttempt, fx.heldToken],
    ],
    check: (r) => expect(r).toHaveLength(1),
  },
  {
    name: "complete_and_take_next",
    sql: () => [
      "SELECT * FROM idemq.complete_and_take_next(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[$3::uuid], worker_id => 'w')",
      [fx.held, fx.heldAttempt, fx.heldToken],
    ],
    check: (r) => expect(r).toEqual([expect.objectContaining({ completed: fx.held, job_id: null })]),
  },
  {
    name: "fail",
    sql: () => [`SELECT * FROM idemq.fail(job_id => $1, attempt => $2, error => '{"class": "E", "message": "m"}', lease_token => $3)`, [fx.held, fx.heldAttempt, fx.heldToken]],
    check: (r) => expect(r[0]).toMatchObject({ state: "scheduled" }),
  },
  {
    name: "heartbeat",
    sql: () => [
      "SELECT * FROM idemq.heartbeat(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[$3::uuid])",
      [fx.held, fx.heldAttempt, fx.heldToken],
    ],
    check: (r) => expect(r).toHaveLength(1),
  },
  {
    name: "snooze",
    sql: () => ["SELECT idemq.snooze(job_id => $1, attempt => $2, run_at => now() + interval '1 minute', lease_token => $3)", [fx.held, fx.heldAttempt, fx.heldToken]],
  },
  {
    name: "hold",
    sql: () => [
      "SELECT idemq.hold(job_id => $1, attempt => $2, scope => 'task', until => now() + interval '1 minute', lease_token => $3) AS until",
      [fx.held, fx.heldAttempt, fx.heldToken],
    ],
    check: (r) => expect(r[0]!.until).toBeInstanceOf(Date),
  },
  {
    name: "progress",
    sql: () => ["SELECT idemq.progress(job_id => $1, attempt => $2, value => 40, lease_token => $3)", [fx.held, fx.heldAttempt, fx.heldToken]],
  },
  {
    name: "job_result",
    sql: () => ["SELECT state::text, result FROM idemq.job_result(job_id => $1, notify => true)", [fx.enqueued]],
    check: (r) => expect(r).toEqual([{ state: "enqueued", result: null }]),
  },
  {
    name: "spawn",
    sql: () => [
      "SELECT name, outcome FROM idemq.spawn(job_id => $1, attempt => $2, children => $3::jsonb, lease_token => $4)",
      [fx.held, fx.heldAttempt, JSON.stringify([{ name: "a", task: "roles", queue: fx.queue }]), fx.heldToken],
    ],
    check: (r) => expect(r).toEqual([{ name: "a", outcome: "created" }]),
  },
  {
    name: "wait_for_children",
    sql: () => ["SELECT idemq.wait_for_children(job_id => $1, attempt => $2, lease_token => $3) AS parked", [fx.held, fx.heldAttempt, fx.heldToken]],
    check: (r) => expect(r).toEqual([{ parked: false }]),
  },
  { name: "children", sql: () => ["SELECT * FROM idemq.children(job_id => $1)", [fx.held]], check: (r) => expect(r).toEqual([]) },
  {
    name: "enqueue_batch",
    sql: () => ["SELECT ordinal, outcome FROM idemq.enqueue_batch(jobs => $1::jsonb, callback => '{\"task\": \"report\"}')", [JSON.stringify([{ task: "roles", queue: fx.queue }])]],
    check: (r) => expect(r).toEqual([{ ordinal: 0, outcome: "created" }, { ordinal: 1, outcome: "created" }]),
  },
  { name: "guard", sql: () => ["SELECT idemq.guard(key => 'roles-guard') AS go", []], check: (r) => expect(r[0]).toEqual({ go: true }) },
  {
    name: "effect_claim",
    sql: () => ["SELECT * FROM idemq.effect_claim(key => 'roles-effect-2', owner => 'o')", []],
    check: (r) => expect(r[0]).toMatchObject({ status: "claimed" }),
  },
  { name: "effect_done", sql: () => [`SELECT idemq.effect_done(key => 'roles-effect', owner => 'o', result => '{}')`, []] },
  { name: "effect_release", sql: () => ["SELECT idemq.effect_release(key => 'roles-effect', owner => 'o')", []] },
  { name: "rescue", sql: () => ["SELECT idemq.rescue() AS n", []] },
  { name: "wait_for_jobs", sql: () => ["SELECT idemq.wait_for_jobs(queues => ARRAY[$1::text]) AS ready", [fx.queue]] },
  { name: "stop_waiting", sql: () => ["SELECT idemq.stop_waiting(queues => ARRAY[$1::text])", [fx.queue]] },
  { name: "prune_keys", sql: () => ["SELECT idemq.prune_keys() AS n", []] },
  { name: "apply_retention", sql: () => ["SELECT idemq.apply_retention(batch_size => 10) AS n", []], check: (r) => expect(r).toEqual([{ n: 0 }]) },
  {
    name: "set_retention",
    sql: () => ["SELECT idemq.set_retention(state => 'failed', keep => '30 days', queue => $1)", [fx.queue]],
  },
  { name: "cancel", sql: () => ["SELECT idemq.cancel(job_id => $1)::text AS state", [fx.enqueued]], check: (r) => expect(r[0]).toEqual({ state: "cancelled" }) },
  { name: "retry", sql: () => ["SELECT idemq.retry(job_id => $1)::text AS state", [fx.failed]], check: (r) => expect(r[0]).toEqual({ state: "enqueued" }) },
  {
    name: "reschedule",
    sql: () => ["SELECT idemq.reschedule(job_id => $1, run_at => now() + interval '1 hour')::text AS state", [fx.enqueued]],
    check: (r) => expect(r[0]).toEqual({ state: "scheduled" }),
  },
  { name: "purge", sql: () => ["SELECT idemq.purge(older_than => '1 day') AS n", []] },
  {
    name: "find_jobs",
    sql: () => ["SELECT job_id, payload FROM idemq.find_jobs(filter => jsonb_build_object('queue', $1::text))", [fx.queue]],
    check: (r, who) => expect(r).toEqual([{ job_id: fx.enqueued, payload: who === "admin" ? fx.payload : null }]),
  },
  {
    name: "count_jobs",
    sql: () => ["SELECT * FROM idemq.count_jobs(filter => jsonb_build_object('queue', $1::text), action => 'cancel')", [fx.queue]],
    check: (r) => expect(r).toEqual([{ jobs: 1, exact: true }]),
  },
  {
    name: "retry_jobs",
    sql: () => ["SELECT * FROM idemq.retry_jobs(filter => jsonb_build_object('ids', jsonb_build_array($1::text)))", [fx.failed]],
    check: (r) => expect(r).toEqual([{ touched: 1, skipped: 0, more: false, next_before_id: null }]),
  },
  {
    name: "cancel_jobs",
    sql: () => ["SELECT * FROM idemq.cancel_jobs(filter => jsonb_build_object('queue', $1::text))", [fx.queue]],
    check: (r) => expect(r).toEqual([{ touched: 1, skipped: 0, more: false, next_before_id: null }]),
  },
  {
    name: "delete_jobs",
    sql: () => ["SELECT * FROM idemq.delete_jobs(filter => jsonb_build_object('ids', jsonb_build_array($1::text)))", [fx.failed]],
    check: (r) => expect(r).toEqual([{ touched: 1, skipped: 0, more: false, next_before_id: null }]),
  },
  {
    name: "run_jobs_now",
    sql: () => ["SELECT * FROM idemq.run_jobs_now(filter => jsonb_build_object('queue', $1::text))", [fx.queue]],
    check: (r) => expect(r).toEqual([{ touched: 0, skipped: 0, more: false, next_before_id: null }]),
  },

  { name: "stats", sql: () => ["SELECT * FROM idemq.stats()", []], check: (r) => expect(r.length).toBeGreaterThan(0) },
  { name: "set_limit", sql: () => ["SELECT idemq.set_limit(queue => $1 || '-limited', concurrency => 2)", [fx.queue]] },
  { name: "limits", sql: () => ["SELECT * FROM idemq.limits()", []] },
  { name: "held_keys", sql: () => ["SELECT * FROM idemq.held_keys()", []] },
  { name: "declare_limit", sql: () => ["SELECT * FROM idemq.declare_limit(task => $1 || '-declared', concurrency => 3)", [fx.queue]] },
  { name: "pause", sql: () => ["SELECT idemq.pause(queue => $1 || '-paused') AS r", [fx.queue]] },
  { name: "resume", sql: () => ["SELECT idemq.resume(queue => $1 || '-paused') AS r", [fx.queue]] },
  { name: "clear_limit", sql: () => ["SELECT idemq.clear_limit(queue => $1 || '-limited') AS r", [fx.queue]] },
  { name: "overview", sql: () => ["SELECT * FROM idemq.overview()", []], check: (r) => expect(r.length).toBeGreaterThan(0) },
  { name: "roll_up", sql: () => ["SELECT idemq.roll_up() AS n", []], check: (r) => expect(r).toHaveLength(1) },
  // Durable steps: the worker's calls on the job it holds, fenced like complete(); emit by the role that enqueues.
  {
    name: "step_record",
    sql: () => ["SELECT idemq.step_record(job_id => $1, attempt => $2, name => 'roles-step', result => '1', lease_token => $3)", [fx.held, fx.heldAttempt, fx.heldToken]],
  },
  {
    name: "steps",
    sql: () => ["SELECT * FROM idemq.steps(job_id => $1)", [fx.held]],
  },
  {
    name: "sleep",
    sql: () => ["SELECT * FROM idemq.sleep(job_id => $1, attempt => $2, name => 'roles-sleep', wake_at => now(), lease_token => $3)", [fx.held, fx.heldAttempt, fx.heldToken]],
    check: (r) => expect(r).toMatchObject([{ parked: false }]),
  },
  {
    name: "await_event",
    sql: () => [
      "SELECT * FROM idemq.await_event(job_id => $1, attempt => $2, name => 'roles-wait', event => 'roles-event', key => NULL, timeout => '1 hour', lease_token => $3)",
      [fx.held, fx.heldAttempt, fx.heldToken],
    ],
    check: (r) => expect(r).toEqual([{ status: "waiting", payload: null }]),
  },
  { name: "emit", sql: () => ["SELECT idemq.emit(event => 'roles-event', key => 'k', payload => '{}') AS woken", []], check: (r) => expect(r).toEqual([{ woken: 0 }]) },
  { name: "history", sql: () => ["SELECT * FROM idemq.history(since => '1 day')", []] },
  {
    name: "worker_seen",
    sql: () => ["SELECT idemq.worker_seen(worker_id => 'roles-w', queues => ARRAY[$1::text], tasks => '{report}')", [fx.queue]],
  },
  { name: "worker_stopped", sql: () => ["SELECT idemq.worker_stopped(worker_id => 'roles-w') AS gone", []], check: (r) => expect(r).toEqual([{ gone: false }]) },
  { name: "workers", sql: () => ["SELECT * FROM idemq.workers()", []] },
  {
    name: "unserved_jobs",
    sql: () => ["SELECT * FROM idemq.unserved_jobs(seen_within => '2 minutes') WHERE queue = $1", [fx.queue]],
    check: (r) => expect(r).toMatchObject([{ queue: fx.queue, jobs: "1" }]),
  },
  { name: "write idemq.workers directly", sql: () => ["INSERT INTO idemq.workers (worker_id) VALUES ('roles-direct')", []] },
  { name: "retry_horizon", sql: () => [`SELECT idemq.retry_horizon(backoff => '{"kind": "polynomial"}', counted_attempts => 1, max_attempts => 3) AS h`, []] },
  { name: "tick", sql: () => ["SELECT * FROM idemq.tick()", []] },
  {
    name: "schedule",
    sql: () => [`SELECT * FROM idemq.schedule(name => 'roles-schedule', cron => '0 3 * * *', task => 'report')`, []],
  },
  {
    name: "schedules",
    sql: () => ["SELECT name, payload FROM idemq.schedules() WHERE name = 'roles-fixture'", []],
    // A schedule's payload, as a job's, only for a login that may read the table.
    check: (r, who) => expect(r).toEqual([{ name: "roles-fixture", payload: who === "admin" ? fx.payload : null }]),
  },
  {
    name: "schedule_next",
    sql: () => [`SELECT * FROM idemq.schedule_next(cron => '0 3 * * *', timezone => 'UTC', after => now(), count => 2)`, []],
  },
  { name: "unschedule", sql: () => ["SELECT idemq.unschedule(name => 'roles-schedule') AS removed", []] },
  { name: "active_states", sql: () => ["SELECT idemq.active_states() AS s", []] },
  { name: "terminal_states", sql: () => ["SELECT idemq.terminal_states() AS s", []] },
  { name: "schema_version", sql: () => ["SELECT idemq.schema_version() AS v", []] },
  { name: "read jobs (payloads)", sql: () => ["SELECT j.payload FROM idemq.jobs j WHERE j.id = $1", [fx.enqueued]], check: (r) => expect(r).toEqual([{ payload: fx.payload }]) },
  { name: "read keys", sql: () => ["SELECT count(k.payload_md5) FROM idemq.keys k", []] },
  // The job page's reads beside job(): no payload, no result.
  {
    name: "read a job's links and key entry",
    sql: () => [
      `SELECT (SELECT count(*) FROM idemq.job_dependencies d JOIN idemq.jobs j ON j.id = d.parent_id) AS links,
              (SELECT count(*) FROM idemq.keys k WHERE k.finished_at IS NULL OR k.created_at < now()) AS keys,
              (SELECT max(j.task) FROM idemq.jobs j WHERE j.id = $1 AND j.state IS NOT NULL) AS task`,
      [fx.enqueued],
    ],
    check: (r) => expect(r).toEqual([expect.objectContaining({ task: "roles" })]),
  },
  { name: "read jobs' results", sql: () => ["SELECT j.result FROM idemq.jobs j WHERE j.id = $1", [fx.enqueued]] },
  { name: "update jobs directly", sql: () => ["UPDATE idemq.jobs SET result = '1' WHERE id = $1", [fx.held]] },
  {
    name: "insert jobs directly",
    sql: () => ["INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, max_attempts) VALUES ('x', 'q', '{}', 'enqueued', 0, now(), 1)", []],
  },
  { name: "use the job id sequence", sql: () => ["SELECT nextval('idemq.jobs_id_seq')", []] },
  { name: "change a limit (idemq.settings.value)", sql: () => ["UPDATE idemq.settings SET value = 100 WHERE name = 'task_bytes'", []] },
  { name: "write idemq.enqueue_limits directly", sql: () => ["UPDATE idemq.enqueue_limits SET task_bytes = 1", []] },
  { name: "write idemq.success_retention directly", sql: () => ["UPDATE idemq.success_retention SET default_zero = NOT default_zero", []] },
  { name: "call a private helper", sql: () => ["SELECT idemq._raise_not_held(job_id => $1, attempt => 0, operation => 'x')", [fx.held]] },
];

const CONSTANTS = ["active_states", "terminal_states", "schema_version"];
const WORKER_OPS = [
  "job", "claim", "complete", "complete_many", "complete_and_take_next", "fail", "heartbeat", "snooze", "guard", "effect_claim", "effect_done",
  "effect_release", "rescue", "wait_for_jobs", "stop_waiting", "prune_keys", "tick", "apply_retention",
  "worker_seen", "worker_stopped", "stats", "limits", "declare_limit", "hold", "progress", "roll_up",
  "step_record", "steps", "sleep", "await_event",
  "job_result", "children", "spawn", "wait_for_children",
];
// Reads, and nothing that writes (the dashboard as a read-only operator).
const VIEWER_OPS = [
  "job", "find_jobs", "count_jobs", "overview", "stats", "limits", "held_keys", "workers", "unserved_jobs",
  "schedules", "schedule_next", "retry_horizon", "history", "children",
];
const FUNCTIONS = OPERATIONS.map((o) => o.name).filter((n) => /^[a-z_]+$/.test(n) && !n.startsWith("_"));
const ALLOWED: Record<Who, string[]> = {
  producer: ["enqueue", "enqueue_many", "job", "emit", "job_result", "children", "enqueue_batch", ...CONSTANTS],
  worker: [...WORKER_OPS, ...CONSTANTS],
  admin: [...FUNCTIONS, "read jobs (payloads)", "read keys", "read a job's links and key entry", "read jobs' results", "change a limit (idemq.settings.value)"],
  viewer: [...VIEWER_OPS, ...CONSTANTS, "read a job's links and key entry"],
  stranger: [],
};

describe("the role-by-operation matrix, as real non-superuser logins", () => {
  it("covers every public function of idemq", async () => {
    const { rows } = await db.pool.query<{ name: string }>(
      "SELECT p.proname AS name FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace AND left(p.proname, 1) <> '_' ORDER BY 1",
    );
    expect([...FUNCTIONS].sort()).toEqual(rows.map((r) => r.name));
  });

  describe.each(["producer", "worker", "admin", "viewer", "stranger"] as const)("%s", (who) => {
    it.each(OPERATIONS.map((o) => [o.name, o] as const))(`%s: ${who} allowed or refused (42501) as the matrix says`, async (_name, op) => {
      const session = sessions[who];
      const [text, values] = op.sql();
      await session.query("BEGIN");
      try {
        if (ALLOWED[who].includes(op.name)) {
          const { rows } = await session.query(text, values);
          op.check?.(rows, who);
        } else {
          expect(await sqlState(session.query(text, values))).toBe("42501");
        }
      } finally {
        await session.query("ROLLBACK");
      }
      // A refused call changed nothing, an allowed one was rolled back: the fixtures are as they were.
      expect(await jobRow(db.pool, fx.held)).toMatchObject({ state: "processing", attempt: fx.heldAttempt, result: null });
    });
  });

  it("no role, and not PUBLIC, holds a table privilege on idemq other than idemq_admin's SELECT and the viewer's on job_dependencies", async () => {
    const { rows } = await db.pool.query<{ grantee: string; table: string; privilege: string }>(`
      SELECT g.grantee, g.table_name AS table, g.privilege_type AS privilege
        FROM information_schema.role_table_grants g
       WHERE g.table_schema = 'idemq' AND g.grantee <> (SELECT r.rolname FROM pg_roles r JOIN pg_namespace n ON n.nspowner = r.oid WHERE n.nspname = 'idemq')
       ORDER BY 1, 2, 3`);
    expect(rows.filter((r) => !(r.grantee === ROLES.admin && r.privilege === "SELECT"))).toEqual([
      { grantee: ROLES.viewer, table: "job_dependencies", privilege: "SELECT" },
    ]);
    // The viewer's columns: none holds a payload, a result or an error.
    const { rows: columns } = await db.pool.query<{ table: string; column: string }>(
      `SELECT g.table_name AS table, g.column_name AS column FROM information_schema.role_column_grants g
        WHERE g.table_schema = 'idemq' AND g.grantee = $1 AND g.table_name <> 'job_dependencies' ORDER BY 1, 2`,
      [ROLES.viewer],
    );
    expect(columns).toEqual([
      { table: "jobs", column: "id" }, { table: "jobs", column: "state" }, { table: "jobs", column: "task" },
      { table: "keys", column: "created_at" }, { table: "keys", column: "finished_at" }, { table: "keys", column: "finished_state" },
      { table: "keys", column: "job_id" }, { table: "keys", column: "key" }, { table: "keys", column: "task" },
    ]);
    expect(rows.filter((r) => r.grantee === ROLES.admin).map((r) => r.table)).toContain("jobs");
  });

  it("an idemq_admin member's change of a setting reaches the rows enqueues and completions read, which the admin may not write", async () => {
    const admin = sessions.admin;
    await admin.query("BEGIN");
    try {
      await admin.query("UPDATE idemq.settings SET value = 5 WHERE name = 'task_bytes'");
      expect((await admin.query("SELECT task_bytes FROM idemq.enqueue_limits")).rows).toEqual([{ task_bytes: "5" }]);
      // And a change of the succeeded default reaches the row completions read.
      await admin.query("UPDATE idemq.settings SET value = 0 WHERE name = 'retention_succeeded_seconds'");
      expect((await admin.query("SELECT default_zero FROM idemq.success_retention")).rows).toEqual([{ default_zero: true }]);
      // Last: the refused enqueue ends the transaction's use.
      expect(await sqlState(admin.query("SELECT * FROM idemq.enqueue(task => 'sixsix', queue => $1)", [fx.queue]))).toBe("22023");
    } finally {
      await admin.query("ROLLBACK");
    }
    // Rolled back: the kept row is the settings row again.
    const { rows } = await db.pool.query(
      "SELECT l.task_bytes, s.value FROM idemq.enqueue_limits l, idemq.settings s WHERE s.name = 'task_bytes'",
    );
    expect(rows).toHaveLength(1);
    expect(rows[0].task_bytes).toBe(rows[0].value);
    expect(rows[0].task_bytes).not.toBe("5");
  });

  it("_grant_roles again grants the same and changes no privilege (idempotent)", async () => {
    const acl = "SELECT p.proname, p.proacl::text FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace ORDER BY 1";
    const before = (await db.pool.query(acl)).rows;
    const granted = (await db.pool.query<{ role: string; privilege: string }>("SELECT * FROM idemq._grant_roles()")).rows;
    expect(new Set(granted.map((g) => g.role))).toEqual(new Set(Object.values(ROLES)));
    expect(granted).toContainEqual({ role: ROLES.worker, privilege: "EXECUTE ON FUNCTION idemq.claim(text,text[],integer,interval,text[],boolean)" });
    expect((await db.pool.query(acl)).rows).toEqual(before);
  });
});

describe("a worker logged in as an idemq_worker member", () => {
  afterEach(async () => {
    await stopWorkers();
  });

  it("records its handler's error and retries the job on its backoff, then fails it for good", async () => {
    const queue = unique("roles-worker");
    const w = await startTestWorker(
      logins.worker.urlFor(db.name),
      {
        flaky: {
          maxAttempts: 2,
          backoff: { kind: "fixed", delays: ["1 second"] },
          run: async () => {
            throw new Error("boom from a worker without table privileges");
          },
        },
      },
      { queues: [queue] },
    );
    const { rows } = await sessions.producer.query<{ job_id: string }>(
      "SELECT job_id FROM idemq.enqueue(task => 'flaky', queue => $1)",
      [queue],
    );
    const id = rows[0]!.job_id;
    const failed = await waitFor(async () => {
      const job = await jobRow(db.pool, id);
      return job.state === "failed" ? job : undefined;
    }, { what: `the job to fail after two attempts (worker:error ${JSON.stringify(w.of("worker:error"))})`, timeoutMs: 20_000 });
    const errors = failed.errors as { attempt: number; message: string; failed_at: string }[];
    expect(errors.map((e) => [e.attempt, e.message])).toEqual([
      [1, "boom from a worker without table privileges"],
      [2, "boom from a worker without table privileges"],
    ]);
    // The retry waited out its backoff (1 second) before the second attempt.
    expect(Date.parse(errors[1]!.failed_at) - Date.parse(errors[0]!.failed_at)).toBeGreaterThanOrEqual(1000);
    expect(w.of("job:retry")).toHaveLength(1);
    expect(w.of("job:failed")).toHaveLength(1);
    expect(w.of("worker:error"), "no call of the worker was refused").toEqual([]);
  }, 30_000);
});
