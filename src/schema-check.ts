// Whether a database has the idemq schema this version calls, and of which
// release: the functions by name and parameter names, read from the catalog,
// and the latest migration applied (idemq.schema_version()) against this
// package's own migrations. The worker checks at start() and the CLI when it
// opens a database, so an unmigrated or older database fails there with both
// versions and the fix, and a newer one is reported in one line, instead of
// calls failing later. Calls made without the check still map PostgreSQL's
// "does not exist" errors to SchemaMissingError (errors.ts).
import { readFileSync } from "node:fs";
import { releaseOfMigration, SchemaMissingError, type SchemaVersions } from "./errors.ts";
import { packageMigrationNames } from "./migrate.ts";
import { runQuery, SQL_FUNCTIONS, type Queryable } from "./sql/index.ts";

/** This package's version, from its package.json. */
export const PACKAGE_VERSION: string = (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string }).version;

/** This package's migrations, in order (read once, on first use). */
let packageMigrations: string[] | undefined;
const ownMigrations = (): string[] => (packageMigrations ??= packageMigrationNames());

/** How a database's schema compares with this package. */
export interface SchemaCheck extends SchemaVersions {
  /** Set when the database has migrations this package does not know: what to say (the package should be upgraded). */
  newer?: string;
}

/** The line for a database whose schema is newer than this package. */
export function newerSchemaMessage(database: string, versions: SchemaVersions): string {
  const at = versions.databaseMigration ?? "";
  return (
    `database ${database} has idemq ${releaseOfMigration(at)} (migration ${at}), newer than this idemq ${versions.packageVersion} ` +
    `(migration ${versions.packageMigration}): upgrade this package (npm install idemq@latest) so its calls match the schema`
  );
}

/**
 * Resolves with the versions when every function of SQL_FUNCTIONS exists in
 * schema idemq with its parameters and no migration of this package is
 * pending (`newer` set when the database is ahead of it); else throws
 * SchemaMissingError naming both versions and `idemq migrate`.
 */
export async function checkSchema(db: Queryable): Promise<SchemaCheck> {
  const [row] = await runQuery<{ database: string; functions: Record<string, string[]> }>(
    db,
    `SELECT current_database() AS database,
            (SELECT coalesce(jsonb_object_agg(p.proname, coalesce(p.proargnames, '{}')), '{}')
               FROM pg_catalog.pg_proc p
               JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'idemq') AS functions`,
    [],
  );
  const { database, functions } = row!;
  const own = ownMigrations();
  const versions: SchemaVersions = {
    databaseMigration: functions["schema_version"] === undefined ? undefined : await schemaVersion(db),
    packageVersion: PACKAGE_VERSION,
    packageMigration: own.at(-1) ?? "",
  };
  const missing = Object.entries(SQL_FUNCTIONS)
    .filter(([name, params]) => {
      const found = functions[name];
      return found === undefined || params.some((param) => !found.includes(param));
    })
    .map(([name, params]) => `idemq.${name}(${params.join(", ")})`);
  const at = versions.databaseMigration;
  const older = at !== undefined && own.includes(at) && own.indexOf(at) < own.length - 1;
  if (missing.length === 0 && !older) {
    return at !== undefined && !own.includes(at) ? { ...versions, newer: newerSchemaMessage(database, versions) } : versions;
  }
  const noSchema = Object.keys(functions).length === 0;
  throw new SchemaMissingError(
    database,
    {
      // As PostgreSQL would report the first call: no schema, or no such function.
      code: noSchema ? "3F000" : "42883",
      detail: noSchema ? 'schema "idemq" does not exist' : missing.length > 0 ? `missing: ${missing.join("; ")}` : `pending: ${own.slice(own.indexOf(at!) + 1).join(", ")}`,
    },
    undefined,
    noSchema ? undefined : versions,
  );
}

async function schemaVersion(db: Queryable): Promise<string | undefined> {
  const [row] = await runQuery<{ migration: string | null }>(db, "SELECT idemq.schema_version() AS migration", []);
  return row?.migration ?? undefined;
}
