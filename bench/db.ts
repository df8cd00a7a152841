// Databases of a benchmark run: one migrated template per system, and a fresh
// clone of it for every measurement, dropped afterwards. Every name carries
// the run's process id (runDatabase), so two runs on one server never drop
// each other's databases; the process keeps a list of those it made, dropped
// at the end of the run, on a failure, and on SIGINT or SIGTERM.

import pg from "pg";

export const DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432";

/** The server the benchmarks run on: DATABASE_URL, else the machine's PostgreSQL. */
export function serverUrl(): string {
  return process.env.DATABASE_URL || DEFAULT_SERVER;
}

/** The same server and credentials, another database. */
export function databaseUrl(server: string, database: string): string {
  const url = new URL(server);
  url.pathname = `/${database}`;
  return url.toString();
}

/** A connection to the server's maintenance database (the URL's own, else `postgres`). */
export async function adminClient(server: string): Promise<pg.Client> {
  const url = new URL(server);
  if (url.pathname === "" || url.pathname === "/") url.pathname = "/postgres";
  const client = new pg.Client({ connectionString: url.toString() });
  client.on("error", () => {});
  await client.connect();
  return client;
}

function ident(name: string): string {
  if (!/^[a-z_][a-z0-9_]*$/.test(name)) throw new Error(`unexpected database name ${name}`);
  return `"${name}"`;
}

/** `base` suffixed with this process's id: the name this run gives a database of its own. */
export function runDatabase(base: string): string {
  return `${base}_${process.pid}`;
}

/** The databases this process created and has not dropped yet. */
const made = new Set<string>();
/** Set by a signal: no database is created after the signal's clean-up read `made`. */
let stopping = false;

export async function dropDatabase(admin: pg.Client, name: string): Promise<void> {
  await admin.query(`DROP DATABASE IF EXISTS ${ident(name)} WITH (FORCE)`);
  made.delete(name);
}

/**
 * Drops every database this process made and has not dropped: the end of a
 * run, whether it failed or not. Tries each; throws naming those left.
 */
export async function dropMadeDatabases(admin: pg.Client): Promise<void> {
  for (const name of [...made]) await dropDatabase(admin, name).catch(() => {});
  if (made.size > 0) throw new Error(`could not drop ${[...made].join(", ")}`);
}

/**
 * On SIGINT or SIGTERM (Ctrl-C reaches a run twice: from the terminal and
 * from bench/launch.mjs), drops the databases this process made, on a
 * connection of its own (the run's may be mid-statement), then exits as the
 * signal would have (128 + its number). The worker children got the signal
 * too; DROP ... WITH (FORCE) ends any session they left.
 */
export function dropMadeDatabasesOnSignal(server: string, log: (line: string) => void): void {
  for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143]] as const) {
    process.on(signal, () => {
      if (stopping) return;
      stopping = true;
      log(`${signal}: dropping this run's databases (${[...made].join(", ") || "none"})`);
      void (async () => {
        try {
          const admin = await adminClient(server);
          try {
            await dropMadeDatabases(admin);
          } finally {
            await admin.end().catch(() => {});
          }
        } catch (error) {
          log(error instanceof Error ? error.message : String(error));
        }
        process.exit(code);
      })();
    });
  }
}

/**
 * Creates `name` empty, or as a copy of `template`, and adds it to the
 * databases this process drops (dropMadeDatabases). `fileCopy` copies the
 * files instead of writing the whole template through WAL (PostgreSQL 15's
 * default): for big templates.
 */
export async function createDatabase(admin: pg.Client, name: string, template?: string, fileCopy = false): Promise<void> {
  if (stopping) throw new Error(`not creating ${name}: the run is stopping`);
  await dropDatabase(admin, name); // a leftover of a killed run whose process had this id
  // Listed before it exists: a signal during CREATE DATABASE still drops it.
  made.add(name);
  if (template) {
    // CREATE DATABASE ... TEMPLATE fails while anyone is connected to the template;
    // a system's pool may still be closing its last connection.
    await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", [template]);
  }
  const strategy = fileCopy && (await serverVersionNum(admin)) >= 150000 ? " STRATEGY FILE_COPY" : "";
  await admin.query(`CREATE DATABASE ${ident(name)}${template ? ` TEMPLATE ${ident(template)}` : ""}${strategy}`);
}

async function serverVersionNum(client: pg.ClientBase): Promise<number> {
  const { rows } = await client.query("SELECT current_setting('server_version_num')::int AS v");
  return (rows[0] as { v: number }).v;
}

/** A short-lived client on one database. */
export async function withClient<T>(url: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => {});
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end().catch(() => {});
  }
}

/**
 * Extensions the measurements use when the server has them: pg_walinspect
 * (WAL attributed to the bench database) and pgstattuple (exact dead tuples).
 * Missing ones only make those numbers fall back or go blank.
 */
export async function installMeasurementExtensions(client: pg.ClientBase): Promise<void> {
  for (const ext of ["pg_walinspect", "pgstattuple"]) {
    await client.query(`CREATE EXTENSION IF NOT EXISTS ${ext}`).catch(() => {});
  }
}

/**
 * A CHECKPOINT before each measured run, so every system starts in the same
 * full-page-write regime (the first change to a page after a checkpoint logs
 * the whole page) and no timed checkpoint is likely to land inside the run.
 * Needs superuser or pg_checkpoint; skipped silently without.
 */
export async function checkpoint(client: pg.ClientBase): Promise<void> {
  await client.query("CHECKPOINT").catch(() => {});
}

/** Dead tuples in the given tables: pgstattuple's exact count when installed, else the statistics. */
export async function deadTuples(client: pg.ClientBase, tables: readonly string[]): Promise<number> {
  let total = 0;
  for (const table of tables) {
    // A partitioned table (pg-boss's job table) has its tuples in its leaf partitions.
    const exact = await client
      .query(
        `SELECT sum((pgstattuple(relid)).dead_tuple_count)::float8 AS n
         FROM pg_partition_tree($1::regclass) WHERE isleaf`,
        [table],
      )
      .then((r) => (r.rows[0] as { n: number }).n)
      .catch(() => null);
    if (exact !== null) {
      total += exact;
      continue;
    }
    const { rows } = await client.query(
      "SELECT coalesce(n_dead_tup, 0)::float8 AS n FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
      [table],
    );
    total += (rows[0] as { n: number } | undefined)?.n ?? 0;
  }
  return total;
}

/** Server version and the settings that shape the results, for the report header. */
export async function serverFacts(client: pg.ClientBase): Promise<Record<string, string>> {
  const { rows } = await client.query(
    `SELECT current_setting('server_version') AS version,
            current_setting('synchronous_commit') AS synchronous_commit,
            current_setting('fsync') AS fsync,
            current_setting('full_page_writes') AS full_page_writes,
            current_setting('shared_buffers') AS shared_buffers,
            current_setting('autovacuum') AS autovacuum`,
  );
  return rows[0] as Record<string, string>;
}
