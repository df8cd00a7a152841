// A worker or CLI started against a database whose schema is older or newer
// than its own says so at start, naming both versions and the command that
// fixes it: older (0.1.0, or a migration of this package pending) stops the
// worker's start() and the CLI command with `idemq migrate`; newer (a
// migration this package does not know) is one warn line, and both keep
// working. idemq.schema_version() names the latest migration applied.
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { SchemaMissingError } from "../../src/index.ts";
import { migrate } from "../../src/migrate.ts";
import { installationRoles } from "../../src/roles.ts";
import { PACKAGE_VERSION } from "../../src/schema-check.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabases, type TestDatabase } from "../helpers/db.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";

const LATEST = MIGRATION_NAMES.at(-1)!;
const makeDatabase = useTestDatabases();
afterEach(async () => {
  await stopWorkers();
});
afterAll(async () => {
  await dropLoginRoles();
});

async function database(options: { empty?: boolean } = {}): Promise<TestDatabase> {
  const db = await makeDatabase({ ...options, poolSize: 2 });
  return db;
}

const noop = { noop: async () => {} };

describe("idemq.schema_version()", () => {
  it("names the latest migration applied, and every role of the installation may call it", async () => {
    const db = await database();
    expect((await db.pool.query("SELECT idemq.schema_version() AS v")).rows).toEqual([{ v: LATEST }]);
    const roles = await installationRoles(db.pool);
    for (const role of Object.values(roles)) {
      const login = await createLoginRole("version", { memberOf: [role] });
      const session = await login.connect(db.name);
      expect((await session.query("SELECT idemq.schema_version() AS v")).rows).toEqual([{ v: LATEST }]);
    }
  });
});

describe("an older schema", () => {
  it("0.1.0: the worker's start() and a CLI command refuse, naming both versions and idemq migrate", async () => {
    const db = await database({ empty: true });
    await migrate({ connectionString: db.url, count: 1 });
    const expected = `database ${db.name} has an idemq schema older than 0.2.0, older than this idemq ${PACKAGE_VERSION} (migration ${LATEST}): run \`idemq migrate --database-url <url>\``;
    const started = startTestWorker(db.url, noop);
    await expect(started).rejects.toBeInstanceOf(SchemaMissingError);
    await expect(started).rejects.toThrow(expected);
    const cli = await runCli(["jobs", "--database-url", db.url]);
    expect(cli.code).not.toBe(0);
    expect(cli.stderr).toMatch(new RegExp(`database ${db.name} at \\S+ has an idemq schema older than 0\\.2\\.0, older than this idemq`));
    expect(cli.stderr).toContain(`older than this idemq ${PACKAGE_VERSION} (migration ${LATEST}): run \`idemq migrate --database-url <url>\``);
  });

  it("a migration of this package pending though every function is there: refused, naming the database's release and the pending migration", async () => {
    const db = await database();
    // As if the latest migration had not run (its functions are there: only the record says which release this is).
    await db.pool.query("DELETE FROM idemq_meta.migrations WHERE name = $1", [LATEST]);
    const previous = MIGRATION_NAMES.at(-2)!;
    const started = startTestWorker(db.url, noop);
    await expect(started).rejects.toThrow(`has idemq 0.1.0 (migration ${previous}), older than this idemq ${PACKAGE_VERSION} (migration ${LATEST}): run \`idemq migrate`);
    await expect(started).rejects.toMatchObject({ detail: `pending: ${LATEST}` });
  });
});

describe("a newer schema", () => {
  it("the worker starts with one warn line naming both versions and the upgrade; a CLI command works and says so on stderr", async () => {
    const db = await database();
    await db.pool.query("INSERT INTO idemq_meta.migrations (name, run_on) VALUES ('0099_release_9_9_0', now() + interval '1 minute')");
    const line = `database ${db.name} has idemq 9.9.0 (migration 0099_release_9_9_0), newer than this idemq ${PACKAGE_VERSION} (migration ${LATEST}): upgrade this package`;
    const worker = await startTestWorker(db.url, noop);
    const warnings = worker.of("log").filter((entry) => entry.level === "warn");
    expect(warnings).toHaveLength(1);
    expect(warnings[0]!.message).toContain(line);
    const cli = await runCli(["jobs", "--database-url", db.url]);
    expect(cli.code, cli.stderr).toBe(0);
    expect(cli.stderr).toBe(`idemq: ${line} (npm install idemq@latest) so its calls match the schema\n`);
  });
});
