// Migrations are the only install path (docs/design.md, "Migrations and releases"): node-pg-migrate runs the
// plain .sql files in sql/migrations, recording them in idemq_meta.migrations.
import { readdirSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { basename, dirname, extname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";

// node-pg-migrate is imported inside the functions that use it: every CLI
// command reaches this module through the CLI's connect.ts, and importing it
// costs about a third of a command's start-up (0.1-0.15 s).
const nodePgMigrate = () => import("node-pg-migrate");

export const MIGRATIONS_SCHEMA = "idemq_meta";
export const MIGRATIONS_TABLE = "migrations";

/** The migration of release 0.1.0: the migrations written before it, squashed. */
export const RELEASE_0_1_0 = "0001_release_0_1_0";

/**
 * The migrations written before the first release, which 0001_release_0_1_0
 * replaced (test/install/release.test.ts holds the catalogs they build equal).
 * A database migrated through all of them is at 0.1.0: the first migrate of
 * this version records it as such (recognisePreRelease). One migrated through
 * only some of them never ran a released version, and is refused.
 */
export const PRE_RELEASE_MIGRATIONS: readonly string[] = [
  "0001_init", "0002_package", "0003_one_backoff_model", "0004_test_paths_in_headers",
  "0005_least_privilege", "0006_survive_the_database", "0007_limits", "0008_no_freeze",
  "0009_enqueue_pipeline", "0010_schedules", "0011_enqueue_limits", "0012_retention",
  "0013_schedules_ts", "0014_cli_ops", "0015_pairs_plpgsql", "0016_dashboard",
  "0017_worker_presence", "0018_traces", "0019_many_queues", "0020_dedupe_checks",
  "0021_one_runnable_index", "0022_cheaper_checks", "0023_enqueue_limits_kept",
  "0024_runnable_index_no_dedup", "0025_success_retention_kept", "0026_cheaper_key_check",
  "0027_generic_plans_for_job_arrays", "0028_runnable_index_name_keys",
  "0029_job_rules_apart_from_wording", "0030_cheaper_guard",
];

const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
/** sql/migrations of this package, whatever the current directory is. */
export const DEFAULT_MIGRATIONS_DIR = resolve(PACKAGE_ROOT, "sql", "migrations");

/**
 * The names of this package's migrations (file names without .sql), in the
 * order they run (zero-padded numeric prefix). Read with readdirSync: no
 * import of node-pg-migrate, for the version check every start makes.
 */
export function packageMigrationNames(dir = DEFAULT_MIGRATIONS_DIR): string[] {
  return readdirSync(dir)
    .filter((file) => /^\d+_\w+\.sql$/.test(file))
    .sort()
    .map((file) => file.slice(0, -".sql".length));
}

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
  /** Receives the server's NOTICEs raised by the migrations (what an upgrade did that an operator should know). */
  onNotice?: (message: string) => void;
};

export type MigrateOptions = MigrationOptions & {
  /**
   * The prefix of this installation's role names (`<prefix>_producer`,
   * `_worker`, `_admin`, `_viewer`), chosen once, at install; default `idemq_<database>`.
   * See idemq._grant_roles.
   */
  rolesPrefix?: string;
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
 * Applies pending migrations (or reverts applied ones with direction "down"),
 * each in its own transaction together with its row in idemq_meta.migrations,
 * and returns the names it ran, in order. If one fails, it is rolled back and
 * those before it stay applied. Concurrent calls are safe: node-pg-migrate
 * holds a session advisory lock for the whole run and reads what is applied
 * only once it has the lock, so a caller that waited finds nothing left to do.
 *
 * Why not one transaction for all: PostgreSQL refuses to use an enum value
 * before the transaction that added it commits ("unsafe use of new value", in
 * a CHECK, an index predicate, or the body of a SQL-language function being
 * created; a PL/pgSQL body is accepted but fails when called). Committing each
 * migration lets the next one use a value an earlier one added. That is also
 * why active_states() and terminal_states() stay SQL-language: a migration that
 * adds a state must update the literal state lists in constraints and partial
 * indexes too, which no function language can do in the adding transaction,
 * so the value goes in a migration of its own and the next one uses it
 * (measured on PostgreSQL 15 and 18; test/install/upgrade.test.ts runs that sequence).
 */
export async function migrate(options: MigrateOptions): Promise<string[]> {
  const client = options.client;
  // node-pg-migrate announces each migration before running it; on a failure
  // that names the one that failed.
  let running: string | undefined;
  const log = (line: string) => {
    running = /^### MIGRATION (\S+) \((?:UP|DOWN)\) ###$/.exec(line)?.[1] ?? running;
    options.log?.(line);
  };
  const lockHeldBefore = client !== undefined && (await holdsMigrationLock(client));
  try {
    return await runMigrations(options, log);
  } catch (error) {
    if (client !== undefined) await releaseAfterFailure(client, lockHeldBefore);
    // The pg error keeps its SQLSTATE and fields; only the message says where it happened.
    if (running !== undefined && error instanceof Error) {
      error.message = `migration ${running} failed and was rolled back (the migrations before it stay applied): ${error.message}`;
    }
    throw error;
  }
}

async function runMigrations(options: MigrateOptions, log: (line: string) => void): Promise<string[]> {
  const { runner } = await nodePgMigrate();
  // Given a URL, node-pg-migrate would open a client with no 'error' listener:
  // a 57P01 (the server shutting down) on it, during or right after the run,
  // would crash the process. So the client is always one we own and listen on.
  return withClient(options, async (dbClient) => {
    const notice = (message: { message?: string | undefined }) => void options.onNotice?.(message.message ?? "");
    dbClient.on("notice", notice);
    await recognisePreRelease(dbClient);
    await setInstallSettings(dbClient, installSettings(await appliedMigrations(dbClient), options.rolesPrefix));
    try {
      return await runWith(runner, dbClient, options, log);
    } finally {
      await dbClient.query("RESET idemq.installing; RESET idemq.roles_prefix").catch(() => {});
      dbClient.removeListener("notice", notice);
    }
  });
}

/**
 * Session settings the migrations read (idemq._grant_roles): idemq.installing
 * while a run installs idemq from nothing (so no membership of 0.1.0's
 * cluster-wide roles is carried over), idemq.roles_prefix when one was chosen.
 */
function installSettings(applied: string[], rolesPrefix: string | undefined): Record<string, string> {
  return {
    ...(applied.length === 0 ? { "idemq.installing": "on" } : {}),
    ...(rolesPrefix !== undefined ? { "idemq.roles_prefix": rolesPrefix } : {}),
  };
}

async function setInstallSettings(client: pg.ClientBase, settings: Record<string, string>): Promise<void> {
  for (const [name, value] of Object.entries(settings)) await client.query("SELECT set_config($1, $2, false)", [name, value]);
}

/** One run of node-pg-migrate's runner on our client (see migrate()). */
async function runWith(
  runner: Awaited<ReturnType<typeof nodePgMigrate>>["runner"],
  dbClient: pg.ClientBase,
  options: MigrateOptions,
  log: (line: string) => void,
): Promise<string[]> {
  const ran = await runner({
    dbClient,
    dir: options.migrationsDir ?? DEFAULT_MIGRATIONS_DIR,
    ignorePattern: IGNORE_PATTERN,
    migrationsSchema: MIGRATIONS_SCHEMA,
    createMigrationsSchema: true,
    migrationsTable: MIGRATIONS_TABLE,
    direction: options.direction ?? "up",
    ...(options.count !== undefined ? { count: options.count } : {}),
    checkOrder: true,
    // Each migration in its own BEGIN ... COMMIT (see migrate()).
    singleTransaction: false,
    advisoryLockMode: "wait",
    logger: { debug: log, info: log, warn: log, error: log },
  });
  return ran.map((migration) => migration.name);
}

/**
 * A failed migration leaves the caller's client in an aborted transaction, in
 * which node-pg-migrate's unlock fails, so its session advisory lock would
 * outlive the call and block every later migrate. (A connection of our own is
 * closed, which ends both.) Roll back, and release the lock if this call took it.
 */
async function releaseAfterFailure(client: pg.ClientBase, lockHeldBefore: boolean): Promise<void> {
  try {
    await client.query("ROLLBACK");
    if (!lockHeldBefore && (await holdsMigrationLock(client))) {
      await client.query("SELECT pg_advisory_unlock($1::bigint)", [String(await migrationLockId())]);
    }
  } catch {
    // The client is broken; the caller's error says why, and closing the client ends the lock.
  }
}

/** Whether this session holds node-pg-migrate's advisory lock (a bigint key: classid high 32 bits, objid low 32). */
async function holdsMigrationLock(client: pg.ClientBase): Promise<boolean> {
  const lockId = await migrationLockId();
  const { rows } = await client.query<{ held: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM pg_locks
                     WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted AND objsubid = 1
                       AND ((classid::bigint << 32) | objid::bigint) = $1::bigint) AS held`,
    [String(lockId)],
  );
  return rows[0]?.held ?? false;
}

/** node-pg-migrate's advisory lock key, which `migrate sql` scripts take too. */
async function migrationLockId(): Promise<number> {
  return (await nodePgMigrate()).PG_MIGRATE_LOCK_ID;
}

/** Which migrations are applied and which are pending. Read-only: creates nothing. */
export async function migrationStatus(options: MigrationOptions): Promise<MigrationStatus> {
  const files = await migrationFiles(options.migrationsDir);
  const applied = asReleased(await withClient(options, appliedMigrations)).applied;
  const appliedSet = new Set(applied);
  return { applied, pending: files.filter((file) => !appliedSet.has(file.name)).map((file) => file.name) };
}

/**
 * The pending migrations as one plain SQL script for psql, each migration in its
 * own transaction with its row in idemq_meta.migrations (as `migrate` runs
 * them), so `migrate` afterwards finds nothing pending. Each transaction takes
 * node-pg-migrate's advisory lock and then checks that the applied migrations
 * are still exactly those before it: a concurrent `idemq migrate` (which holds
 * the lock for its whole run) or a second run of the script makes the script
 * stop there, never apply a migration twice.
 */
export async function pendingSql(options: MigrationOptions & { rolesPrefix?: string }): Promise<string> {
  const files = await migrationFiles(options.migrationsDir);
  const { applied, preRelease } = asReleased(await withClient(options, appliedMigrations));
  // node-pg-migrate refuses to run a migration that precedes an applied one.
  files.slice(0, applied.length).forEach((file, i) => {
    if (file.name !== applied[i]) {
      throw new Error(`migration ${file.name} is not applied but precedes the applied migration ${applied[i]}`);
    }
  });
  const pending = files.slice(applied.length);
  // A pre-release database still needs the script that records it as 0.1.0.
  if (pending.length === 0 && !preRelease) return "-- idemq: no pending migrations\n";
  const lockId = await migrationLockId();

  const table = `${quoteIdent(MIGRATIONS_SCHEMA)}.${quoteIdent(MIGRATIONS_TABLE)}`;
  const parts = [
    pending.length > 0 ? `-- idemq: pending migrations ${pending.map((file) => file.name).join(", ")}` : "-- idemq: no pending migrations",
    "-- Apply with: psql -v ON_ERROR_STOP=1 -f <this file> <database-url>",
    "-- Each migration commits on its own (a later one may use an enum value an",
    "-- earlier one added); if one fails, psql stops there and those before it stay applied.",
    ...Object.entries(installSettings(applied, options.rolesPrefix)).map(
      ([name, value]) => `SELECT pg_catalog.set_config(${quoteLiteral(name)}, ${quoteLiteral(value)}, false);`,
    ),
  ];
  if (preRelease) {
    parts.push(
      "",
      `-- ==== this database was migrated through ${PRE_RELEASE_MIGRATIONS.at(-1)}: recorded as ${RELEASE_0_1_0} ====`,
      "BEGIN;",
      `DO $idemq$ BEGIN PERFORM pg_advisory_xact_lock(${lockId}); END $idemq$;`,
      ...recordAsReleaseSql(table).map((statement) => `${statement};`),
      "COMMIT;",
    );
  }
  for (const [i, file] of pending.entries()) {
    const before = applied.length + i;
    const up = await upSection(file.path);
    parts.push(
      "",
      `-- ==== ${basename(file.path)} ====`,
      "BEGIN;",
      // The same advisory lock as node-pg-migrate, so a concurrent `idemq migrate`
      // and this transaction run one after the other.
      `DO $idemq$ BEGIN PERFORM pg_advisory_xact_lock(${lockId}); END $idemq$;`,
      ...(i === 0
        ? [
            `CREATE SCHEMA IF NOT EXISTS ${quoteIdent(MIGRATIONS_SCHEMA)};`,
            // The table node-pg-migrate creates (runner.ts, ensureMigrationsTable).
            `CREATE TABLE IF NOT EXISTS ${table} (id SERIAL PRIMARY KEY, name varchar(255) NOT NULL, run_on timestamp NOT NULL);`,
          ]
        : []),
      // Refuse if the applied migrations changed since the script was generated.
      "DO $idemq$",
      "BEGIN",
      `  IF EXISTS (SELECT 1 FROM ${table} WHERE name = ${quoteLiteral(file.name)})`,
      `     OR (SELECT count(*) FROM ${table}) <> ${before} THEN`,
      `    RAISE EXCEPTION 'idemq: ${file.name.replaceAll("'", "''")} not run: migrations were applied since this script was generated (or reverted)'`,
      "      USING HINT = 'Migrations above it in this script are applied. See what is pending with: idemq migrate status; generate the script again with: idemq migrate sql';",
      "  END IF;",
      "END",
      "$idemq$;",
      up.trimEnd().endsWith(";") ? up.trimEnd() : `${up.trimEnd()}\n;`,
      `INSERT INTO ${table} (name, run_on) VALUES (${quoteLiteral(file.name)}, NOW());`,
      "COMMIT;",
    );
  }
  parts.push("");
  return parts.join("\n");
}

interface MigrationFile {
  name: string;
  path: string;
}

async function migrationFiles(dir = DEFAULT_MIGRATIONS_DIR): Promise<MigrationFile[]> {
  const { getMigrationFilePaths } = await import("node-pg-migrate/migration");
  const paths = await getMigrationFilePaths(dir, { ignorePattern: IGNORE_PATTERN, logger: silentLogger });
  return paths.map((path) => ({ name: basename(path, extname(path)), path }));
}

/** The "-- Up Migration" section, split exactly as node-pg-migrate splits it. */
async function upSection(path: string): Promise<string> {
  const { getActions } = await import("node-pg-migrate/sqlMigration");
  const actions = getActions(await readFile(path, "utf8"));
  let sql: string | undefined;
  const capture = { sql: (text: string) => void (sql = text) };
  if (typeof actions.up !== "function") throw new Error(`${path} has no up migration`);
  await actions.up(capture as unknown as Parameters<typeof actions.up>[0], () => {});
  if (sql === undefined) throw new Error(`${path} has no up migration`);
  return sql;
}

/**
 * The applied migrations as this version names them: the whole pre-release
 * chain is 0.1.0's one migration. A part of it is refused, with the fix.
 */
function asReleased(applied: string[]): { applied: string[]; preRelease: boolean } {
  const preRelease = applied.filter((name) => PRE_RELEASE_MIGRATIONS.includes(name));
  if (preRelease.length === 0) return { applied, preRelease: false };
  const whole = preRelease.length === PRE_RELEASE_MIGRATIONS.length && PRE_RELEASE_MIGRATIONS.every((name, i) => applied[i] === name);
  if (!whole) {
    throw new Error(
      `this database was migrated by a development version of idemq that predates release 0.1.0 (applied: ${preRelease.at(-1)}, ` +
        `${preRelease.length} of the ${PRE_RELEASE_MIGRATIONS.length} pre-release migrations); idemq upgrades only a database at 0.1.0 or later. ` +
        `Migrate it to ${PRE_RELEASE_MIGRATIONS.at(-1)} with that development version first, or install idemq into a new database`,
    );
  }
  return { applied: [RELEASE_0_1_0, ...applied.slice(PRE_RELEASE_MIGRATIONS.length)], preRelease: true };
}

/** Replaces the pre-release chain's rows by 0.1.0's, dated when its last migration ran (so later rows still sort after it). */
function recordAsReleaseSql(table: string): string[] {
  const names = PRE_RELEASE_MIGRATIONS.map(quoteLiteral).join(", ");
  return [
    `INSERT INTO ${table} (name, run_on) SELECT ${quoteLiteral(RELEASE_0_1_0)}, max(run_on) FROM ${table} WHERE name IN (${names})`,
    `DELETE FROM ${table} WHERE name IN (${names})`,
  ];
}

/**
 * A database migrated through the whole pre-release chain is recorded as at
 * 0.1.0 (its catalog is 0.1.0's), under node-pg-migrate's lock, so that the
 * runner then sees a release it knows; a part of the chain is refused.
 */
async function recognisePreRelease(client: pg.ClientBase): Promise<void> {
  if (!asReleased(await appliedMigrations(client)).preRelease) return;
  const table = `${quoteIdent(MIGRATIONS_SCHEMA)}.${quoteIdent(MIGRATIONS_TABLE)}`;
  await client.query("BEGIN");
  try {
    await client.query("SELECT pg_advisory_xact_lock($1::bigint)", [String(await migrationLockId())]);
    // Read again under the lock: a concurrent migrate may have recorded it first.
    if (asReleased(await appliedMigrations(client)).preRelease) {
      for (const statement of recordAsReleaseSql(table)) await client.query(statement);
    }
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK").catch(() => {});
    throw error;
  }
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
