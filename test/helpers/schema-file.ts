// The schema as sql/schema.sql and sql/functions/ write it, installed into an
// empty database the way the file's header says (the file down to its line
// "-- ==== after the functions ====", every function file, helpers first,
// then the rest), and compared object by object with another database's
// catalog (test/helpers/catalog.ts), each difference named.
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type pg from "pg";
import { creationOrder, functionFiles } from "../../scripts/migration-new.mjs";
import { MIGRATIONS_SCHEMA, MIGRATIONS_TABLE } from "../../src/migrate.ts";
import { catalogSnapshot, type CatalogSnapshot } from "./catalog.ts";
import { CATALOG_KEYS, INSTALLED_ROWS } from "./release-catalog.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
export const SCHEMA_FILE = join(ROOT, "sql", "schema.sql");
export const FUNCTIONS_DIR = join(ROOT, "sql", "functions");
const AFTER_THE_FUNCTIONS = /^-- ==== after the functions ====$/m;

/** Installs schema idemq from `schemaFile` and the function files under `functionsDir` into the empty database of `client`, in one transaction. */
export async function installFromSchemaFile(client: pg.ClientBase, schemaFile = SCHEMA_FILE, functionsDir = FUNCTIONS_DIR): Promise<void> {
  const text = readFileSync(schemaFile, "utf8");
  const split = text.search(AFTER_THE_FUNCTIONS);
  if (split < 0) throw new Error(`${schemaFile} has no line "-- ==== after the functions ===="`);
  const files: Map<string, string> = functionFiles(functionsDir);
  await client.query("BEGIN");
  try {
    // As `idemq migrate` installing into an empty database: _grant_roles copies no membership of 0.1.0's roles.
    await client.query("SET LOCAL idemq.installing = on");
    // The migration runner's table (node-pg-migrate creates it, as here, on the first migrate): schema_version() reads it.
    await client.query(`CREATE SCHEMA ${MIGRATIONS_SCHEMA}; CREATE TABLE ${MIGRATIONS_SCHEMA}.${MIGRATIONS_TABLE} (id SERIAL PRIMARY KEY, name varchar(255) NOT NULL, run_on timestamp NOT NULL)`);
    await client.query(text.slice(0, split));
    for (const name of creationOrder([...files.keys()], files)) await client.query(files.get(name)!);
    await client.query(text.slice(split));
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK");
    throw error;
  }
}

/** One object that two catalogs describe differently (or only one of them has): its section and name, and both descriptions. */
export interface CatalogDifference {
  section: string;
  object: string;
  expected: unknown;
  actual: unknown;
}

/**
 * The objects of schema idemq that `actual` describes differently from
 * `expected` (catalogSnapshot, role names as placeholders), and the rows the
 * installation writes (INSTALLED_ROWS) that differ, by table.
 */
export async function catalogDifferences(expected: pg.ClientBase | pg.Pool, actual: pg.ClientBase | pg.Pool): Promise<CatalogDifference[]> {
  const [want, got] = await Promise.all([catalogSnapshot(expected), catalogSnapshot(actual)]);
  const differences: CatalogDifference[] = [];
  for (const section of Object.keys(want) as (keyof CatalogSnapshot)[]) {
    const key = CATALOG_KEYS[section];
    if (key === undefined) throw new Error(`catalogDifferences: no key for section ${section}`);
    const byKey = (rows: unknown[]) => new Map((rows as Record<string, unknown>[]).map((row) => [key(row), row]));
    const [w, g] = [byKey(want[section]), byKey(got[section])];
    for (const object of new Set([...w.keys(), ...g.keys()])) {
      if (JSON.stringify(w.get(object)) !== JSON.stringify(g.get(object))) {
        differences.push({ section, object, expected: w.get(object), actual: g.get(object) });
      }
    }
  }
  for (const table of INSTALLED_ROWS) {
    const rows = async (db: pg.ClientBase | pg.Pool) => (await db.query(`SELECT * FROM idemq.${table} ORDER BY 1`)).rows;
    const [w, g] = [await rows(expected), await rows(actual)];
    if (JSON.stringify(w) !== JSON.stringify(g)) differences.push({ section: "rows", object: table, expected: w, actual: g });
  }
  return differences;
}
