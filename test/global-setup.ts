// Runs once per `vitest run`: installs the programs the run's tests drive that
// npm cannot (test/helpers/system-tools.ts), picks the server (DATABASE_URL, or
// a throwaway embedded PostgreSQL 18), migrates a template database once, and
// hands both to the test files, which clone the template (test/helpers/db.ts).
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import pg from "pg";
import type { TestProject } from "vitest/node";
import { databaseUrl, type EmbeddedPostgresServer, startEmbeddedPostgres } from "../src/embedded/server.ts";
import { migrate } from "../src/migrate.ts";
import { ensureSystemTools } from "./helpers/system-tools.ts";

const ROOT = resolve(import.meta.dirname, "..");

/**
 * The CLI tests run bin/idemq.js, which runs the compiled dist/: build it first
 * so they test this tree's code, not an older build (incremental: ~3 s).
 */
async function buildDist(): Promise<void> {
  const tsc = join(ROOT, "node_modules", "typescript", "bin", "tsc");
  try {
    await promisify(execFile)(process.execPath, [tsc, "-p", "tsconfig.build.json"], { cwd: ROOT });
  } catch (error) {
    const { stdout = "", stderr = "" } = error as { stdout?: string; stderr?: string };
    throw new Error(`npm run build failed, so the CLI tests would run stale code:\n${stdout}${stderr}`);
  }
}

/** The test files this run selected (all of them when the command line names none). */
async function runFiles(project: TestProject): Promise<string[]> {
  // vitest keeps the command line's file filters here, outside its typed API;
  // should that change, the whole suite is assumed: more set-up, never less.
  const filters = (project.vitest as unknown as { filenamePattern?: string[] }).filenamePattern ?? [];
  return (await project.globTestFiles(filters)).testFiles;
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  await ensureSystemTools({ files: await runFiles(project) });
  // The build and the template are independent: build while the server starts and migrates.
  const built = buildDist();
  built.catch(() => {}); // awaited below, on both paths; this only keeps an early failure from being "unhandled"
  let server: EmbeddedPostgresServer | undefined;
  let tempDir: string | undefined;
  let serverUrl = process.env.DATABASE_URL;
  if (!serverUrl) {
    tempDir = await mkdtemp(join(tmpdir(), "idemq-test-"));
    server = await startEmbeddedPostgres({
      dataDir: join(tempDir, "pg"),
      ephemeral: true,
      settings: { max_connections: "300" },
    });
    serverUrl = server.url;
  }

  // Unique per run, so concurrent runs against one server do not collide; the
  // test databases share it as a prefix, so teardown can drop any left behind.
  const template = `idemq_t${Date.now().toString(36)}${randomBytes(3).toString("hex")}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  admin.on("error", () => {});
  await admin.connect();
  try {
    await dropAbandonedDatabases(admin);
    await admin.query(`CREATE DATABASE ${admin.escapeIdentifier(template)} TEMPLATE template0`);
    await migrate({ connectionString: databaseUrl(serverUrl, template) });
    // node-pg-migrate does not wait for its connection to close; a clone fails
    // while any session is connected to the template.
    await waitForNoSessions(admin, template);
    await admin.query(`ALTER DATABASE ${admin.escapeIdentifier(template)} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false`);
    await built;
  } catch (error) {
    // A failed build is a common edit-time event: leave no template behind on a shared server.
    const name = admin.escapeIdentifier(template);
    await admin.query(`ALTER DATABASE ${name} WITH IS_TEMPLATE false`).catch(() => {});
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
    await admin.end();
    await server?.stop();
    if (tempDir) await rm(tempDir, { recursive: true, force: true });
    await built.catch(() => {});
    throw error;
  }
  await admin.end();

  project.provide("idemqServerUrl", serverUrl);
  project.provide("idemqTemplate", template);

  return async () => {
    try {
      const client = new pg.Client({ connectionString: serverUrl });
      client.on("error", () => {});
      await client.connect();
      try {
        await client.query(`ALTER DATABASE ${client.escapeIdentifier(template)} WITH IS_TEMPLATE false`);
        const { rows } = await client.query<{ datname: string }>(
          "SELECT datname FROM pg_database WHERE datname = $1 OR starts_with(datname, $2)",
          [template, `${template}_`],
        );
        for (const { datname } of rows) {
          await client.query(`DROP DATABASE IF EXISTS ${client.escapeIdentifier(datname)} WITH (FORCE)`);
        }
        await dropInstallationRoles(client, template);
      } finally {
        await client.end();
      }
    } finally {
      await server?.stop();
      if (tempDir) await rm(tempDir, { recursive: true, force: true });
    }
  };
}

/**
 * Each database migrated from nothing has its own idemq roles, named
 * idemq_<database>_... (idemq._grant_roles); the run's databases all start
 * with `prefix`, so their roles do too. Dropped once the databases are gone
 * (a role that still holds privileges somewhere is left, with its error).
 */
async function dropInstallationRoles(client: pg.Client, prefix: string): Promise<void> {
  const { rows } = await client.query<{ rolname: string }>("SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1)", [`idemq_${prefix}`]);
  for (const { rolname } of rows) {
    await client.query(`DROP ROLE IF EXISTS ${client.escapeIdentifier(rolname)}`).catch(() => {});
  }
}

const ABANDONED_AFTER_MS = 6 * 60 * 60 * 1000;

/**
 * A run killed before its teardown leaves its databases on a shared server.
 * Their names start with the run's start time (base 36), so drop those of runs
 * that started more than 6 hours ago; a concurrent run's are left alone.
 */
async function dropAbandonedDatabases(admin: pg.Client): Promise<void> {
  const { rows } = await admin.query<{ datname: string }>(
    "SELECT datname FROM pg_database WHERE datname ~ '^idemq_t[0-9a-z]{8}[0-9a-f]{6}(_|$)'",
  );
  for (const { datname } of rows) {
    const startedAt = Number.parseInt(datname.slice("idemq_t".length, "idemq_t".length + 8), 36);
    if (Date.now() - startedAt < ABANDONED_AFTER_MS) continue;
    const name = admin.escapeIdentifier(datname);
    await admin
      .query(`ALTER DATABASE ${name} WITH IS_TEMPLATE false`)
      .then(() => admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
      .catch(() => {});
  }
  // And their installations' roles (idemq_<database>_...), once no database of theirs is left.
  const { rows: roles } = await admin.query<{ rolname: string }>(
    "SELECT rolname FROM pg_roles WHERE rolname ~ '^idemq_idemq_t[0-9a-z]{8}[0-9a-f]{6}'",
  );
  for (const { rolname } of roles) {
    const startedAt = Number.parseInt(rolname.slice("idemq_idemq_t".length, "idemq_idemq_t".length + 8), 36);
    if (Date.now() - startedAt < ABANDONED_AFTER_MS) continue;
    await admin.query(`DROP ROLE IF EXISTS ${admin.escapeIdentifier(rolname)}`).catch(() => {});
  }
}

async function waitForNoSessions(admin: pg.Client, database: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const { rows } = await admin.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1",
      [database],
    );
    if (rows[0]?.n === 0) return;
    if (Date.now() > deadline) throw new Error(`sessions still connected to the template database ${database}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
