// scripts/migration-new.mjs on a copy of sql/: --check names every function
// file that differs from the latest migration state (edited, new, removed)
// and every released migration whose text changed; `migration:new NAME`
// writes the next migration carrying exactly those files (helpers first, new
// private helpers revoked from PUBLIC, removed ones dropped, one whose
// signature changed dropped before it is created again), refuses to
// overwrite a released name, amends the newest migration instead while it is
// unreleased (keeping its hand-written parts, refusing one with a Down
// section), and the migration it writes is forward-only: it applies, leaves
// exactly sql/schema.sql and sql/functions/ installed, and migrate down is
// refused and changes nothing.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { cp, mkdir, mkdtemp, readdir, readFile, rm, unlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { functionPaths } from "../../scripts/migration-new.mjs";
import { migrate } from "../../src/migrate.ts";
import { catalogSnapshot } from "../helpers/catalog.ts";
import { useTestDatabases } from "../helpers/db.ts";
import { catalogDifferences, installFromSchemaFile } from "../helpers/schema-file.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";

const exec = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "..", "..");
const SCRIPT = join(ROOT, "scripts", "migration-new.mjs");
// The script numbers a new migration after the highest number, as the helpers' numbers may have gaps before a merge.
const NEXT = `${String(Math.max(...MIGRATION_NAMES.map((name) => parseInt(name, 10))) + 1).padStart(4, "0")}_probe`;

let sql: string;
let functions: string;
let migrations: string;
const makeDatabase = useTestDatabases();

beforeAll(async () => {
  sql = await mkdtemp(join(tmpdir(), "idemq-migration-new-"));
  await cp(join(ROOT, "sql"), sql, { recursive: true });
  functions = join(sql, "functions");
  migrations = join(sql, "migrations");
  // The copy's migrations all count as released, so that migration:new writes a new one
  // (the repository's newest may be unreleased: the amend test below covers that case).
  await writeFile(join(sql, "released.sha256"), MIGRATION_NAMES.map((name) => `${sha256(join(migrations, `${name}.sql`))}  migrations/${name}.sql\n`).join(""));
});
afterAll(async () => {
  if (sql) await rm(sql, { recursive: true, force: true });
});

async function script(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const paths = ["--functions", functions, "--migrations", migrations, "--released", join(sql, "released.sha256")];
  return exec(process.execPath, [SCRIPT, ...args, ...paths], { cwd: sql }).then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (error: { code: number; stdout: string; stderr: string }) => ({ code: error.code, stdout: error.stdout, stderr: error.stderr }),
  );
}

const HELPER = `-- idemq._upgrade_probe() RETURNS text
--
-- A helper only this test creates.
CREATE OR REPLACE FUNCTION idemq._upgrade_probe()
RETURNS text
LANGUAGE sql IMMUTABLE
RETURN 'probe';

COMMENT ON FUNCTION idemq._upgrade_probe() IS 'Test helper.';
`;
const PUBLIC_FN = `-- idemq.upgrade_probe() RETURNS text
--
-- A public function using the helper, so the helper must be created first.
CREATE OR REPLACE FUNCTION idemq.upgrade_probe()
RETURNS text
LANGUAGE sql IMMUTABLE
RETURN idemq._upgrade_probe() || '!';

COMMENT ON FUNCTION idemq.upgrade_probe() IS 'Test function.';
`;

describe("migration:check and migration:new", () => {
  it("--check passes on the repository's sql/ as it is", async () => {
    expect(await script("--check")).toMatchObject({ code: 0, stderr: "" });
  });

  it("--check names each edited, new and removed file and the command that fixes it; migration:new carries exactly them", async () => {
    const statsFile = join(functions, "reads", "stats.sql");
    const stats = await readFile(statsFile, "utf8");
    const edited = stats.replace(/COMMENT ON FUNCTION idemq\.stats\(\) IS\n\s*'/, "$&(probe) ");
    expect(edited).not.toBe(stats);
    await writeFile(statsFile, edited);
    // In a family folder of their own: migration:new walks every folder.
    await mkdir(join(functions, "probe"));
    await writeFile(join(functions, "probe", "upgrade_probe.sql"), PUBLIC_FN);
    await writeFile(join(functions, "probe", "_upgrade_probe.sql"), HELPER);
    // A new parameter: CREATE OR REPLACE would add an overload, so the old one is dropped first.
    const purgeFile = join(functions, "retention", "purge.sql");
    const purge = await readFile(purgeFile, "utf8");
    const resigned = purge
      .replaceAll("batch_size int DEFAULT NULL)", "batch_size int DEFAULT NULL, note text DEFAULT NULL)")
      .replace("COMMENT ON FUNCTION idemq.purge(interval, idemq.job_state[], int)", "COMMENT ON FUNCTION idemq.purge(interval, idemq.job_state[], int, text)");
    // The header's signature line, the CREATE line and the COMMENT.
    expect(resigned.match(/note text|job_state\[\], int, text\)/g)).toHaveLength(3);
    await writeFile(purgeFile, resigned);
    const pruneKeys = await readFile(join(functions, "retention", "prune_keys.sql"), "utf8");
    await unlink(join(functions, "retention", "prune_keys.sql"));

    const check = await script("--check");
    expect(check.code).toBe(1);
    expect(check.stderr).toContain("functions/probe/_upgrade_probe.sql is new: no migration creates idemq._upgrade_probe");
    expect(check.stderr).toContain("functions/probe/upgrade_probe.sql is new");
    expect(check.stderr).toContain(`functions/reads/stats.sql differs from its text in ${lastCarrier("stats")}`);
    // A removed file is named where the migration that carried it last found it (0001 names the flat paths of before the folders).
    expect(check.stderr).toContain(`functions/${lastCarrierPath("prune_keys")}.sql is gone, but`);
    expect(check.stderr).toContain("carry the change in a new migration: npm run migration:new -- NAME");

    const made = await script("probe");
    expect(made).toMatchObject({ code: 0, stderr: "" });
    expect(made.stdout).toContain(`wrote migrations/${NEXT}.sql: +_upgrade_probe +upgrade_probe ~purge ~stats -prune_keys`);
    expect(made.stdout).toContain("Signature changed (dropped first, then created): idemq.purge\n");
    const text = await readFile(join(migrations, `${NEXT}.sql`), "utf8");
    expect(text, "forward-only: no Down section").not.toMatch(/^\s*--[\s-]*down\s+migration/im);
    const up = text;
    const markers = [...up.matchAll(/^-- ---- sql\/functions\/([\w/-]+)\.sql( \(removed\))? ----$/gm)].map((m) => m[1] + (m[2] ?? ""));
    expect(markers, "helpers first, then the rest; removals last; each named by its path").toEqual([
      "probe/_upgrade_probe",
      "retention/purge",
      "reads/stats",
      "probe/upgrade_probe",
      `${lastCarrierPath("prune_keys")} (removed)`,
    ]);
    expect(up).toContain("DROP FUNCTION idemq.purge;\n-- ---- sql/functions/retention/purge.sql ----\n");
    expect(up).not.toContain("DROP FUNCTION idemq.stats;");
    // Carried from CREATE on: the header comment is documentation, not schema.
    expect(up).toContain(`-- ---- sql/functions/reads/stats.sql ----\n${withoutHeader(edited)}\n`);
    expect(up).not.toContain("-- idemq.stats() RETURNS");
    expect(up).toContain(`-- ---- sql/functions/${lastCarrierPath("prune_keys")}.sql (removed) ----\nDROP FUNCTION idemq.prune_keys;\n`);
    expect(up).toContain("REVOKE EXECUTE ON FUNCTION idemq._upgrade_probe FROM PUBLIC;");
    expect(up).not.toContain("REVOKE EXECUTE ON FUNCTION idemq.upgrade_probe ");
    // Forward-only: the previous texts are not carried (a Down would have them).
    expect(up).not.toContain(withoutHeader(pruneKeys));
    expect(up).not.toContain(withoutHeader(stats));
    expect(up).not.toContain(withoutHeader(purge));

    expect(await script("--check")).toMatchObject({ code: 0, stderr: "" });
  });

  it("a bad name is a usage error; while the newest migration is unreleased, its name again amends it and adds no file", async () => {
    const before = await readdir(migrations);
    const again = await script("probe");
    expect(again).toMatchObject({ code: 0, stderr: "" });
    expect(again.stdout).toContain(`amended migrations/${NEXT}.sql`);
    const bad = await script("Bad-Name");
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("usage: npm run migration:new -- NAME");
    expect(await readdir(migrations)).toEqual(before);
  });

  it("the written migration applies on the latest database, installs exactly sql/schema.sql and sql/functions/, and is forward-only: migrate down is refused and changes nothing", async () => {
    const db = await makeDatabase({ poolSize: 2 });
    const before = await catalogSnapshot(db.pool);
    expect(await migrate({ connectionString: db.url, migrationsDir: migrations })).toEqual([NEXT]);

    const { rows } = await db.pool.query(`
      SELECT idemq.upgrade_probe() AS probe,
             has_function_privilege('public', 'idemq._upgrade_probe()', 'EXECUTE') AS helper_public,
             to_regproc('idemq.prune_keys') AS prune_keys,
             obj_description('idemq.stats'::regproc, 'pg_proc') AS stats_comment,
             (SELECT array_agg(pg_get_function_identity_arguments(oid)) FROM pg_proc WHERE oid = ANY('{idemq.purge}'::regproc[]::oid[]) OR (proname = 'purge' AND pronamespace = 'idemq'::regnamespace)) AS purge_signatures`);
    expect(rows[0]).toMatchObject({
      probe: "probe!",
      helper_public: false,
      prune_keys: null,
      stats_comment: expect.stringMatching(/^\(probe\) /),
      purge_signatures: ["older_than interval, states idemq.job_state[], batch_size integer, note text"],
    });
    const installed = await db.pool.query<{ name: string }>("SELECT proname AS name FROM pg_proc WHERE pronamespace = 'idemq'::regnamespace ORDER BY 1");
    const files = functionPaths(functions).map((f) => f.name);
    expect(installed.rows.map((r) => r.name)).toEqual(files);

    // What the upgrade leaves is what sql/schema.sql and (the copy's) sql/functions/ describe, object by object.
    const described = await makeDatabase({ empty: true, poolSize: 2 });
    await installFromSchemaFile(await described.newClient(), join(sql, "schema.sql"), functions);
    const differences = await catalogDifferences(described.pool, db.pool);
    expect(differences.map((d) => `${d.section} ${d.object}`), "the upgrade installs exactly sql/schema.sql and sql/functions/").toEqual([]);

    const upgraded = await catalogSnapshot(db.pool);
    expect(upgraded).not.toEqual(before);
    await expect(migrate({ connectionString: db.url, migrationsDir: migrations, direction: "down" })).rejects.toThrow(
      `User has disabled down migration on file: ${NEXT}`,
    );
    expect(await catalogSnapshot(db.pool)).toEqual(upgraded);
  });

  it("amends the newest migration while it is unreleased: one upgrade file per release, title and hand-written parts kept, every change since the release carried", async () => {
    // NEXT (written above) is not in the copy's released.sha256.
    const file = join(migrations, `${NEXT}.sql`);
    const written = await readFile(file, "utf8");
    const titled = written
      .replace(/^-- Migration .*$/m, `-- Migration ${NEXT}: the probe release.`)
      .replace("-- ==== end hand-written ====", "CREATE TABLE idemq.probe_table (id int);\n-- ==== end hand-written ====")
      .replace(/(-- ==== hand-written: after the functions .*\n)/, "$1CREATE INDEX probe_after ON idemq.probe_table (id);\n");
    // A Down section is refused, not dropped silently by the rewrite: migrations are forward-only.
    const withDown = `${titled}\n-- Down Migration\nDROP TABLE idemq.probe_table;\n`;
    await writeFile(file, withDown);
    const refused = await script("other_name");
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(`migrations/${NEXT}.sql: it has a Down Migration section; migrations are forward-only`);
    expect(await readFile(file, "utf8"), "nothing written").toBe(withDown);
    await writeFile(file, titled);
    const fnFile = join(functions, "probe", "upgrade_probe.sql");
    await writeFile(fnFile, PUBLIC_FN.replace("|| '!'", "|| '!!'"));

    const before = await readdir(migrations);
    const amended = await script("other_name");
    expect(amended).toMatchObject({ code: 0, stderr: "" });
    expect(amended.stdout).toContain(`amended migrations/${NEXT}.sql (not released; its title and hand-written parts kept): +_upgrade_probe +upgrade_probe ~purge ~stats -prune_keys`);
    expect(amended.stdout).toContain(`The name other_name was not used: changes go in the unreleased ${NEXT}`);
    expect(await readdir(migrations), "no file added").toEqual(before);
    const text = await readFile(file, "utf8");
    expect(text.split("\n")[0]).toBe(`-- Migration ${NEXT}: the probe release.`);
    expect(text).toContain("CREATE TABLE idemq.probe_table (id int);\n-- ==== end hand-written ====");
    // The part after the functions is kept too, in its place.
    expect(text.indexOf("CREATE INDEX probe_after")).toBeGreaterThan(text.lastIndexOf("-- ---- sql/functions/"));
    expect(text, "still forward-only").not.toContain("-- Down Migration");
    expect(text).toContain("RETURN idemq._upgrade_probe() || '!!';");
    expect(text).not.toContain("RETURN idemq._upgrade_probe() || '!';");
    expect(await script("--check")).toMatchObject({ code: 0, stderr: "" });

    // Released: a name in use is refused, and the next change makes a new file.
    await writeFile(join(sql, "released.sha256"), `${await readFile(join(sql, "released.sha256"), "utf8")}${sha256(file)}  migrations/${NEXT}.sql\n`);
    const again = await script("probe");
    expect(again.code).toBe(1);
    expect(again.stderr).toContain(`${NEXT}.sql already has the name probe; nothing written. Pick another name`);
    expect(await readdir(migrations)).toEqual(before);
    await writeFile(fnFile, PUBLIC_FN);
    const next = await script("after_release");
    expect(next.code).toBe(0);
    expect(next.stdout).toMatch(/^wrote migrations\/\d{4}_after_release\.sql: ~upgrade_probe$/m);
  });

  it("--check names a released migration whose text changed, and how to undo it", async () => {
    const first = join(migrations, "0001_release_0_1_0.sql");
    await writeFile(first, `${await readFile(first, "utf8")}\n-- an edit\n`);
    const check = await script("--check");
    expect(check.code).toBe(1);
    expect(check.stderr).toMatch(/^migrations\/0001_release_0_1_0\.sql is released and must never change: sha256 [0-9a-f]{64}, recorded [0-9a-f]{64} in released\.sha256; restore it/m);
  });
});

function sha256(file: string): string {
  return createHash("sha256").update(readFileSync(file)).digest("hex");
}

/** A function file's text from its CREATE on, as a migration carries it. */
function withoutHeader(fileText: string): string {
  return fileText.slice(fileText.indexOf("CREATE OR REPLACE FUNCTION")).trimEnd();
}

/** The repository's migrations' Up sections, by name. */
const UP_SECTIONS = MIGRATION_NAMES.map((migration) => ({
  migration,
  up: readFileSync(join(ROOT, "sql", "migrations", `${migration}.sql`), "utf8").split(/^-- Down Migration/m)[0]!,
}));
/** The function's marker in one Up section: sql/functions/<path>/<name>.sql (0001 names flat paths, later ones family folders). */
const markerOf = (up: string, name: string) => new RegExp(`^-- ---- sql/functions/((?:[\\w-]+/)*${name})\\.sql ----$`, "m").exec(up);

/** The last of the repository's migrations whose Up section carries sql/functions/.../<name>.sql. */
function lastCarrier(name: string): string {
  return UP_SECTIONS.filter((m) => markerOf(m.up, name)).at(-1)!.migration;
}

/** The path (under sql/functions/, without .sql) that the last migration carrying <name> gives it. */
function lastCarrierPath(name: string): string {
  return markerOf(UP_SECTIONS.find((m) => m.migration === lastCarrier(name))!.up, name)![1]!;
}
