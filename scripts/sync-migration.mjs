#!/usr/bin/env node
// Writes sql/migrations/NNNN_name.sql from sql/schema/NNNN_name.sql, putting the
// text of the functions named on its "-- @functions" line where that line stands
// ("*" = every file in sql/functions/, in dependency-safe order: private helpers first).
// A migration that adds or changes a function carries that function's text,
// so applied migrations never change: an existing migration is rewritten only
// with --force (for a migration not yet released).
//
//   node scripts/sync-migration.mjs 0001_init [--force] [--check]
import { readFileSync, writeFileSync, existsSync, readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const name = args.find((a) => !a.startsWith("--"));
const force = args.includes("--force");
const check = args.includes("--check");
if (!name) {
  console.error("usage: node scripts/sync-migration.mjs NNNN_name [--force] [--check]");
  process.exit(2);
}

export function buildMigration(sourceText, functionsDir) {
  return sourceText.replace(/^-- @functions (.*)$/m, (_, list) => {
    const all = readdirSync(functionsDir).filter((f) => f.endsWith(".sql")).map((f) => f.slice(0, -4));
    const names = list.trim() === "*" ? all : list.trim().split(/\s+/);
    // Created first: private helpers, then the state sets, which other
    // functions use in DEFAULT expressions (checked at CREATE time).
    const rank = (n) => (n.startsWith("_") ? 0 : n.endsWith("_states") ? 1 : 2);
    names.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    return names
      .map((n) => {
        const file = path.join(functionsDir, `${n}.sql`);
        if (!existsSync(file)) throw new Error(`@functions names ${n}, but ${file} does not exist`);
        return `-- ---- sql/functions/${n}.sql ----\n${readFileSync(file, "utf8").trimEnd()}\n`;
      })
      .join("\n");
  });
}

const source = path.join(root, "sql/schema", `${name}.sql`);
const target = path.join(root, "sql/migrations", `${name}.sql`);
const text = buildMigration(readFileSync(source, "utf8"), path.join(root, "sql/functions"));
if (check) {
  const same = existsSync(target) && readFileSync(target, "utf8") === text;
  if (!same) {
    console.error(`${target} is not what sql/schema/${name}.sql and sql/functions/ give; run: node scripts/sync-migration.mjs ${name} --force`);
    process.exit(1);
  }
  process.exit(0);
}
if (existsSync(target) && !force) {
  console.error(`${target} exists; migrations are immutable once applied. Pass --force only for an unreleased migration.`);
  process.exit(1);
}
writeFileSync(target, text);
console.log(`wrote ${path.relative(root, target)}`);
