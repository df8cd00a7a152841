// The examples run as written, each logged in as the role its comments name
// (a login that is a member of exactly those idemq roles, no superuser, no
// table privilege on idemq), on a freshly migrated database, and show what
// their comments say: examples/sql-only.sql (the producer and worker roles,
// with psql), examples/worker.js (the producer and worker roles, plus CREATE
// on schema public for its own table) and examples/tasks.js (`idemq worker
// --tasks`, the worker role, plus CREATE on public; its jobs enqueued by a
// producer login), examples/workflow.js (durable steps: the producer and
// worker roles, plus CREATE on public).
import { execFile } from "node:child_process";
import { resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { installationRoles, type InstallationRoles } from "../../src/roles.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { createLoginRole, dropLoginRoles, type LoginRole } from "../helpers/login-roles.ts";
import { killAllWorkers, startedWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const run = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "..", "..");
const EXAMPLE = resolve(ROOT, "examples", "sql-only.sql");

const db = useTestDatabase({ poolSize: 2 });
/** The role each example's comments name. */
let producerWorker: LoginRole;
let producer: LoginRole;
let worker: LoginRole;
/** The installation's roles (the test template's, which every clone shares). */
let ROLES: InstallationRoles;

beforeAll(async () => {
  ROLES = await installationRoles(db.pool);
  producerWorker = await createLoginRole("ex_pw", { memberOf: [ROLES.producer, ROLES.worker] });
  producer = await createLoginRole("ex_p", { memberOf: [ROLES.producer] });
  worker = await createLoginRole("ex_w", { memberOf: [ROLES.worker] });
  // The tables the TypeScript examples create are their own (PostgreSQL 15 gives PUBLIC no CREATE on public).
  for (const login of [producerWorker, worker]) await db.pool.query(`GRANT CREATE ON SCHEMA public TO ${login.name}`);
});
afterAll(async () => {
  await killAllWorkers();
  // The database first: the logins own the examples' tables in it.
  await db.drop();
  await dropLoginRoles();
});

/** The cells of the first row of the nth table printed after the line `== <step>`, keyed by column. */
function rowAfter(output: string, step: string, nth = 0): Record<string, string> {
  const lines = output.split(`== ${step}`)[1]!.split("\n== ")[0]!.split("\n");
  const rules = lines.flatMap((line, i) => (/^-+(\+-+)*$/.test(line) ? [i] : []));
  const rule = rules[nth];
  if (rule === undefined) throw new Error(`no table ${nth} after "== ${step}" in:\n${lines.join("\n")}`);
  const cells = (line: string) => line.split("|").map((c) => c.trim());
  const header = cells(lines[rule - 1]!);
  return Object.fromEntries(header.map((h, i) => [h, cells(lines[rule + 1]!)[i] ?? ""]));
}

describe("examples/sql-only.sql", () => {
  it("runs with psql -v ON_ERROR_STOP=1 -f as a login in the producer and worker roles only, and shows enqueue, dedupe, claim, complete, fail-retry, stats", async () => {
    const { rows: memberOf } = await db.pool.query<{ role: string }>(
      "SELECT r.rolname AS role FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid WHERE m.member = $1::regrole ORDER BY 1",
      [producerWorker.name],
    );
    expect(memberOf.map((r) => r.role)).toEqual([ROLES.producer, ROLES.worker]);
    const { stdout } = await run("psql", ["-X", "-v", "ON_ERROR_STOP=1", "-f", EXAMPLE, producerWorker.urlFor(db.name)]);

    expect(stdout).toMatch(/^enqueued job \d+$/m);
    expect(rowAfter(stdout, "2.")).toEqual({ same_job: "t", deduplicated: "t" });
    expect(rowAfter(stdout, "3.")).toMatchObject({ task: "send_invoice", state: "processing", attempt: "1", locked_by: "psql-worker" });
    expect(rowAfter(stdout, "4.", 0)).toEqual({ go_ahead: "t" });
    expect(rowAfter(stdout, "4.", 2)).toMatchObject({ state: "succeeded", result: '{"sent": true}' });
    expect(rowAfter(stdout, "5.", 0)).toEqual({ state_after_failure: "scheduled" });
    expect(stdout).toMatch(/^claimed again: attempt 2$/m);
    expect(rowAfter(stdout, "5.", 2)).toMatchObject({ state: "succeeded", attempt: "2", errors: "1", first_error: "CardDeclined" });

    const stats = stdout.split("== 6.")[1]!;
    expect(stats).toMatch(/example\s*\|\s*charge_card\s*\|\s*succeeded\s*\|\s*1\b/);
    expect(stats).toMatch(/example\s*\|\s*send_invoice\s*\|\s*succeeded\s*\|\s*1\b/);
    expect(stats).toMatch(/^\s*\|\s*send_invoice\s*\|\s*deduplicated\s*\|\s*1\b/m);
  });

  // Before the TypeScript examples below add jobs of their own (a file's tests run in order).
  it("left the database in the state its output shows: 2 succeeded jobs, one guard row, one key", async () => {
    const { rows } = await db.pool.query(`
      SELECT (SELECT count(*) FROM idemq.jobs WHERE state = 'succeeded')::int AS succeeded,
             (SELECT count(*) FROM idemq.jobs)::int AS jobs,
             (SELECT count(*) FROM idemq.processed WHERE key = 'invoice-email:42')::int AS guards,
             (SELECT count(*) FROM idemq.keys WHERE key = 'invoice:42' AND finished_state = 'succeeded')::int AS keys`);
    expect(rows[0]).toEqual({ succeeded: 2, jobs: 2, guards: 1, keys: 1 });
  });

  it("a failing statement stops the session with a non-zero exit (ON_ERROR_STOP), so the test above cannot pass on a broken example", async () => {
    const failure = await run("psql", ["-X", "-v", "ON_ERROR_STOP=1", "-c", "SELECT idemq.cancel(job_id => 987654321)", db.url]).then(
      () => undefined,
      (error: { code?: number; stderr?: string }) => error,
    );
    expect(failure?.code).toBe(1);
    expect(failure?.stderr).toMatch(/job 987654321 does not exist/);
  });

  it("the login it runs as may not read idemq.jobs (what the example did before idemq.job()): psql stops there", async () => {
    const failure = await run("psql", ["-X", "-v", "ON_ERROR_STOP=1", "-c", "SELECT id FROM idemq.jobs", producerWorker.urlFor(db.name)]).then(
      () => undefined,
      (error: { code?: number; stderr?: string }) => error,
    );
    expect(failure?.code).toBe(1);
    expect(failure?.stderr).toMatch(/permission denied for table jobs/);
  });
});

describe("examples/worker.js", () => {
  it("runs to the end as a login in the producer and worker roles only: one ledger row per order for three credit deliveries, one email for two receipt jobs", async () => {
    const result = await new Promise<{ code: number; stdout: string; stderr: string }>((done) => {
      execFile(
        process.execPath,
        ["examples/worker.js"],
        { cwd: ROOT, env: { ...process.env, DATABASE_URL: producerWorker.urlFor(db.name) }, timeout: 60_000 },
        (error, stdout, stderr) => done({ code: error ? Number(error.code ?? 1) : 0, stdout, stderr }),
      );
    });
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("ledger rows: 2 (three credit deliveries for two orders)");
    expect(result.stdout).toContain("emails sent: 1 (two receipt jobs for one order)");
    expect(result.stdout).toMatch(/^duplicate +credit#\d+ attempt 1$/m);
    expect(result.stdout).toMatch(/^failed +send_receipt#\d+ attempt 1: not an email address: nobody$/m);
    expect(result.stdout).toMatch(/^retry +flaky_report#\d+ attempt 1: the report service timed out$/m);
    expect(result.stdout).toMatch(/^success +flaky_report#\d+ attempt 2$/m);
  }, 90_000);
});

describe("examples/workflow.js", () => {
  it("runs to the end as a login in the producer and worker roles only: a crash, a wait and a sleep, and still one reservation and one charge", async () => {
    const result = await new Promise<{ code: number; stdout: string; stderr: string }>((done) => {
      execFile(
        process.execPath,
        ["examples/workflow.js"],
        { cwd: ROOT, env: { ...process.env, DATABASE_URL: producerWorker.urlFor(db.name) }, timeout: 60_000 },
        (error, stdout, stderr) => done({ code: error ? Number(error.code ?? 1) : 0, stdout, stderr }),
      );
    });
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(result.stdout.match(/^ {2}step reserve ran$/gm)).toHaveLength(1);
    expect(result.stdout.match(/^ {2}\[payments\] charged order \d+$/gm)).toHaveLength(1);
    expect(result.stdout).toMatch(/^retry +attempt 1: the worker fell over after the charge$/m);
    expect(result.stdout).toMatch(/^emitted +example\.shipped \(woke 1 job\)$/m);
    expect(result.stdout.match(/^parked +attempt \d+$/gm)).toHaveLength(2);
    expect(result.stdout).toContain('succeeded: result {"chargeId":"ch-1","shipment":{"carrier":"ups"}}');
    expect(result.stdout).toContain("reservations: 1, charges: 1 (one each, over 4 attempts)");
  }, 90_000);
});

describe("examples/tasks.js", () => {
  it("`idemq worker --tasks examples/tasks.js` as a login in the worker role only runs what a producer login enqueues", async () => {
    const queue = "example-tasks";
    const proc = await startedWorker({ tasks: "../../../examples/tasks.js", databaseUrl: worker.urlFor(db.name), args: ["--queues", queue] });
    const client = new Client({ connectionString: producer.urlFor(db.name) });
    try {
      const greeting = await client.enqueue("send_greeting", { name: "Ada" }, { queue });
      const credits = await Promise.all([1, 2].map(() => client.enqueue("credit", { orderId: 42, amount: 10 }, { queue })));
      const ids = [greeting.jobId, ...credits.map((c) => c.jobId)];
      // The producer follows its jobs through getJob (idemq.job()), as it may.
      const jobs = await waitFor(
        async () => {
          const all = await Promise.all(ids.map((id) => client.getJob(id)));
          return all.every((j) => j?.state === "succeeded") ? all : undefined;
        },
        { what: `the example's jobs to succeed (worker stderr: ${proc.stderr().slice(-500)})`, timeoutMs: 30_000 },
      );
      expect(jobs[0]).toMatchObject({ task: "send_greeting", result: { greeted: "Ada" }, payload: null });
      expect(proc.count("job:duplicate"), "the second credit of order 42 was a duplicate").toBe(1);
      expect((await db.pool.query("SELECT order_id, amount FROM ledger")).rows).toEqual([{ order_id: 42, amount: 10 }]);
      expect(proc.count("worker:error")).toBe(0);
    } finally {
      await client.close();
      proc.child.kill("SIGTERM");
      expect((await proc.exited).code).toBe(0);
    }
  }, 60_000);
});
