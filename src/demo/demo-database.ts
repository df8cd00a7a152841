// Each demo run gets a database of its own on the server, created and migrated
// at the start and dropped at the end (kept with --keep), so runs repeat
// exactly and never touch the user's data. Its name carries the start time and
// the demo's PID, so a later run can drop the databases of runs that were
// killed before they could clean up.
import pg from "pg";
import { databaseUrl } from "../embedded/server.ts";
import { migrate } from "../migrate.ts";

export interface DemoDatabase {
  name: string;
  /** Databases of earlier runs that were killed before they could drop them, dropped now. */
  droppedLeftovers: string[];
  url: string;
  kept: boolean;
  /** Drops the database (unless kept), closing any connection left. */
  dispose(): Promise<void>;
}

const PREFIX = "idemq_demo_";
const NAME = /^idemq_demo_([0-9a-z]+)_(\d+)$/;
/** A demo takes well under a minute; one older than this was killed. */
const ABANDONED_AFTER_MS = 60 * 60 * 1000;

/** The demo's own tables: what its tasks write. */
const DEMO_SCHEMA = `
  CREATE SCHEMA demo;
  CREATE TABLE demo.ledger (
    id         bigserial PRIMARY KEY,
    task       text NOT NULL,
    order_id   int NOT NULL,
    amount     numeric(10, 2) NOT NULL,
    job_id     bigint NOT NULL,
    attempt    int NOT NULL,
    worker     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
  );
  CREATE TABLE demo.payouts (
    id       bigserial PRIMARY KEY,
    order_id int NOT NULL,
    amount   numeric(10, 2) NOT NULL,
    job_id   bigint NOT NULL
  );`;

/**
 * Creates and migrates a fresh database on the server `serverUrl` points to.
 * `localServer`: the server runs on this machine (the embedded one), so a PID
 * in a leftover database's name can be checked.
 */
export async function createDemoDatabase(serverUrl: string, options: { keep: boolean; localServer: boolean }): Promise<DemoDatabase> {
  const name = options.keep
    ? `${PREFIX}keep_${Date.now().toString(36)}_${process.pid}`
    : `${PREFIX}${Date.now().toString(36)}_${process.pid}`;
  let droppedLeftovers: string[] = [];
  await withAdmin(serverUrl, async (admin) => {
    droppedLeftovers = await dropAbandoned(admin, options.localServer);
    try {
      await admin.query(`CREATE DATABASE ${admin.escapeIdentifier(name)}`);
    } catch (error) {
      if ((error as { code?: unknown }).code !== "42501") throw error;
      throw new Error(
        `the demo runs in a database of its own and cannot create one here (${(error as Error).message}): ` +
          "grant the role CREATEDB, or leave --database-url and DATABASE_URL unset to use the embedded PostgreSQL",
        { cause: error },
      );
    }
  });
  const url = databaseUrl(serverUrl, name);
  try {
    await migrate({ connectionString: url });
    const client = new pg.Client({ connectionString: url });
    client.on("error", () => {});
    await client.connect();
    try {
      await client.query(DEMO_SCHEMA);
    } finally {
      await client.end();
    }
  } catch (error) {
    await withAdmin(serverUrl, (admin) => drop(admin, name)).catch(() => {});
    throw error;
  }
  return {
    name,
    droppedLeftovers,
    url,
    kept: options.keep,
    dispose: async () => {
      if (!options.keep) await withAdmin(serverUrl, (admin) => drop(admin, name));
    },
  };
}

async function dropAbandoned(admin: pg.Client, localServer: boolean): Promise<string[]> {
  const { rows } = await admin.query<{ datname: string }>(
    "SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
    [PREFIX],
  );
  const dropped: string[] = [];
  for (const { datname } of rows) {
    const match = NAME.exec(datname);
    if (match === null) continue; // kept on purpose, or not ours
    const startedAt = Number.parseInt(match[1]!, 36);
    const pid = Number(match[2]);
    const abandoned = Date.now() - startedAt > ABANDONED_AFTER_MS || (localServer && !isAlive(pid));
    if (!abandoned) continue;
    await drop(admin, datname);
    dropped.push(datname);
  }
  return dropped;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

async function drop(admin: pg.Client, name: string): Promise<void> {
  await admin.query(`DROP DATABASE IF EXISTS ${admin.escapeIdentifier(name)} WITH (FORCE)`);
}

async function withAdmin<T>(serverUrl: string, work: (admin: pg.Client) => Promise<T>): Promise<T> {
  const admin = new pg.Client({ connectionString: serverUrl });
  admin.on("error", () => {});
  await admin.connect();
  try {
    return await work(admin);
  } finally {
    await admin.end();
  }
}
