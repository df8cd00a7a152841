#!/usr/bin/env node
// Writes the next migration, sql/migrations/NNNN_NAME.sql, carrying the text of
// every function file that changed since the latest migration state (without
// its header comment: see migrationText), so applied migrations never change.
//
// The latest migration state of a function is its text as the last migration
// that carries it has it: each migration marks an embedded function with
// `-- ---- sql/functions/FAMILY/NAME.sql ----` (the text runs to the file's
// closing COMMENT ON FUNCTION) and a dropped one with `-- ---- sql/functions/
// FAMILY/NAME.sql (removed) ----`. A function is known by its file's name
// alone, NAME (unique across the family folders): 0001, released before the
// folders, names the flat paths sql/functions/NAME.sql. Only the Up sections
// are read.
//
//   npm run migration:new -- NAME       write sql/migrations/NNNN_NAME.sql; when the
//                                       newest migration is not released yet, amend
//                                       it instead (one upgrade file per release),
//                                       keeping its hand-written parts
//
// Hand-written parts: one before the functions (schema changes the functions
// use) and one after them (what needs a function it creates, such as a
// trigger on a new trigger function). Migrations are forward-only: a
// migration this script writes has no Down section (node-pg-migrate then
// refuses to revert it), and one it amends must have none.
//   npm run migration:check             exit 1 unless the latest state equals
//                                       sql/functions/ and released migrations
//                                       match sql/released.sha256
//   (--functions DIR --migrations DIR --released FILE override the paths; tests use them)
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const MARKER = /^-- ---- sql\/functions\/((?:[\w-]+\/)*(\w+)\.sql)( \(removed\))? ----$/gm;
const marker = (file) => `-- ---- sql/functions/${file} ----`;
const removedMarker = (file) => `-- ---- sql/functions/${file} (removed) ----`;
// node-pg-migrate's section comments (sqlMigration.ts, createMigrationCommentRegex).
const DOWN_SECTION = /^\s*--[\s-]*down\s+migration/im;

/**
 * Creation order: private helpers, then the state sets, which other functions
 * use in DEFAULT expressions (checked at CREATE time), then the rest. Among
 * the helpers, one that another helper in `names` calls comes first (given
 * their texts): a SQL-language body is checked at CREATE time too.
 */
export function creationOrder(names, texts = new Map()) {
  const rank = (n) => (n.startsWith("_") ? 0 : n.endsWith("_states") ? 1 : 2);
  const helpers = new Set(names.filter((n) => n.startsWith("_")));
  const depths = new Map();
  const depth = (n, path = new Set()) => {
    if (depths.has(n)) return depths.get(n);
    if (path.has(n)) return 0; // a cycle: plpgsql bodies only, which CREATE does not check
    path.add(n);
    const called = [...(texts.get(n) ?? "").matchAll(/idemq\.(_\w+)\(/g)].map((m) => m[1]);
    const d = Math.max(0, ...called.filter((c) => c !== n && helpers.has(c)).map((c) => 1 + depth(c, path)));
    depths.set(n, d);
    return d;
  };
  const level = (n) => (helpers.has(n) ? depth(n) : 0);
  return [...names].sort((a, b) => rank(a) - rank(b) || level(a) - level(b) || a.localeCompare(b));
}

/**
 * A function file's text as migrations carry it: from CREATE OR REPLACE
 * FUNCTION on, without trailing whitespace. The header comment above it is the
 * function's documentation; it lives in sql/functions/ and docs/sql-api.md
 * only, so a change to a header needs no migration.
 */
export function migrationText(fileText) {
  const start = fileText.indexOf("CREATE OR REPLACE FUNCTION");
  return (start < 0 ? fileText : fileText.slice(start)).trimEnd();
}

/**
 * The function files under `dir` (sql/functions/ and its family folders, at
 * any depth): [{name, file}], file relative to `dir` with / separators,
 * sorted by name (then file).
 */
export function functionPaths(dir) {
  return readdirSync(dir, { recursive: true })
    .map((f) => String(f).split(path.sep).join("/"))
    .filter((f) => f.endsWith(".sql"))
    .map((file) => ({ name: path.posix.basename(file, ".sql"), file }))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : a.file < b.file ? -1 : 1));
}

/** Names that more than one file under `dir` has (functionPaths): a function is known by its file's name, so each must be unique across the folders. */
export function duplicateNames(dir) {
  const files = functionPaths(dir);
  return [...new Set(files.filter((f, i) => i > 0 && files[i - 1].name === f.name).map((f) => f.name))];
}

/** The function files under `dir` (functionPaths) as a Map name -> text as migrations carry it (migrationText). Throws when a name has two files. */
export function functionFiles(dir) {
  const twice = duplicateNames(dir);
  if (twice.length > 0) {
    throw new Error(`${dir}: a function name has one file across the folders, but ${twice.map((n) => `${n}.sql`).join(", ")} has more than one`);
  }
  return new Map(functionPaths(dir).map((f) => [f.name, migrationText(readFileSync(path.join(dir, f.file), "utf8"))]));
}

/** The migration files in the order node-pg-migrate runs them (numeric prefix). */
export function migrationFiles(dir) {
  return readdirSync(dir)
    .filter((f) => /^\d+_\w+\.sql$/.test(f))
    .sort((a, b) => parseInt(a, 10) - parseInt(b, 10) || a.localeCompare(b))
    .map((f) => ({ name: f.slice(0, -4), file: path.join(dir, f) }));
}

/** The functions one migration's Up section carries: Map name -> text, or null for a removed one (`files`, if given, receives name -> the file its marker names). */
export function carriedFunctions(text, source, files = new Map()) {
  const downAt = text.search(DOWN_SECTION);
  const up = downAt < 0 ? text : text.slice(0, downAt);
  const carried = new Map();
  for (const m of up.matchAll(MARKER)) {
    const name = m[2];
    files.set(name, m[1]);
    if (m[3]) {
      carried.set(name, null);
      continue;
    }
    const start = m.index + m[0].length + 1;
    const end = new RegExp(String.raw`COMMENT ON FUNCTION idemq\.${name}\([^)]*\) IS\s+'(?:[^']|'')*';`).exec(up.slice(start));
    if (!end) {
      throw new Error(`${source}: the text after "${m[0]}" does not end with COMMENT ON FUNCTION idemq.${name}(...) IS '...';`);
    }
    carried.set(name, up.slice(start, start + end.index + end[0].length));
  }
  return carried;
}

/**
 * The latest migration state: Map name -> text of every function the
 * migrations leave installed, which migration set each, and the file its
 * marker there names (all migrations, or those before `upTo`).
 */
export function latestState(migrationsDir, upTo = undefined) {
  const state = new Map();
  const from = new Map();
  const files = new Map();
  const all = migrationFiles(migrationsDir);
  const until = upTo === undefined ? all.length : all.findIndex((m) => m.name === upTo);
  for (const { name, file } of all.slice(0, until)) {
    for (const [fn, text] of carriedFunctions(readFileSync(file, "utf8"), file, files)) {
      if (text === null) state.delete(fn);
      else state.set(fn, text);
      from.set(fn, name);
    }
  }
  return { state, from, files };
}

/** What sql/functions/ changed against the state: names created, changed and removed. */
export function changes(state, files) {
  return {
    created: [...files.keys()].filter((n) => !state.has(n)),
    changed: [...files.keys()].filter((n) => state.has(n) && state.get(n) !== files.get(n)),
    removed: [...state.keys()].filter((n) => !files.has(n)),
  };
}

/** From CREATE OR REPLACE FUNCTION to the LANGUAGE line: the arguments and the return type. */
export function signature(text) {
  const start = text.indexOf("CREATE OR REPLACE FUNCTION");
  return text.slice(start, text.indexOf("\nLANGUAGE ", start));
}

// The hand-written parts of a migration, each between "-- ==== hand-written: LABEL (...) ====" and
// "-- ==== end hand-written ====": kept as they are when migration:new amends the file.
const HAND_WRITTEN = /^-- ==== hand-written: ([^(]*?) \(.*\) ====\n([\s\S]*?)^-- ==== end hand-written ====$/gm;
const SECTIONS = {
  up: {
    label: "schema changes",
    text: [
      "-- Schema changes (tables, columns, indexes) go here, before the functions",
      "-- that may use them, and in sql/schema.sql too (test/install/schema-file.test.ts",
      "-- holds the two equal). An enum value (ALTER TYPE ... ADD VALUE) goes in a",
      "-- migration of its own: PostgreSQL refuses to use a new value before its",
      "-- transaction commits (\"unsafe use of new value\"), in a CHECK, an index",
      "-- predicate or a SQL-language function body alike, and each migration",
      "-- commits on its own, so the next migration can use it.",
    ].join("\n"),
  },
  after: {
    label: "after the functions",
    text: [
      "-- What needs the functions above goes here: a trigger whose function is new",
      "-- (CREATE TRIGGER needs the function; the part before the functions cannot",
      "-- name it), backfills and grants that call them, and what must run under the",
      "-- new functions.",
    ].join("\n"),
  },
};
const section = (key, kept) => [
  `-- ==== hand-written: ${SECTIONS[key].label} (kept when migration:new amends this file) ====`,
  (kept?.[key] ?? SECTIONS[key].text).trimEnd(),
  "-- ==== end hand-written ====",
];

/** The hand-written parts of a migration this script wrote (its title line and each section), to keep when it is amended. */
export function handWritten(text) {
  if (DOWN_SECTION.test(text)) {
    // Forward-only: a Down section would be dropped silently by the rewrite, so it is refused instead.
    throw new Error("it has a Down Migration section; migrations are forward-only (one upgrade file per release): delete that section and run this again");
  }
  const kept = { title: text.slice(0, text.indexOf("\n")) };
  for (const m of text.matchAll(HAND_WRITTEN)) {
    const key = Object.keys(SECTIONS).find((k) => SECTIONS[k].label === m[1]);
    if (key === undefined) throw new Error(`unknown hand-written section "${m[1]}"`);
    kept[key] = m[2];
  }
  if (kept.up === undefined) {
    throw new Error("expected the hand-written sections between '-- ==== hand-written: LABEL (...) ====' and '-- ==== end hand-written ===='");
  }
  return kept;
}

/**
 * The text of migration `name` carrying `diff` (see changes()), with `kept`
 * hand-written parts (handWritten()) when amending. `paths` names each
 * function's file: where sql/functions/ has it, or, for a removed one, where
 * the migration that carried it last found it.
 */
export function renderMigration(name, diff, state, files, paths, kept = undefined) {
  const up = creationOrder([...diff.created, ...diff.changed], files);
  // CREATE OR REPLACE cannot change argument types or names or the return type
  // (and would add an overload for new argument types): drop the old one first.
  // A dependent (a DEFAULT, a SQL-standard body, a trigger) makes the DROP fail
  // loudly at migrate time; then handle it by hand in the sections.
  const resigned = new Set(diff.changed.filter((n) => signature(state.get(n)) !== signature(files.get(n))));
  const redefine = (n) => (resigned.has(n) ? [`-- The signature changed: CREATE OR REPLACE cannot change it.`, `DROP FUNCTION idemq.${n};`] : []);
  const revoke = (names) => names.filter((n) => n.startsWith("_")).map((n) => `REVOKE EXECUTE ON FUNCTION idemq.${n} FROM PUBLIC;`);
  // Dependents before what they use.
  const drops = (names, texts) => creationOrder(names, texts).reverse();
  const lines = [
    kept?.title ?? `-- Migration ${name}: TODO one line saying what changes and why.`,
    "-- Written by `npm run migration:new`; the function texts below are copies of",
    "-- sql/functions/ from CREATE on (npm run migration:check compares them). Until",
    "-- it is released (listed in sql/released.sha256), migration:new amends it;",
    "-- after that it never changes again. Forward-only: no Down section (the way",
    "-- back from an upgrade is the backup taken before it).",
    "-- Up Migration",
    "",
    ...section("up", kept),
    "",
  ];
  for (const n of up) lines.push(...redefine(n), marker(paths.get(n)), files.get(n), "");
  for (const n of drops(diff.removed, state)) lines.push(removedMarker(paths.get(n)), `DROP FUNCTION idemq.${n};`, "");
  const upRevokes = revoke([...diff.created, ...resigned]);
  if (upRevokes.length > 0) lines.push("-- Private helpers are for the public functions only.", ...upRevokes, "");
  // A function created (or created again) has PUBLIC's default EXECUTE and
  // none of the roles' grants: idemq._grant_roles() gives them, where it exists.
  const regrant = ["-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).", "SELECT count(*) FROM idemq._grant_roles();", ""];
  if (files.has("_grant_roles") && diff.created.length + resigned.size > 0) lines.push(...regrant);
  lines.push(...section("after", kept), "");
  return lines.join("\n");
}

/** The names of the released migrations (sql/released.sha256 lists them as migrations/NAME.sql). */
export function releasedMigrationNames(releasedFile) {
  return new Set(
    readFileSync(releasedFile, "utf8")
      .split("\n")
      .filter((line) => line.trim() !== "")
      .map((line) => path.basename(line.split(/\s+\*?/)[1], ".sql")),
  );
}

/** Released migrations whose text no longer has its recorded sha256: [{file, expected, actual}]. */
export function releasedMismatches(releasedFile) {
  const dir = path.dirname(releasedFile);
  return readFileSync(releasedFile, "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => {
      const [expected, file] = line.split(/\s+\*?/);
      const full = path.join(dir, file);
      const actual = existsSync(full) ? createHash("sha256").update(readFileSync(full)).digest("hex") : "missing";
      return { file, expected, actual };
    })
    .filter((r) => r.actual !== r.expected);
}

function main(argv) {
  const option = (flag, fallback) => {
    const at = argv.indexOf(flag);
    return at >= 0 ? path.resolve(argv[at + 1]) : fallback;
  };
  const functionsDir = option("--functions", path.join(root, "sql", "functions"));
  const migrationsDir = option("--migrations", path.join(root, "sql", "migrations"));
  const releasedFile = option("--released", path.join(root, "sql", "released.sha256"));
  const positional = argv.filter((a, i) => !a.startsWith("--") && !["--functions", "--migrations", "--released"].includes(argv[i - 1]));
  const shown = (p) => path.relative(process.cwd(), p) || ".";

  const found = functionPaths(functionsDir);
  const files = functionFiles(functionsDir);
  const { state, from, files: carriedPaths } = latestState(migrationsDir);
  // Where each function's file is: in sql/functions/, or (removed) where its last migration found it.
  const pathsFrom = (carried) => new Map([...carried, ...found.map((f) => [f.name, f.file])]);
  const diff = changes(state, files);
  const migrations = migrationFiles(migrationsDir);
  const latest = migrations.at(-1)?.name ?? "(none)";

  if (argv.includes("--check")) {
    const problems = [
      ...diff.created.map((n) => `${shown(functionsDir)}/${pathsFrom(carriedPaths).get(n)} is new: no migration creates idemq.${n}`),
      ...diff.changed.map((n) => `${shown(functionsDir)}/${pathsFrom(carriedPaths).get(n)} differs from its text in ${from.get(n)}`),
      ...diff.removed.map((n) => `${shown(functionsDir)}/${carriedPaths.get(n)} is gone, but ${from.get(n)} leaves idemq.${n} installed`),
    ];
    if (existsSync(releasedFile)) {
      for (const r of releasedMismatches(releasedFile)) {
        problems.push(`${r.file} is released and must never change: sha256 ${r.actual}, recorded ${r.expected} in ${shown(releasedFile)}; restore it (git checkout) and put the change in a new migration`);
      }
    }
    if (problems.length === 0) return 0;
    for (const p of problems) console.error(p);
    if (diff.created.length + diff.changed.length + diff.removed.length > 0) {
      console.error(
        `The latest migration state (up to ${latest}) differs from ${shown(functionsDir)}/; carry the change in a new migration: npm run migration:new -- NAME`,
      );
    }
    return 1;
  }

  const usage = "usage: npm run migration:new -- NAME   (NAME: lower case, digits and _, e.g. add_pause)";
  if (positional[0] !== undefined && !/^[a-z][a-z0-9_]*$/.test(positional[0])) {
    console.error(usage);
    return 2;
  }
  const releasedNames = existsSync(releasedFile) ? releasedMigrationNames(releasedFile) : new Set();
  const newest = migrations.at(-1);
  if (newest && !releasedNames.has(newest.name)) {
    // One upgrade file per release: the unreleased newest migration is written again from
    // the state before it, with its title and hand-written parts kept.
    const before = latestState(migrationsDir, newest.name);
    const amended = changes(before.state, files);
    let kept;
    try {
      kept = handWritten(readFileSync(newest.file, "utf8"));
    } catch (error) {
      console.error(`${shown(newest.file)}: ${error.message}; nothing written.`);
      return 1;
    }
    writeFileSync(newest.file, renderMigration(newest.name, amended, before.state, files, pathsFrom(before.files), kept));
    const carried = [...amended.created.map((n) => `+${n}`), ...amended.changed.map((n) => `~${n}`), ...amended.removed.map((n) => `-${n}`)];
    console.log(`amended ${shown(newest.file)} (not released; its title and hand-written parts kept): ${carried.length > 0 ? carried.join(" ") : "no function changed"}`);
    if (positional[0] && positional[0] !== newest.name.replace(/^\d+_/, "")) {
      console.log(`The name ${positional[0]} was not used: changes go in the unreleased ${newest.name} until it is released (listed in ${shown(releasedFile)}).`);
    }
    return 0;
  }
  const name = positional[0];
  if (!name) {
    console.error(usage);
    return 2;
  }
  const sameName = migrations.find((m) => m.name.replace(/^\d+_/, "") === name);
  if (sameName) {
    console.error(
      `${shown(sameName.file)} already has the name ${name}; nothing written. Pick another name, or, if ${sameName.name} is not released ` +
        `(not in ${shown(releasedFile)}) and you mean to regenerate it, delete it and run this again (hand-written parts are lost).`,
    );
    return 1;
  }
  const next = migrations.reduce((max, m) => Math.max(max, parseInt(m.name, 10)), 0) + 1;
  const migration = `${String(next).padStart(4, "0")}_${name}`;
  const target = path.join(migrationsDir, `${migration}.sql`);
  if (existsSync(target)) {
    console.error(`${shown(target)} exists; nothing written. Migrations are never overwritten: pick another name.`);
    return 1;
  }
  writeFileSync(target, renderMigration(migration, diff, state, files, pathsFrom(carriedPaths)));
  const carried = [...diff.created.map((n) => `+${n}`), ...diff.changed.map((n) => `~${n}`), ...diff.removed.map((n) => `-${n}`)];
  console.log(`wrote ${shown(target)}: ${carried.length > 0 ? carried.join(" ") : `no function changed since ${latest}`}`);
  const resigned = diff.changed.filter((n) => signature(state.get(n)) !== signature(files.get(n)));
  if (resigned.length > 0) console.log(`Signature changed (dropped first, then created): ${resigned.map((n) => `idemq.${n}`).join(", ")}`);
  console.log("Next: replace its TODO line, add hand-written schema changes (before or after the functions; the same change in sql/schema.sql), and run npm run migration:check.");
  return 0;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = main(process.argv.slice(2));
}
