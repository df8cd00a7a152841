// sql/schema.sql, the schema in one file for a reader, is hand-edited like
// sql/functions/; the migrations are what installs. This holds the two equal:
// schema.sql and the function files, installed into an empty database, give
// the catalog of a database `migrate` built, object by object (tables,
// columns, constraints, indexes, types, functions with their bodies and
// privileges, triggers, sequences), and the same settings rows. A difference
// names the object and says where to fix it.
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { migrate } from "../../src/migrate.ts";
import { freshDatabase, type TestDatabase } from "../helpers/db.ts";
import { catalogDifferences, type CatalogDifference, installFromSchemaFile, SCHEMA_FILE } from "../helpers/schema-file.ts";

const databases: TestDatabase[] = [];
let tmp: string | undefined;
afterAll(async () => {
  await Promise.all(databases.map((db) => db.drop()));
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

async function emptyDatabase(): Promise<TestDatabase> {
  const db = await freshDatabase({ empty: true, poolSize: 2 });
  databases.push(db);
  return db;
}

async function fromSchemaFile(schemaFile = SCHEMA_FILE): Promise<TestDatabase> {
  const db = await emptyDatabase();
  const client = await db.newClient();
  await installFromSchemaFile(client, schemaFile);
  return db;
}

let migrated: Promise<TestDatabase> | undefined;
/** A database `migrate` built from nothing (every migration). */
function migratedDatabase(): Promise<TestDatabase> {
  migrated ??= emptyDatabase().then(async (db) => {
    await migrate({ connectionString: db.url });
    return db;
  });
  return migrated;
}

/** One line per differing object, saying where to fix it. */
function explain(differences: CatalogDifference[]): string {
  return differences
    .map(
      (d) =>
        `${d.section} ${d.object}: sql/schema.sql (+ sql/functions/) gives ${JSON.stringify(d.actual)}, migrate gives ${JSON.stringify(d.expected)}; ` +
        "edit sql/schema.sql to match the migrations, or, for a schema change, write it in the unreleased migration too (npm run migration:new)",
    )
    .join("\n");
}

describe("sql/schema.sql", () => {
  it("with sql/functions/, builds the catalog and the settings rows of a migrated database, object by object", async () => {
    const [viaMigrate, viaFile] = await Promise.all([migratedDatabase(), fromSchemaFile()]);
    const { rows } = await viaFile.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_class WHERE relnamespace = 'idemq'::regnamespace");
    expect(rows[0]!.n, "relations of schema idemq built from the file").toBeGreaterThan(30);
    const differences = await catalogDifferences(viaMigrate.pool, viaFile.pool);
    expect(differences, explain(differences)).toEqual([]);
  });

  it("a difference names the object and where to fix it (a CHECK edited in a copy of the file)", async () => {
    tmp = await mkdtemp(join(tmpdir(), "idemq-schema-file-"));
    const copy = join(tmp, "schema.sql");
    const text = await readFile(SCHEMA_FILE, "utf8");
    const edited = text.replace("CONSTRAINT schedules_name_length CHECK ((length(name) <= 200))", "CONSTRAINT schedules_name_length CHECK ((length(name) <= 201))");
    expect(edited).not.toBe(text);
    await writeFile(copy, edited);
    const [viaMigrate, viaCopy] = await Promise.all([migratedDatabase(), fromSchemaFile(copy)]);
    const differences = await catalogDifferences(viaMigrate.pool, viaCopy.pool);
    expect(differences.map((d) => `${d.section} ${d.object}`)).toEqual(["constraints schedules.schedules_name_length"]);
    expect(explain(differences)).toMatch(/^constraints schedules\.schedules_name_length: .*201.*200.*; edit sql\/schema\.sql .*unreleased migration/);
  });
});
