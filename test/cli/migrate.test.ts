// `idemq migrate`, `migrate status` and `migrate sql`, run as real subprocesses.
import { describe, expect, it } from "vitest";
import { migrationStatus, pendingSql } from "../../src/migrate.ts";
import { runCli } from "../helpers/cli.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";
import { useTestDatabases, type TestDatabase } from "../helpers/db.ts";

const makeDatabase = useTestDatabases();

async function emptyDatabase(): Promise<TestDatabase> {
  const db = await makeDatabase({ empty: true });
  return db;
}

function expectOneLineError(stderr: string): void {
  const lines = stderr.trimEnd().split("\n");
  expect(lines, stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^idemq: /);
  expect(stderr).not.toMatch(/^\s+at /m);
}

describe("idemq migrate", () => {
  it("--json applies the pending migrations, then status shows none pending, then migrate is a no-op", async () => {
    const db = await emptyDatabase();
    const { pending } = await migrationStatus({ connectionString: db.url });

    const before = await runCli(["migrate", "status", "--database-url", db.url, "--json"]);
    expect(before).toMatchObject({ code: 0, stderr: "" });
    expect(JSON.parse(before.stdout)).toEqual({ applied: [], pending });

    const first = await runCli(["migrate", "--database-url", db.url, "--json"]);
    expect(first).toMatchObject({ code: 0, stderr: "" });
    expect(JSON.parse(first.stdout)).toEqual({ applied: pending });

    const status = await runCli(["migrate", "status", "--database-url", db.url, "--json"]);
    expect(status).toMatchObject({ code: 0, stderr: "" });
    expect(JSON.parse(status.stdout)).toEqual({ applied: pending, pending: [] });

    const again = await runCli(["migrate", "--json", "--database-url", db.url]);
    expect(again).toMatchObject({ code: 0, stderr: "" });
    expect(JSON.parse(again.stdout)).toEqual({ applied: [] });
  });

  it("reads DATABASE_URL and prints readable text without --json", async () => {
    const db = await emptyDatabase();
    const { pending } = await migrationStatus({ connectionString: db.url });
    const applied = await runCli(["migrate"], { env: { DATABASE_URL: db.url } });
    expect(applied).toMatchObject({ code: 0, stderr: "" });
    expect(applied.stdout).toBe(
      pending.length === 0 ? "No pending migrations.\n" : pending.map((name) => `Applied ${name}\n`).join(""),
    );
    const status = await runCli(["migrate", "status"], { env: { DATABASE_URL: db.url } });
    expect(status).toMatchObject({ code: 0, stderr: "" });
    expect(status.stdout).toBe([...pending.map((name) => `applied  ${name}\n`), "Up to date.\n"].join(""));
  });

  it("migrate sql prints the pending migrations, each in a transaction of its own, and changes nothing", async () => {
    const db = await emptyDatabase();
    const result = await runCli(["migrate", "sql", "--database-url", db.url]);
    expect(result).toMatchObject({ code: 0, stderr: "" });
    expect(result.stdout).toBe(await pendingSql({ connectionString: db.url }));
    const { pending } = await migrationStatus({ connectionString: db.url });
    expect(pending).toEqual(MIGRATION_NAMES);
    // Per migration, in order: BEGIN, its file, its bookkeeping row, COMMIT.
    const blocks = [...result.stdout.matchAll(/^-- ==== (\w+)\.sql ====\nBEGIN;\n[\s\S]*?^INSERT INTO "idemq_meta"\."migrations" \(name, run_on\) VALUES \('(\w+)', NOW\(\)\);\nCOMMIT;$/gm)];
    expect(blocks.map((m) => [m[1], m[2]])).toEqual(pending.map((name) => [name, name]));
    expect(result.stdout.match(/^BEGIN;$/gm)).toHaveLength(pending.length);
    expect(result.stdout.match(/^COMMIT;$/gm)).toHaveLength(pending.length);
    expect(result.stdout.trimEnd()).toMatch(/COMMIT;$/);
    const { rows } = await db.pool.query("SELECT to_regnamespace('idemq_meta') IS NULL AS untouched");
    expect(rows[0].untouched).toBe(true);
  });

  it("an unreachable database: one line on stderr, exit 1, no stack trace", async () => {
    const result = await runCli(["migrate", "--database-url", "postgres://postgres@127.0.0.1:1/nowhere"]);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe("");
    expectOneLineError(result.stderr);
    expect(result.stderr).toContain("cannot connect to the database");
  });

  it("a database that does not exist: the server's message and SQLSTATE, exit 1", async () => {
    const db = await emptyDatabase();
    const missing = db.url.replace(db.name, `${db.name}_missing`);
    const result = await runCli(["migrate", "status", "--json", "--database-url", missing]);
    expect(result.code).toBe(1);
    expectOneLineError(result.stderr);
    expect(result.stderr).toContain("SQLSTATE 3D000");
  });

  it("migrate sql with no database given: exit 2 with one line saying why it needs one and how to give it", async () => {
    // (migrate and migrate status use the embedded server then: test/cli/embedded-share.test.ts.)
    const result = await runCli(["migrate", "sql"]);
    expect(result.code).toBe(2);
    expectOneLineError(result.stderr);
    expect(result.stderr).toContain("a script for a DBA to apply to their own server");
    expect(result.stderr).toContain("--database-url");
    expect(result.stderr).toContain("DATABASE_URL");
  });

  it("an unknown option is a usage error: exit 2", async () => {
    const result = await runCli(["migrate", "--no-such-option"]);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("unknown option");
  });
});
