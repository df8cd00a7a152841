// Migrations are the only install path (STYLE.md §2): node-pg-migrate runs the
// plain .sql files in sql/migrations, recording them in idemq_meta.migrations.
import { readFile } from "node:fs/promises";
import { basename, dirname, extname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { PG_MIGRATE_LOCK_ID, runner } from "node-pg-migrate";
import { getMigrationFilePaths } from "node-pg-migrate/migration";
import { getActions } from "node-pg-migrate/sqlMigration";
import pg from "pg";

export const MIGRATIONS_SCHEMA = "idemq_meta";
export const MIGRATIONS_TABLE = "migrations";

const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
/** sql/migrations of this package, whatever the current directory is. */
export const DEFAULT_MIGRATIONS_DIR = resolve(PACKAGE_ROOT, "sql", "migrations");

// Only .sql files are migrations; node-pg-migrate would otherwise try to import
// any other file (a README, an editor's backup) as a JavaScript migration.
const IGNORE_PATTERN = String.raw`(?:\..*|.*(?<!\.sql))`;

/** Either a connection string (a client is opened and closed) or a connected client, not in a transaction. */
export type MigrationConnection =
  | { connectionString: string; client?: undefined }
  | { client: pg.ClientBase; connectionString?: undefined };

export type MigrationOptions = MigrationConnection & {
  /** Defaults to this package's sql/migrations. */
  migrationsDir?: string;
  /** Receives node-pg-migrate's messages; silent when absent. */
  log?: (line: string) => void;
};

export type MigrateOptions = MigrationOptions & {
  direction?: "up" | "down";
  /** How many migrations to run: all pending for "up", one for "down" by default. */
  count?: number;
};

export interface MigrationStatus {
  /** Applied migrations, in the order they ran. */
  applied: string[];
  /** Migration files not applied yet, in the order they would run. */
  pending: string[];
}

/**
 * Applies pending migrations (or reverts applied ones with direction "down") in
 * one transaction and returns the names it ran, in order. Concurrent calls are
 * safe: node-pg-migrate holds an advisory lock, and a caller that waited for it
 * finds nothing left to do.
 */
export async function migrate(options: MigrateOptions): Promise<string[]> {
  const log = options.log ?? (() => {});
  const ran = await runner({
    ...(options.client !== undefined
      ? { dbClient: options.client }
      : { databaseUrl: options.connectionString }),
    dir: options.migrationsDir ?? DEFAULT_MIGRATIONS_DIR,
    ignorePattern: IGNORE_PATTERN,
    migrationsSchema: MIGRATIONS_SCHEMA,
    createMigrationsSchema: true,
    migrationsTable: MIGRATIONS_TABLE,
    direction: options.direction ?? "up",
    ...(options.count !== undefined ? { count: options.count } : {}),
    checkOrder: true,
    singleTransaction: true,
    advisoryLockMode: "wait",
    logger: { debug: log, info: log, warn: log, error: log },
  });
  return ran.map((migration) => migration.name);
}

/** Which migrations are applied and which are pending. Read-only: creates nothing. */
export async function migrationStatus(options: MigrationOptions): Promise<MigrationStatus> {
  const files = await migrationFiles(options.migrationsDir);
  const applied = await withClient(options, appliedMigrations);
  const appliedSet = new Set(applied);
  return { applied, pending: files.filter((file) => !appliedSet.has(file.name)).map((file) => file.name) };
}

/**
 * The pending migrations as one plain SQL script for psql, in a transaction: it
 * creates idemq_meta.migrations if missing and records each migration as
 * node-pg-migrate would, so `migrate` afterwards finds nothing pending.
 */
export async function pendingSql(options: MigrationOptions): Promise<string> {
  const files = await migrationFiles(options.migrationsDir);
  const applied = await withClient(options, appliedMigrations);
  // node-pg-migrate refuses to run a migration that precedes an applied one.
  files.slice(0, applied.length).forEach((file, i) => {
    if (file.name !== applied[i]) {
      throw new Error(`migration ${file.name} is not applied but precedes the applied migration ${applied[i]}`);
    }
  });
  const pending = files.slice(applied.length);
  if (pending.length === 0) return "-- idemq: no pending migrations\n";

  const table = `${quoteIdent(MIGRATIONS_SCHEMA)}.${quoteIdent(MIGRATIONS_TABLE)}`;
  const names = pending.map((file) => quoteLiteral(file.name)).join(", ");
  const parts = [
    `-- idemq: pending migrations ${pending.map((file) => file.name).join(", ")}`,
    "-- Apply with: psql -v ON_ERROR_STOP=1 -f <this file> <database-url>",
    "BEGIN;",
    "",
    // The same advisory lock as node-pg-migrate, so a concurrent `idemq migrate`
    // and this script run one after the other.
    `DO $idemq$ BEGIN PERFORM pg_advisory_xact_lock(${PG_MIGRATE_LOCK_ID}); END $idemq$;`,
    `CREATE SCHEMA IF NOT EXISTS ${quoteIdent(MIGRATIONS_SCHEMA)};`,
    // The table node-pg-migrate creates (runner.ts, ensureMigrationsTable).
    `CREATE TABLE IF NOT EXISTS ${table} (id SERIAL PRIMARY KEY, name varchar(255) NOT NULL, run_on timestamp NOT NULL);`,
    // Refuse if someone applied these migrations since the script was generated.
    "DO $idemq$",
    "BEGIN",
    `  IF EXISTS (SELECT 1 FROM ${table} WHERE name IN (${names})) THEN`,
    "    RAISE EXCEPTION 'idemq: some of these migrations were applied since this script was generated'",
    "      USING HINT = 'Generate the script again with: idemq migrate sql';",
    "  END IF;",
    "END",
    "$idemq$;",
  ];
  for (const file of pending) {
    const up = await upSection(file.path);
    parts.push(
      "",
      `-- ==== ${basename(file.path)} ====`,
      up.trimEnd().endsWith(";") ? up.trimEnd() : `${up.trimEnd()}\n;`,
      `INSERT INTO ${table} (name, run_on) VALUES (${quoteLiteral(file.name)}, NOW());`,
    );
  }
  parts.push("", "COMMIT;", "");
  return parts.join("\n");
}

interface MigrationFile {
  name: string;
  path: string;
}

async function migrationFiles(dir = DEFAULT_MIGRATIONS_DIR): Promise<MigrationFile[]> {
  const paths = await getMigrationFilePaths(dir, { ignorePattern: IGNORE_PATTERN, logger: silentLogger });
  return paths.map((path) => ({ name: basename(path, extname(path)), path }));
}

/** The "-- Up Migration" section, split exactly as node-pg-migrate splits it. */
async function upSection(path: string): Promise<string> {
  const actions = getActions(await readFile(path, "utf8"));
  let sql: string | undefined;
  const capture = { sql: (text: string) => void (sql = text) };
  if (typeof actions.up !== "function") throw new Error(`${path} has no up migration`);
  await actions.up(capture as unknown as Parameters<typeof actions.up>[0], () => {});
  if (sql === undefined) throw new Error(`${path} has no up migration`);
  return sql;
}

async function appliedMigrations(client: pg.ClientBase): Promise<string[]> {
  const table = `${quoteIdent(MIGRATIONS_SCHEMA)}.${quoteIdent(MIGRATIONS_TABLE)}`;
  const exists = await client.query<{ found: boolean }>("SELECT to_regclass($1) IS NOT NULL AS found", [table]);
  if (!exists.rows[0]?.found) return [];
  const rows = await client.query<{ name: string }>(`SELECT name FROM ${table} ORDER BY run_on, id`);
  return rows.rows.map((row) => row.name);
}

async function withClient<T>(options: MigrationConnection, work: (client: pg.ClientBase) => Promise<T>): Promise<T> {
  if (options.client !== undefined) return work(options.client);
  const client = new pg.Client({ connectionString: options.connectionString });
  client.on("error", () => {});
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

const silentLogger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

function quoteLiteral(value: string): string {
  return `'${value.replaceAll("'", "''")}'`;
}
