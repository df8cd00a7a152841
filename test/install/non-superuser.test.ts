// Installs as a non-superuser (issue 11, item 1): a login role that owns its
// database and is no superuser runs `idemq migrate`, or `idemq migrate sql`
// piped to psql, and then every function works for it, fail() included (its
// superuser-only SET plpgsql.variable_conflict stopped both). Also: the
// script of `idemq roles sql` as a superuser, and `idemq roles grant`. Each
// installation has its own roles, named for its database.
import { execFile } from "node:child_process";
import { afterAll, describe, expect, inject, it } from "vitest";
import { installationRoles } from "../../src/roles.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabases } from "../helpers/db.ts";
import { createLoginRole, createOwnedDatabase, dropLoginRoles, type LoginRole } from "../helpers/login-roles.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";

const makeDatabase = useTestDatabases();

afterAll(async () => {
  await dropLoginRoles();
});

/** `... | psql -v ON_ERROR_STOP=1 url`: the script on psql's standard input. */
function psqlWithInput(url: string, script: string): Promise<{ code: number; stderr: string }> {
  const env = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith("PG")) delete env[key];
  return new Promise((resolve) => {
    const child = execFile("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", url], { env, maxBuffer: 16 * 1024 * 1024 }, (error, _out, stderr) =>
      resolve({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, stderr }),
    );
    child.stdin?.end(script);
  });
}

/** Every public function, as `owner` on `database`: each must work. */
async function useEverything(owner: LoginRole, database: string): Promise<void> {
  const c = await owner.connect(database);
  const one = async (text: string, values: unknown[] = []) => (await c.query(text, values)).rows[0];
  expect(await one("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).toEqual({ rolsuper: false });
  const { job_id: id } = await one("SELECT * FROM idemq.enqueue(task => 't', queue => 'q', idempotency_key => 'k')");
  await one(`SELECT * FROM idemq.enqueue_many(jobs => '[{"task": "t", "queue": "q2"}]')`);
  await one("SELECT idemq.wait_for_jobs(queues => ARRAY['q'])");
  await one("SELECT idemq.stop_waiting(queues => ARRAY['q'])");
  const claimed = await one("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY['q'])");
  expect(claimed).toMatchObject({ job_id: id, attempt: 1 });
  await one("SELECT * FROM idemq.heartbeat(job_ids => ARRAY[$1::bigint], attempts => ARRAY[1], lease_tokens => ARRAY[$2::uuid])", [id, claimed.lease_token]);
  expect(await one(`SELECT * FROM idemq.fail(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{"class": "E", "message": "boom"}')`, [id])).toMatchObject({
    state: "scheduled",
  });
  // The error fail() recorded is there, as the owner reads it.
  expect(await one("SELECT j.errors->0->>'message' AS message FROM idemq.jobs j WHERE j.id = $1", [id])).toEqual({ message: "boom" });
  await one("SELECT idemq.reschedule(job_id => $1, run_at => now())", [id]);
  const again = await one("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY['q'])");
  expect(again).toMatchObject({ job_id: id, attempt: 2 });
  await one("SELECT idemq.snooze(job_id => $1, attempt => 2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), run_at => now())", [id]);
  const third = await one("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY['q'])");
  await one("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id, third.attempt]);
  const [second] = (await c.query("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY['q2'])")).rows;
  expect(
    await one("SELECT * FROM idemq.complete_many(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[$3::uuid]) AS id", [
      second.job_id,
      second.attempt,
      second.lease_token,
    ]),
  ).toEqual({
    id: second.job_id,
  });
  expect(await one("SELECT idemq.guard(key => 'g') AS go")).toEqual({ go: true });
  await one("SELECT * FROM idemq.effect_claim(key => 'e', owner => 'o')");
  await one("SELECT idemq.effect_done(key => 'e', owner => 'o', result => '{}')");
  await one("SELECT * FROM idemq.effect_claim(key => 'e2', owner => 'o')");
  await one("SELECT idemq.effect_release(key => 'e2', owner => 'o')");
  const { job_id: other } = await one("SELECT * FROM idemq.enqueue(task => 't')");
  expect(await one("SELECT idemq.cancel(job_id => $1)::text AS s", [other])).toEqual({ s: "cancelled" });
  expect(await one("SELECT idemq.retry(job_id => $1)::text AS s", [other])).toEqual({ s: "enqueued" });
  await one("SELECT idemq.rescue()");
  await one("SELECT idemq.purge(older_than => '0 seconds')");
  await one("SELECT idemq.prune_keys(older_than => '0 seconds')");
  await one(`SELECT idemq.retry_horizon(backoff => '{"kind": "polynomial"}', counted_attempts => 1, max_attempts => 3)`);
  await one("SELECT idemq.active_states(), idemq.terminal_states()");
  expect((await c.query("SELECT * FROM idemq.stats()")).rows.length).toBeGreaterThan(0);
}

describe("a non-superuser who owns the database", () => {
  it("`idemq migrate` installs idemq, and then every function works for it", async () => {
    const owner = await createLoginRole("owner");
    const database = await createOwnedDatabase(owner, inject("idemqTemplate"));
    const migrated = await runCli(["migrate", "--json", "--database-url", owner.urlFor(database)], { timeoutMs: 120_000 });
    expect(migrated.stderr).not.toMatch(/permission denied/);
    expect(migrated.code, migrated.stderr).toBe(0);
    expect(JSON.parse(migrated.stdout).applied).toEqual(MIGRATION_NAMES);
    await useEverything(owner, database);
  }, 180_000);

  it("`idemq migrate sql | psql` installs idemq, and then every function works for it", async () => {
    const owner = await createLoginRole("owner_psql");
    const database = await createOwnedDatabase(owner, inject("idemqTemplate"));
    const script = await runCli(["migrate", "sql", "--database-url", owner.urlFor(database)], { timeoutMs: 60_000 });
    expect(script.code, script.stderr).toBe(0);
    const psql = await psqlWithInput(owner.urlFor(database), script.stdout);
    expect(psql.stderr).not.toMatch(/ERROR/);
    expect(psql.code, psql.stderr).toBe(0);
    await useEverything(owner, database);
  }, 180_000);

  it("with CREATEROLE, the migration creates this installation's roles, named for its database, and grants them; 0.1.0's cluster-wide roles get nothing", async () => {
    const owner = await createLoginRole("owner_cr", { createRole: true });
    const database = await createOwnedDatabase(owner, inject("idemqTemplate"));
    const migrated = await runCli(["migrate", "--database-url", owner.urlFor(database)], { timeoutMs: 120_000 });
    expect(migrated.code, migrated.stderr).toBe(0);
    const c = await owner.connect(database);
    const roles = await installationRoles(c);
    expect(roles).toEqual({ producer: `idemq_${database}_producer`, worker: `idemq_${database}_worker`, admin: `idemq_${database}_admin`, viewer: `idemq_${database}_viewer` });
    const { rows } = await c.query<{ role: string; exec: boolean }>(
      `SELECT r AS role, has_function_privilege(r, 'idemq.claim(text,text[],integer,interval,text[],boolean)', 'EXECUTE') AS exec
         FROM unnest($1::text[]) r WHERE EXISTS (SELECT FROM pg_roles WHERE rolname = r)`,
      [[...Object.values(roles), "idemq_producer", "idemq_worker", "idemq_admin"]],
    );
    const byRole = (a: { role: string }, b: { role: string }) => (a.role < b.role ? -1 : 1);
    expect(rows.sort(byRole)).toEqual(
      [
        { role: roles.admin, exec: true },
        { role: roles.producer, exec: false },
        { role: roles.worker, exec: true },
        { role: roles.viewer, exec: false },
        { role: "idemq_admin", exec: false },
        { role: "idemq_producer", exec: false },
        { role: "idemq_worker", exec: false },
      ].sort(byRole),
    );
  }, 180_000);
});

describe("fail() without its SET plpgsql.variable_conflict", () => {
  it.each(["error", "use_column", "use_variable"])("records the error and schedules the retry alike under variable_conflict = %s (a fresh session compiles it anew)", async (setting) => {
    const db = await makeDatabase({ poolSize: 1 });
    const c = await db.newClient();
    await c.query(`SET plpgsql.variable_conflict = ${setting}`);
    const { rows } = await c.query("SELECT job_id FROM idemq.enqueue(task => 't', queue => 'vc', max_attempts => 2)");
    const id = rows[0].job_id;
    await c.query("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY['vc'])");
    const first = await c.query(`SELECT state::text, run_at IS NOT NULL AS has_run_at FROM idemq.fail(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{"class": "E", "message": "one"}')`, [id]);
    expect(first.rows).toEqual([{ state: "scheduled", has_run_at: true }]);
    await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", [id]);
    await c.query("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY['vc'])");
    const last = await c.query(`SELECT state::text, run_at FROM idemq.fail(job_id => $1, attempt => 2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '"two"')`, [id]);
    expect(last.rows).toEqual([{ state: "failed", run_at: null }]);
    const job = await c.query("SELECT j.errors FROM idemq.jobs j WHERE j.id = $1", [id]);
    expect(job.rows[0].errors.map((e: { attempt: number; message: string; worker: string }) => [e.attempt, e.message, e.worker])).toEqual([
      [1, "one", "w"],
      [2, "two", "w"],
    ]);
    const config = await c.query("SELECT p.proconfig FROM pg_proc p WHERE p.oid = 'idemq.fail'::regproc");
    expect(config.rows[0].proconfig).toEqual(["search_path=pg_catalog, pg_temp"]);
  });
});

describe("idemq roles", () => {
  it("roles sql prints a script a superuser runs twice with psql, where an owner without CREATEROLE migrated: the installation's roles then exist and hold their privileges", async () => {
    const sql = await runCli(["roles", "sql"]);
    expect(sql.code, sql.stderr).toBe(0);
    expect(sql.stdout).toContain("idemq._grant_roles()");
    const owner = await createLoginRole("owner_nocr");
    const database = await createOwnedDatabase(owner, inject("idemqTemplate"));
    const migrated = await runCli(["migrate", "--database-url", owner.urlFor(database)], { timeoutMs: 120_000 });
    expect(migrated.code, migrated.stderr).toBe(0);
    const c = await owner.connect(database);
    const roles = Object.values(await installationRoles(c));
    const count = async () => (await c.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_roles WHERE rolname = ANY ($1)", [roles])).rows[0]!.n;
    expect(await count(), "the owner may not create roles").toBe(0);
    const superuserUrl = new URL(inject("idemqServerUrl"));
    superuserUrl.pathname = `/${database}`;
    for (let i = 0; i < 2; i++) {
      const psql = await psqlWithInput(superuserUrl.toString(), sql.stdout);
      expect(psql.code, psql.stderr).toBe(0);
    }
    expect(await count()).toBe(4);
    const enq = await c.query("SELECT has_function_privilege($1, 'idemq.enqueue_many(jsonb)', 'EXECUTE') AS ok", [roles[0]]);
    expect(enq.rows[0]).toEqual({ ok: true });
  }, 180_000);

  it("roles sql on a database without idemq 0.2.0 stops with the fix", async () => {
    const db = await makeDatabase({ empty: true, poolSize: 1 });
    const psql = await psqlWithInput(db.url, (await runCli(["roles", "sql"])).stdout);
    expect(psql.code).not.toBe(0);
    expect(psql.stderr).toMatch(/idemq 0\.2\.0 or later is not installed in database .*\n.*HINT: {2}Run idemq migrate on this database first/);
  });

  it("roles grant makes a login role a member (--json), says so when it already is, and refuses clearly", async () => {
    const app = await createLoginRole("app");
    const db = await makeDatabase({ poolSize: 2 });
    const ROLES = await installationRoles(db.pool);
    const url = { DATABASE_URL: db.url };
    const granted = await runCli(["roles", "grant", app.name, "--worker", "--producer", "--json"], { env: url });
    expect(granted.code, granted.stderr).toBe(0);
    expect(JSON.parse(granted.stdout)).toEqual({
      role: app.name,
      granted: [
        { role: ROLES.producer, alreadyMember: false },
        { role: ROLES.worker, alreadyMember: false },
      ],
    });
    const { rows } = await db.pool.query("SELECT pg_has_role($1, $2, 'MEMBER') AS worker, pg_has_role($1, $3, 'MEMBER') AS admin", [app.name, ROLES.worker, ROLES.admin]);
    expect(rows[0]).toEqual({ worker: true, admin: false });

    const again = await runCli(["roles", "grant", app.name, "--worker"], { env: url });
    expect(again).toMatchObject({ code: 0, stdout: `${app.name} was already a member of ${ROLES.worker}.\n` });

    // The read-only operator's role, and `roles list` names it with its members.
    const viewer = await runCli(["roles", "grant", app.name, "--viewer"], { env: url });
    expect(viewer).toMatchObject({ code: 0, stdout: `Granted ${ROLES.viewer} to ${app.name}.\n` });
    const listed = await runCli(["roles", "list"], { env: url });
    expect(listed.stdout.split("\n").find((line) => line.startsWith("viewer "))).toMatch(new RegExp(`^viewer +${ROLES.viewer}: (.*, )?${app.name}(,|$)`));

    const none = await runCli(["roles", "grant", app.name], { env: url });
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/--producer, --worker, --admin or --viewer/);

    const missing = await runCli(["roles", "grant", "no_such_role_iqt", "--admin"], { env: url });
    expect(missing.code).toBe(1);
    expect(missing.stderr.trim().split("\n")).toHaveLength(1);
    expect(missing.stderr).toMatch(/role "no_such_role_iqt" does not exist: create the login role first/);

    // A login role that is neither the owner nor a superuser may not even read the installation's names: the server's refusal, with what it takes.
    const refused = await runCli(["roles", "grant", app.name, "--admin"], { env: { DATABASE_URL: app.urlFor(db.name) } });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/reading this installation's role names takes the owner of schema idemq \(the role that ran `idemq migrate`\) or a superuser/);
    expect(refused.stderr).toMatch(/SQLSTATE 42501/);
  });

  it("roles --help and roles grant --help show examples", async () => {
    const help = await runCli(["roles", "grant", "--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/Examples:\n {2}idemq roles grant app_worker --worker/);
    expect((await runCli(["roles", "sql", "--help"])).stdout).toMatch(/Examples:/);
  });
});
