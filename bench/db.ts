// Databases of a benchmark run: one migrated template per system, and a fresh
// clone of it for every measurement, dropped afterwards.

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

export async function dropDatabase(admin: pg.Client, name: string): Promise<void> {
  await admin.query(`DROP DATABASE IF EXISTS ${ident(name)} WITH (FORCE)`);
}

/**
 * Creates `name` empty (dropping a leftover of an interrupted run), or as a
 * copy of `template`. `fileCopy` copies the files instead of writing the
 * whole template through WAL (PostgreSQL 15's default): for big templates.
 */
export async function createDatabase(admin: pg.Client, name: string, template?: string, fileCopy = false): Promise<void> {
  await dropDatabase(admin, name);
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
