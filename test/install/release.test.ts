// Release 0.1.0 squashed the 30 migrations written before it (0001_init ..
// 0030_cheaper_guard) into one, 0001_release_0_1_0. Nothing may be lost in the
// squash: the catalog it builds equals, object by object and function body by
// function body, the one the 30 built (test/fixtures/releases/
// 0.1.0-pre-release.catalog.json, written once from a database migrated
// through them, as they were at commit cc07d5b, with catalogDigest). A
// database migrated through the 30 is recognised as 0.1.0 and upgrades like
// one installed from the release; one migrated through only some is refused.
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { migrate, migrationStatus, pendingSql, PRE_RELEASE_MIGRATIONS, RELEASE_0_1_0 } from "../../src/migrate.ts";
import { catalogDigest } from "../helpers/release-catalog.ts";
import { useTestDatabases, type TestDatabase } from "../helpers/db.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";
import { psqlFile } from "../helpers/psql.ts";

const PRE_RELEASE_CATALOG = JSON.parse(
  readFileSync(new URL("../fixtures/releases/0.1.0-pre-release.catalog.json", import.meta.url), "utf8"),
);

const makeDatabase = useTestDatabases();

async function databaseAtRelease(): Promise<TestDatabase> {
  const db = await makeDatabase({ empty: true, poolSize: 3 });
  expect(await migrate({ connectionString: db.url, count: 1 })).toEqual([RELEASE_0_1_0]);
  return db;
}

/** Records `names` as the applied migrations, as a development version before 0.1.0 left them (catalog: 0.1.0's, which is the pre-release chain's). */
async function recordApplied(db: TestDatabase, names: readonly string[]): Promise<void> {
  await db.pool.query("DELETE FROM idemq_meta.migrations");
  await db.pool.query(
    "INSERT INTO idemq_meta.migrations (name, run_on) SELECT name, now() - interval '1 day' + n * interval '1 second' FROM unnest($1::text[]) WITH ORDINALITY AS u(name, n)",
    [names],
  );
}

async function recorded(db: TestDatabase): Promise<string[]> {
  const { rows } = await db.pool.query<{ name: string }>("SELECT name FROM idemq_meta.migrations ORDER BY run_on, id");
  return rows.map((r) => r.name);
}

describe("the squash", () => {
  it("0001_release_0_1_0 builds the catalog the 30 pre-release migrations built: every table, column, constraint, index, type, function body, grant, trigger and installed row", async () => {
    const db = await databaseAtRelease();
    const digest = await catalogDigest(db.pool);
    expect(Object.keys(digest.functions ?? {}).length, "the fixture and the database both list every function").toBeGreaterThan(90);
    expect(digest).toEqual(PRE_RELEASE_CATALOG);
  });

  it("the pre-release chain is the 30 migrations 0001..0030, in order, and the release comes first in sql/migrations", () => {
    expect(PRE_RELEASE_MIGRATIONS).toHaveLength(30);
    expect(PRE_RELEASE_MIGRATIONS.map((name) => parseInt(name, 10))).toEqual(Array.from({ length: 30 }, (_, i) => i + 1));
    expect(MIGRATION_NAMES[0]).toBe(RELEASE_0_1_0);
  });
});

describe("a database migrated through the 30 pre-release migrations", () => {
  it("is recognised as 0.1.0 by migrate status, and migrate records it so and applies what came after the release", async () => {
    const db = await databaseAtRelease();
    await recordApplied(db, PRE_RELEASE_MIGRATIONS);
    expect(await migrationStatus({ connectionString: db.url })).toEqual({ applied: [RELEASE_0_1_0], pending: MIGRATION_NAMES.slice(1) });
    expect(await recorded(db), "status only reads").toEqual(PRE_RELEASE_MIGRATIONS);

    expect(await migrate({ connectionString: db.url })).toEqual(MIGRATION_NAMES.slice(1));
    expect(await recorded(db)).toEqual(MIGRATION_NAMES);
    expect(await migrate({ connectionString: db.url }), "a second migrate finds nothing").toEqual([]);
  });

  it("two migrates at once: the release is recorded once and each later migration runs once", async () => {
    const db = await databaseAtRelease();
    await recordApplied(db, PRE_RELEASE_MIGRATIONS);
    const runs = await Promise.all([migrate({ connectionString: db.url }), migrate({ connectionString: db.url })]);
    expect(runs.flat().sort()).toEqual(MIGRATION_NAMES.slice(1));
    expect(await recorded(db)).toEqual(MIGRATION_NAMES);
  });

  it("the script of migrate sql records it as 0.1.0 and applies the rest with psql; migrate then finds nothing", async () => {
    const db = await databaseAtRelease();
    await recordApplied(db, PRE_RELEASE_MIGRATIONS);
    const script = await pendingSql({ connectionString: db.url });
    expect(script).toContain(`recorded as ${RELEASE_0_1_0}`);
    await psqlFile(db.url, script);
    expect(await recorded(db)).toEqual(MIGRATION_NAMES);
    expect(await migrate({ connectionString: db.url })).toEqual([]);
  });

  it("through only some of them: migrate, status and migrate sql refuse, say why and what to do, and change nothing", async () => {
    const db = await databaseAtRelease();
    const part = PRE_RELEASE_MIGRATIONS.slice(0, 12);
    await recordApplied(db, part);
    const refusal = /predates release 0\.1\.0 \(applied: 0012_retention, 12 of the 30 pre-release migrations\).*Migrate it to 0030_cheaper_guard with that development version first, or install idemq into a new database/;
    await expect(migrate({ connectionString: db.url })).rejects.toThrow(refusal);
    await expect(migrationStatus({ connectionString: db.url })).rejects.toThrow(refusal);
    await expect(pendingSql({ connectionString: db.url })).rejects.toThrow(refusal);
    expect(await recorded(db)).toEqual(part);
  });
});
