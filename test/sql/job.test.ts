// idemq.job(job_id): one job's state and outcome for every idemq role, with
// its payload only for a login that may read idemq.jobs. As real logins: a
// producer (and a login that is producer and worker, as `idemq roles grant
// --producer --worker` makes it) reads what became of its job through
// idemq.job() and through Client.getJob, with no table privilege.
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { installationRoles } from "../../src/roles.ts";
import { expectSqlError, useTestDatabase, sqlState } from "../helpers/db.ts";
import { makeJob, unique } from "../helpers/jobs.ts";
import { createLoginRole, dropLoginRoles, type LoginRole } from "../helpers/login-roles.ts";
import { claimJob, complete, fail } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });
const logins = {} as Record<"producer" | "producerWorker" | "worker" | "admin" | "stranger", LoginRole>;
const sessions = {} as Record<keyof typeof logins, pg.Client>;

// Committed by the superuser: a failed-then-retried job that succeeded, and one that failed for good.
const fx = { payload: { email: "ada@example.com", token: "secret" }, done: "", failed: "" };

const COLUMNS = [
  "job_id", "task", "queue", "payload", "state", "priority", "run_at", "attempt", "uncounted", "max_attempts",
  "idempotency_key", "locked_by", "locked_at", "lease_expires_at", "errors", "result", "created_at", "finished_at",
  "expires_at", "concurrency_key", "waiting_for", "progress",
];

beforeAll(async () => {
  const ROLES = await installationRoles(db.pool);
  logins.producer = await createLoginRole("job_p", { memberOf: [ROLES.producer] });
  logins.producerWorker = await createLoginRole("job_pw", { memberOf: [ROLES.producer, ROLES.worker] });
  logins.worker = await createLoginRole("job_w", { memberOf: [ROLES.worker] });
  logins.admin = await createLoginRole("job_a", { memberOf: [ROLES.admin] });
  logins.stranger = await createLoginRole("job_s");
  for (const who of Object.keys(logins) as (keyof typeof logins)[]) sessions[who] = await logins[who].connect(db.name);

  fx.done = await makeJob(db.pool, { task: "send", queue: unique("job"), payload: fx.payload, idempotency_key: unique("job-key") });
  await fail(db.pool, fx.done, await claimJob(db.pool, fx.done), { class: "SmtpError", message: "421 try later" }, { retry_at: "2000-01-01T00:00:00Z" });
  await complete(db.pool, fx.done, await claimJob(db.pool, fx.done), { sent: true });
  fx.failed = await makeJob(db.pool, { task: "charge", queue: unique("job"), max_attempts: 1 });
  await fail(db.pool, fx.failed, await claimJob(db.pool, fx.failed), { class: "CardDeclined", message: "no" });
}, 60_000);

afterAll(async () => {
  await dropLoginRoles();
});

describe("idemq.job", () => {
  it("returns the job's row of idemq.job_row: every column, equal to the stored job's", async () => {
    const { rows, fields } = await db.pool.query("SELECT * FROM idemq.job(job_id => $1)", [fx.done]);
    expect(fields.map((f) => f.name)).toEqual(COLUMNS);
    // waiting_for is derived (NULL for a finished job), not a column of idemq.jobs.
    const stored = await db.pool.query(
      `SELECT ${COLUMNS.map((c) => (c === "job_id" ? "id AS job_id" : c === "waiting_for" ? "NULL::text AS waiting_for" : c)).join(", ")} FROM idemq.jobs WHERE id = $1`,
      [fx.done],
    );
    expect(rows).toEqual(stored.rows);
    expect(rows[0]).toMatchObject({
      job_id: fx.done,
      task: "send",
      state: "succeeded",
      attempt: 2,
      result: { sent: true },
      payload: fx.payload,
      errors: [expect.objectContaining({ attempt: 1, class: "SmtpError", message: "421 try later" })],
    });
  });

  it("returns no row for a job that does not exist, and 22004 for a NULL id", async () => {
    expect((await db.pool.query("SELECT * FROM idemq.job(987654321)")).rows).toEqual([]);
    await expectSqlError(db.pool.query("SELECT * FROM idemq.job(NULL)"), { code: "22004", message: "job: job_id must not be NULL" });
  });

  it("a producer, a producer-and-worker and a worker login read state, attempts, errors and result, but no payload", async () => {
    for (const who of ["producer", "producerWorker", "worker"] as const) {
      const { rows } = await sessions[who].query("SELECT * FROM idemq.job($1)", [fx.failed]);
      expect(rows, who).toEqual([
        expect.objectContaining({
          job_id: fx.failed,
          task: "charge",
          state: "failed",
          attempt: 1,
          max_attempts: 1,
          payload: null,
          errors: [expect.objectContaining({ class: "CardDeclined", message: "no" })],
        }),
      ]);
      const done = await sessions[who].query("SELECT payload, result, state::text FROM idemq.job($1)", [fx.done]);
      expect(done.rows, who).toEqual([{ payload: null, result: { sent: true }, state: "succeeded" }]);
      // The table itself stays closed to them.
      expect(await sqlState(sessions[who].query("SELECT payload FROM idemq.jobs WHERE id = $1", [fx.done])), who).toBe("42501");
    }
  });

  it("an admin login, which may read idemq.jobs, gets the payload; a role in no idemq group may not call it (42501)", async () => {
    expect((await sessions.admin.query("SELECT payload FROM idemq.job($1)", [fx.done])).rows).toEqual([{ payload: fx.payload }]);
    expect(await sqlState(sessions.stranger.query("SELECT * FROM idemq.job($1)", [fx.done]))).toBe("42501");
  });

  it("reads the job as committed, without waiting for a transaction that holds its row", async () => {
    const writer = await db.newClient();
    await writer.query("BEGIN");
    try {
      await writer.query("UPDATE idemq.jobs SET result = '{\"uncommitted\": true}' WHERE id = $1", [fx.done]);
      const reader = sessions.producer;
      // Were the read to wait for the writer's row lock, it would fail here instead of hanging the test.
      await reader.query("SET statement_timeout = '5s'");
      expect((await reader.query("SELECT result FROM idemq.job($1)", [fx.done])).rows).toEqual([{ result: { sent: true } }]);
      await reader.query("RESET statement_timeout");
    } finally {
      await writer.query("ROLLBACK");
    }
  });
});

describe("Client.getJob as least-privilege logins (it read idemq.jobs directly: permission denied for table jobs)", () => {
  it("a login granted --producer --worker gets the job's state and outcome, its payload null", async () => {
    const client = new Client({ connectionString: logins.producerWorker.urlFor(db.name) });
    try {
      const { jobId } = await client.enqueue("report", { secret: 1 }, { queue: unique("job-client") });
      expect(await client.getJob(jobId)).toMatchObject({ id: jobId, task: "report", state: "enqueued", attempt: 0, payload: null, errors: [] });
      expect(await client.getJob(fx.failed)).toMatchObject({ id: fx.failed, state: "failed", errors: [expect.objectContaining({ class: "CardDeclined" })] });
      expect(await client.getJob("987654321")).toBeNull();
    } finally {
      await client.close();
    }
  });

  it("a producer login alike; an admin login gets the payload too", async () => {
    const producer = new Client({ connectionString: logins.producer.urlFor(db.name) });
    const admin = new Client({ connectionString: logins.admin.urlFor(db.name) });
    try {
      expect(await producer.getJob(fx.done)).toMatchObject({ id: fx.done, state: "succeeded", result: { sent: true }, payload: null });
      expect(await admin.getJob(fx.done)).toMatchObject({ id: fx.done, state: "succeeded", result: { sent: true }, payload: fx.payload });
    } finally {
      await producer.close();
      await admin.close();
    }
  });
});
