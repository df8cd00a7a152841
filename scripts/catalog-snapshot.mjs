#!/usr/bin/env node
// Writes test/contract/catalog.snapshot.json: schema idemq as pg_catalog describes it
// after `migrate` on an empty database (columns, constraints, indexes, enums,
// function signatures...), so every schema change shows in review.
// test/contract/catalog-snapshot.test.ts compares a freshly migrated database with it.
//
//   node scripts/catalog-snapshot.mjs            write the snapshot
//   node scripts/catalog-snapshot.mjs --check    exit 1 when it is out of date
//
// Uses the server at DATABASE_URL (a scratch database is created and dropped),
// or a throwaway embedded PostgreSQL when DATABASE_URL is unset.
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { register } from "tsx/esm/api";

register();
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { default: pg } = await import("pg");
const { startEmbeddedPostgres, databaseUrl } = await import("../src/embedded/server.ts");
const { migrate } = await import("../src/migrate.ts");
const { committedCatalog, serialize, SNAPSHOT_PATH, UPDATE_COMMAND } = await import("../test/helpers/catalog-snapshot.ts");

const check = process.argv.includes("--check");
let server;
let tempDir;
let serverUrl = process.env.DATABASE_URL;
if (!serverUrl) {
  tempDir = mkdtempSync(path.join(tmpdir(), "idemq-catalog-"));
  server = await startEmbeddedPostgres({ dataDir: path.join(tempDir, "pg"), ephemeral: true });
  serverUrl = server.url;
}

const name = `idemq_catalog_${randomBytes(4).toString("hex")}`;
const admin = new pg.Client({ connectionString: serverUrl });
let text;
try {
  await admin.connect();
  await admin.query(`CREATE DATABASE ${admin.escapeIdentifier(name)} TEMPLATE template0`);
  try {
    await migrate({ connectionString: databaseUrl(serverUrl, name) });
    const client = new pg.Client({ connectionString: databaseUrl(serverUrl, name) });
    await client.connect();
    try {
      text = serialize(await committedCatalog(client));
    } finally {
      await client.end();
    }
  } finally {
    await admin.query(`DROP DATABASE IF EXISTS ${admin.escapeIdentifier(name)} WITH (FORCE)`);
  }
} finally {
  await admin.end();
  await server?.stop();
  if (tempDir) rmSync(tempDir, { recursive: true, force: true });
}

const target = fileURLToPath(SNAPSHOT_PATH);
if (check) {
  if (!existsSync(target) || readFileSync(target, "utf8") !== text) {
    console.error(`${path.relative(root, target)} is out of date; run: ${UPDATE_COMMAND}`);
    process.exit(1);
  }
} else {
  writeFileSync(target, text);
  console.log(`wrote ${path.relative(root, target)}`);
}
