// The migration runner (src/migrate.ts): idempotent, reversible (where a migration has a Down), safe under
// concurrency, one transaction per migration (a failed one leaves those
// before it applied), and its psql script builds the same catalog as `migrate`.
// Each case runs on the package's sql/migrations and on a fixture set, so the
// runner is proven on its own and the real migrations are proven with it.
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { DEFAULT_MIGRATIONS_DIR, migrate, migrationStatus, pendingSql } from "../../src/migrate.ts";
import { catalogSnapshot } from "../helpers/catalog.ts";
import { useTestDatabases, type TestDatabase } from "../helpers/db.ts";

const run = promisify(execFile);
const FIXTURE_MIGRATIONS = resolve(import.meta.dirname, "..", "fixtures", "migrations");

const makeDatabase = useTestDatabases();

async function emptyDatabase(): Promise<TestDatabase> {
  const db = await makeDatabase({ empty: true });
  return db;
}

/** Rows of idemq_meta.migrations, in insertion order ([] when the table does not exist). */
async function appliedRows(db: TestDatabase): Promise<string[]> {
  const exists = await db.pool.query("SELECT to_regclass('idemq_meta.migrations') IS NOT NULL AS found");
  if (!exists.rows[0].found) return [];
  const { rows } = await db.pool.query<{ name: string }>("SELECT name FROM idemq_meta.migrations ORDER BY id");
  return rows.map((row) => row.name);
}

const psqlAvailable = await run("psql", ["--version"]).then(
  () => true,
  () => false,
);

describe.each([
  { set: "sql/migrations", migrationsDir: DEFAULT_MIGRATIONS_DIR },
  { set: "fixture migrations", migrationsDir: FIXTURE_MIGRATIONS },
])("migrations: $set", ({ migrationsDir }) => {
  async function allNames(db: TestDatabase): Promise<string[]> {
    return (await migrationStatus({ connectionString: db.url, migrationsDir })).pending;
  }

  it("running migrate twice is a no-op the second time", async () => {
    const db = await emptyDatabase();
    const names = await allNames(db);
    expect(await migrate({ connectionString: db.url, migrationsDir })).toEqual(names);
    const after = await catalogSnapshot(db.pool);
    expect(await migrate({ connectionString: db.url, migrationsDir })).toEqual([]);
    expect(await catalogSnapshot(db.pool)).toEqual(after);
    expect(await migrationStatus({ connectionString: db.url, migrationsDir })).toEqual({ applied: names, pending: [] });
    expect(await appliedRows(db)).toEqual(names);
  });

  it("4 concurrent migrate calls on an empty database: each migration runs exactly once", async () => {
    const db = await emptyDatabase();
    const names = await allNames(db);
    const results = await Promise.all(
      Array.from({ length: 4 }, () => migrate({ connectionString: db.url, migrationsDir })),
    );
    expect(results.flat().sort()).toEqual([...names].sort());
    expect(await appliedRows(db)).toEqual(names);
  });

  it.skipIf(!psqlAvailable)("pendingSql applied with psql builds the same catalog as migrate", async () => {
    const [viaMigrate, viaPsql] = await Promise.all([emptyDatabase(), emptyDatabase()]);
    const names = await allNames(viaMigrate);
    await migrate({ connectionString: viaMigrate.url, migrationsDir });

    const script = await pendingSql({ connectionString: viaPsql.url, migrationsDir });
    const dir = await mkdtemp(join(tmpdir(), "idemq-sql-"));
    try {
      const file = join(dir, "pending.sql");
      await writeFile(file, script);
      await run("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", file, viaPsql.url], { env: psqlEnv() });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }

    expect(await catalogSnapshot(viaPsql.pool)).toEqual(await catalogSnapshot(viaMigrate.pool));
    expect(await appliedRows(viaPsql)).toEqual(names);
    expect(await migrationStatus({ connectionString: viaPsql.url, migrationsDir })).toEqual({
      applied: names,
      pending: [],
    });
    expect(await migrate({ connectionString: viaPsql.url, migrationsDir })).toEqual([]);
    expect(await pendingSql({ connectionString: viaPsql.url, migrationsDir })).toBe(
      "-- idemq: no pending migrations\n",
    );
  });
});

describe("migrations: reverted (fixture set; sql/migrations are forward-only, test/install/upgrade.test.ts)", () => {
  const migrationsDir = FIXTURE_MIGRATIONS;

  it("up, down, up gives the same catalog", async () => {
    const db = await emptyDatabase();
    const names = (await migrationStatus({ connectionString: db.url, migrationsDir })).pending;
    await migrate({ connectionString: db.url, migrationsDir });
    const first = await catalogSnapshot(db.pool);

    const reverted = await migrate({ connectionString: db.url, migrationsDir, direction: "down", count: names.length });
    expect(reverted).toEqual([...names].reverse());
    expect(await appliedRows(db)).toEqual([]);
    const { rows } = await db.pool.query("SELECT 1 FROM pg_namespace WHERE nspname = 'idemq'");
    expect(rows).toHaveLength(0);

    expect(await migrate({ connectionString: db.url, migrationsDir })).toEqual(names);
    expect(await catalogSnapshot(db.pool)).toEqual(first);
  });
});

describe("migrations: partly applied (fixture set)", () => {
  const migrationsDir = FIXTURE_MIGRATIONS;

  it("status and pendingSql cover only what is not applied yet; count limits migrate", async () => {
    const db = await emptyDatabase();
    expect(await migrate({ connectionString: db.url, migrationsDir, count: 1 })).toEqual(["0001_fixture_schema"]);
    expect(await migrationStatus({ connectionString: db.url, migrationsDir })).toEqual({
      applied: ["0001_fixture_schema"],
      pending: ["0002_fixture_more"],
    });
    const script = await pendingSql({ connectionString: db.url, migrationsDir });
    expect(script).toMatch(/^BEGIN;$/m);
    expect(script).toMatch(/^COMMIT;$/m);
    expect(script).toContain("0002_fixture_more");
    expect(script).not.toContain("CREATE SCHEMA idemq;");
  });

  it.skipIf(!psqlAvailable)("a stale script refuses to run twice and changes nothing", async () => {
    const db = await emptyDatabase();
    const script = await pendingSql({ connectionString: db.url, migrationsDir });
    await migrate({ connectionString: db.url, migrationsDir });
    const before = await catalogSnapshot(db.pool);
    const dir = await mkdtemp(join(tmpdir(), "idemq-sql-"));
    try {
      const file = join(dir, "stale.sql");
      await writeFile(file, script);
      const failure = await run("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", file, db.url], {
        env: psqlEnv(),
      }).then(
        () => undefined,
        (error: { code?: number; stderr?: string }) => error,
      );
      expect(failure?.code).toBe(3);
      expect(failure?.stderr).toContain("applied since this script was generated");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    expect(await catalogSnapshot(db.pool)).toEqual(before);
    expect(await appliedRows(db)).toEqual(["0001_fixture_schema", "0002_fixture_more"]);
  });

  it("migrate works on a caller's connected client and leaves it open", async () => {
    const db = await emptyDatabase();
    const client = await db.newClient();
    expect(await migrate({ client, migrationsDir })).toEqual(["0001_fixture_schema", "0002_fixture_more"]);
    expect((await client.query("SELECT idemq.fixture_add('x') AS id")).rows[0].id).toBe("1");
    expect(await migrationStatus({ client, migrationsDir })).toEqual({
      applied: ["0001_fixture_schema", "0002_fixture_more"],
      pending: [],
    });
  });
});

describe("migrations: one fails", () => {
  it("the ones before it stay applied, it is rolled back, and a caller's client is left usable without the lock", async () => {
    const db = await emptyDatabase();
    const dir = await mkdtemp(join(tmpdir(), "idemq-failing-migrations-"));
    try {
      await writeFile(join(dir, "0001_ok.sql"), "-- Up Migration\nCREATE TABLE public.ok (id int);\n-- Down Migration\nDROP TABLE public.ok;\n");
      const failing = "-- Up Migration\nCREATE TABLE public.half (id int);\nDO $$ BEGIN RAISE EXCEPTION 'fixture: this migration fails'; END $$;\n-- Down Migration\nDROP TABLE public.half;\n";
      await writeFile(join(dir, "0002_fails.sql"), failing);
      const client = await db.newClient();
      await expect(migrate({ client, migrationsDir: dir })).rejects.toMatchObject({
        code: "P0001",
        message: "migration 0002_fails failed and was rolled back (the migrations before it stay applied): fixture: this migration fails",
      });

      expect(await appliedRows(db)).toEqual(["0001_ok"]);
      const { rows } = await client.query(
        "SELECT to_regclass('public.ok') IS NOT NULL AS ok, to_regclass('public.half') IS NULL AS rolled_back, " +
          "(SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS advisory_locks",
      );
      expect(rows[0]).toEqual({ ok: true, rolled_back: true, advisory_locks: 0 });

      await writeFile(join(dir, "0002_fails.sql"), failing.replace(/^DO .*\n/m, ""));
      expect(await migrate({ client, migrationsDir: dir })).toEqual(["0002_fails"]);
      expect(await migrate({ connectionString: db.url, migrationsDir: dir })).toEqual([]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe("migrations: the server ends the connection", () => {
  it("given a URL, a 57P01 mid-migration is the error migrate rejects with, not a crash of the process", async () => {
    const db = await emptyDatabase();
    const dir = await mkdtemp(join(tmpdir(), "idemq-terminated-migrations-"));
    try {
      await writeFile(join(dir, "0001_waits.sql"), "-- Up Migration\nSELECT pg_sleep(60);\n-- Down Migration\nSELECT 1;\n");
      const running = migrate({ connectionString: db.url, migrationsDir: dir });
      const outcome = running.then(
        () => undefined,
        (error: unknown) => error,
      );
      // migrate's own connection, once it runs the migration (the pool's connection asks).
      let pid: number | undefined;
      const deadline = Date.now() + 30_000;
      while (pid === undefined && Date.now() < deadline) {
        const { rows } = await db.pool.query<{ pid: number }>(
          "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%pg_sleep(60)%'",
        );
        pid = rows[0]?.pid;
        if (pid === undefined) await new Promise((r) => setTimeout(r, 20));
      }
      expect(pid, "migrate's connection runs the migration").toBeDefined();
      await db.pool.query("SELECT pg_terminate_backend($1)", [pid]);
      // node-pg-migrate's own client had no 'error' listener: the connection
      // ending unexpectedly was an uncaught 'error' event, which ends the process.
      expect(await outcome).toMatchObject({
        code: "57P01",
        message: expect.stringContaining("migration 0001_waits failed and was rolled back"),
      });
      expect(await appliedRows(db)).toEqual([]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

function psqlEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith("PG")) delete env[key];
  return env;
}
