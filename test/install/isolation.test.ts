// Two installations on one server are isolated: each database with idemq has
// its own producer, worker and admin roles (idemq.installation, named for the
// database at install), so a login given a role in database A with
// `idemq roles grant LOGIN --worker --database-url A` may do its job in A and
// nothing at all in database B, where idemq is installed the same way: it can
// connect there (PostgreSQL grants CONNECT to PUBLIC), and every idemq call and
// table read fails with 42501. In 0.1.0 the roles were cluster-wide: a worker
// login of one database claimed the jobs of every other. Upgrading a 0.1.0
// database keeps its logins working there, through its own roles.
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { migrate } from "../../src/migrate.ts";
import { installationRoles, type RoleKind, ROLE_KINDS } from "../../src/roles.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabases, type TestDatabase } from "../helpers/db.ts";
import { createLoginRole, dropLoginRoles, type LoginRole } from "../helpers/login-roles.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";

const makeDatabase = useTestDatabases();
afterAll(async () => {
  await dropLoginRoles();
});

interface Installation {
  db: TestDatabase;
  logins: Record<RoleKind, LoginRole>;
}

/** An empty database, `idemq migrate` on it, and a login of each role granted with `idemq roles grant`, all through the CLI. */
async function install(label: string): Promise<Installation> {
  const db = await makeDatabase({ empty: true, poolSize: 2 });
  const migrated = await runCli(["migrate", "--json", "--database-url", db.url]);
  expect(migrated.code, migrated.stderr).toBe(0);
  expect(JSON.parse(migrated.stdout).applied).toEqual(MIGRATION_NAMES);
  const logins = {} as Record<RoleKind, LoginRole>;
  for (const kind of ROLE_KINDS) {
    logins[kind] = await createLoginRole(`${label}_${kind}`);
    const granted = await runCli(["roles", "grant", logins[kind].name, `--${kind}`, "--database-url", db.url]);
    expect(granted.code, granted.stderr).toBe(0);
  }
  return { db, logins };
}

/** A call of every public function of idemq, each argument NULL of its type. */
async function everyCall(db: pg.Pool): Promise<string[]> {
  const { rows } = await db.query<{ call: string }>(`
    SELECT format('SELECT idemq.%I(%s)', p.proname,
                  (SELECT string_agg(format('NULL::%s', format_type(t, NULL)), ', ' ORDER BY i)
                     FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i))) AS call
      FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace
     ORDER BY p.proname`);
  return rows.map((r) => r.call);
}

async function sqlState(client: pg.Client, sql: string): Promise<string> {
  try {
    await client.query(sql);
    return "ok";
  } catch (error) {
    return (error as { code?: string }).code ?? String(error);
  }
}

describe("two installations on one server", () => {
  let a: Installation;
  let b: Installation;
  beforeAll(async () => {
    a = await install("iso_a");
    b = await install("iso_b");
  }, 120_000);

  it("each has roles of its own, named for its database", async () => {
    expect(await installationRoles(a.db.pool)).toEqual({
      producer: `idemq_${a.db.name}_producer`,
      worker: `idemq_${a.db.name}_worker`,
      admin: `idemq_${a.db.name}_admin`,
      viewer: `idemq_${a.db.name}_viewer`,
    });
    const bRoles = Object.values(await installationRoles(b.db.pool));
    for (const role of Object.values(await installationRoles(a.db.pool))) expect(bRoles).not.toContain(role);
  });

  it("a login of each role does its job in its own database", async () => {
    for (const { db, logins } of [a, b]) {
      const producer = await logins.producer.connect(db.name);
      const { rows } = await producer.query("SELECT job_id FROM idemq.enqueue('isolated', '{\"secret\": 1}', queue => 'iso')");
      const worker = await logins.worker.connect(db.name);
      const claimed = await worker.query("SELECT id, payload FROM idemq.claim(worker_id => 'w', queues => ARRAY['iso'])");
      expect(claimed.rows).toEqual([{ id: rows[0].job_id, payload: { secret: 1 } }]);
      const admin = await logins.admin.connect(db.name);
      expect((await admin.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = 'iso'")).rows).toEqual([{ n: 1 }]);
    }
  });

  it("in the other database, each login connects and every idemq call and table read fails with 42501; nothing is written", async () => {
    const calls = await everyCall(b.db.pool);
    expect(calls.length).toBeGreaterThan(50);
    expect(calls).toContain("SELECT idemq.claim(NULL::text, NULL::text[], NULL::integer, NULL::interval, NULL::text[], NULL::boolean)");
    const before = (await b.db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs")).rows[0].n;
    for (const [mine, other] of [
      [a, b],
      [b, a],
    ] as const) {
      for (const kind of ROLE_KINDS) {
        const intruder = await mine.logins[kind].connect(other.db.name);
        const outcomes = new Map<string, string>();
        for (const call of [...calls, "SELECT * FROM idemq.jobs", "SELECT * FROM idemq.installation"]) {
          outcomes.set(call, await sqlState(intruder, call));
        }
        expect(
          [...outcomes].filter(([, state]) => state !== "42501"),
          `${kind} of ${mine.db.name} in ${other.db.name}`,
        ).toEqual([]);
      }
    }
    expect((await b.db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs")).rows[0].n).toBe(before);
  }, 120_000);
});

describe("a database upgraded from 0.1.0", () => {
  it("keeps the logins of 0.1.0's cluster-wide roles working there, through its own roles, while a database installed fresh gives them nothing", async () => {
    const old = await makeDatabase({ empty: true, poolSize: 2 });
    expect(await migrate({ connectionString: old.url, count: 1 })).toEqual([MIGRATION_NAMES[0]]);
    // A worker login of 0.1.0: a member of the cluster-wide role.
    const legacy = await createLoginRole("iso_legacy", { memberOf: ["idemq_worker"] });
    const notices: string[] = [];
    expect(await migrate({ connectionString: old.url, onNotice: (message) => notices.push(message) })).toEqual(MIGRATION_NAMES.slice(1));
    const roles = await installationRoles(old.pool);
    expect(notices.join("\n")).toContain(`idemq: ${legacy.name} (a member of the cluster-wide idemq_worker) is now a member of ${roles.worker} in database ${old.name}`);
    const { rows } = await old.pool.query("SELECT pg_has_role($1, $2, 'MEMBER') AS own, has_schema_privilege('idemq_worker', 'idemq', 'USAGE') AS shared", [
      legacy.name,
      roles.worker,
    ]);
    expect(rows[0]).toEqual({ own: true, shared: false });
    const session = await legacy.connect(old.name);
    expect(await sqlState(session, "SELECT * FROM idemq.claim(worker_id => 'legacy')")).toBe("ok");

    const fresh = await makeDatabase({ empty: true, poolSize: 1 });
    await migrate({ connectionString: fresh.url });
    const elsewhere = await legacy.connect(fresh.name);
    expect(await sqlState(elsewhere, "SELECT * FROM idemq.claim(worker_id => 'legacy')")).toBe("42501");
  }, 120_000);
});
