#!/usr/bin/env node
// Writes docs/sql-api.md from the headers of sql/functions/FAMILY/*.sql :
// public functions first, then private helpers (each index names the family
// folder of every function: sql/functions/README.md), each with its signature,
// purpose, what it returns, Guarantees, Concurrency, Errors and Tests, and the
// one-line COMMENT ON FUNCTION as its summary. The headers are the source; the
// page is generated, and test/contract/docs.test.ts fails when it is stale.
// What a function returns, every column included, comes from the committed
// catalog snapshot (test/contract/catalog.snapshot.json, which
// test/contract/catalog-snapshot.test.ts holds equal to a migrated database):
// a header names a composite type (`RETURNS SETOF idemq.claimed_job`) but
// not its columns, which only the catalog has. So after a schema change, run
// scripts/catalog-snapshot.mjs first, then this.
//
//   node scripts/sql-docs.mjs           (or: npm run docs:sql)  write docs/sql-api.md
//   node scripts/sql-docs.mjs --check   exit 1 when docs/sql-api.md differs from what the headers give
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { functionPaths } from "./migration-new.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const functionsDir = path.join(root, "sql", "functions");
const target = path.join(root, "docs", "sql-api.md");
const snapshotPath = path.join(root, "test", "contract", "catalog.snapshot.json");
const SECTIONS = ["Guarantees", "Concurrency", "Errors", "Tests"];

/** Splits "a t, b numeric(10,2)" at its top-level commas. */
function splitTopLevel(list) {
  const parts = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < list.length; i++) {
    const c = list[i];
    if (c === "(") depth++;
    else if (c === ")") depth--;
    else if (c === "," && depth === 0) {
      parts.push(list.slice(start, i).trim());
      start = i + 1;
    }
  }
  parts.push(list.slice(start).trim());
  return parts.filter((p) => p !== "");
}

/**
 * What a function returns, as the catalog snapshot says: { set, columns }
 * for rows (RETURNS TABLE, or a composite type or table of schema idemq,
 * expanded to its columns in order; `type` names the composite), or
 * { set, scalar } for a single value. Throws, naming the fix, when the
 * snapshot has no such function.
 */
export function resultOf(name, snapshot) {
  const fns = snapshot.functions.filter((f) => f.name === name);
  if (fns.length !== 1) {
    throw new Error(`idemq.${name}: the catalog snapshot has ${fns.length} functions idemq.${name}; run node scripts/catalog-snapshot.mjs first`);
  }
  const result = fns[0].result;
  const table = /^TABLE\((.*)\)$/s.exec(result);
  if (table) {
    const columns = splitTopLevel(table[1]).map((c) => {
      const space = c.indexOf(" ");
      return { name: c.slice(0, space), type: c.slice(space + 1) };
    });
    return { set: true, columns };
  }
  const set = result.startsWith("SETOF ");
  const type = set ? result.slice("SETOF ".length) : result;
  if (type === "record") {
    // OUT parameters: one row of them (the catalog prints them among the arguments).
    const columns = splitTopLevel(fns[0].arguments)
      .filter((a) => a.startsWith("OUT ") || a.startsWith("INOUT "))
      .map((a) => {
        const [, name, argType] = /^(?:IN)?OUT (\S+) (.+)$/.exec(a);
        return { name, type: argType };
      });
    if (columns.length > 0) return { set, columns };
  }
  const relation = type.startsWith("idemq.") ? snapshot.relations.find((r) => r.name === type.slice("idemq.".length) && ["c", "r"].includes(r.kind)) : undefined;
  if (relation === undefined) return { set, scalar: type };
  const columns = snapshot.columns
    .filter((c) => c.relation === relation.name)
    .sort((a, b) => a.position - b.position)
    .map((c) => ({ name: c.name, type: c.type }));
  return { set, type, columns };
}

/** The "Returns" line of a function's section. */
export function renderResult(name, result) {
  if (result.columns !== undefined) {
    const rows = result.set ? "rows" : "one row";
    const of = result.type === undefined ? "" : ` of \`${result.type}\``;
    return `**Returns:** ${rows}${of}, with the columns ${result.columns.map((c) => `\`${c.name}\` ${c.type}`).join(", ")}.`;
  }
  if (result.scalar === "void") return "**Returns:** nothing (`void`).";
  if (result.scalar === "trigger") return "**Returns:** `trigger` (a trigger function).";
  // SELECT * FROM f() names a scalar's one column after the function.
  return result.set
    ? `**Returns:** a set of \`${result.scalar}\` values (one column, \`${name}\` in \`SELECT * FROM idemq.${name}(...)\`).`
    : `**Returns:** one \`${result.scalar}\` value.`;
}

/** Parses one function file's header (`file`: its path under sql/functions/). Throws, naming the file, when the header lacks a part. */
export function parseHeader(file, text) {
  const name = path.posix.basename(file, ".sql");
  const family = path.posix.dirname(file);
  const fail = (why) => {
    throw new Error(`sql/functions/${file}: ${why} (a header is: the signature, a blank line, the purpose, then Guarantees, Concurrency, Errors and Tests)`);
  };
  const lines = text.split("\n");
  const end = lines.findIndex((l) => !l.startsWith("--"));
  if (end <= 0) fail("no header comment");
  const header = lines.slice(0, end).map((l) => l.replace(/^-- ?/, ""));
  const blank = header.findIndex((l) => l.trim() === "");
  if (blank <= 0) fail("the signature is not followed by a blank comment line");
  const signature = header.slice(0, blank).join("\n").replace(/^idemq\./, "idemq.");
  if (!signature.startsWith(`idemq.${name}(`)) fail(`the first line is not the signature of idemq.${name}`);

  const labelRe = new RegExp(`^(${SECTIONS.join("|")})\\b([^:]*):\\s?(.*)$`);
  const starts = [];
  header.forEach((line, i) => {
    const m = labelRe.exec(line);
    if (m && i > blank) starts.push({ i, label: m[1], qualifier: m[2].trim(), first: m[3] });
  });
  const labels = starts.map((s) => s.label);
  if (labels.join() !== SECTIONS.join()) fail(`sections are [${labels.join(", ")}], expected [${SECTIONS.join(", ")}]`);

  const purpose = header.slice(blank + 1, starts[0].i);
  if (purpose.every((l) => l.trim() === "")) fail("no purpose sentence before Guarantees:");
  const sections = starts.map((s, k) => {
    const body = header.slice(s.i + 1, k + 1 < starts.length ? starts[k + 1].i : header.length);
    // The text after "Label:" continues at the indentation of the lines under it.
    return { label: s.label, qualifier: s.qualifier, lines: s.first ? ["  " + s.first, ...body] : body };
  });

  const comment = /COMMENT ON FUNCTION [^\n]+ IS\s+'((?:[^']|'')*)';\s*$/.exec(text);
  if (!comment) fail("does not end with COMMENT ON FUNCTION ... IS '...';");
  return { name, family, signature, purpose, sections, summary: comment[1].replace(/''/g, "'") };
}

const indentOf = (line) => line.length - line.trimStart().length;

/**
 * Turns comment lines into Markdown: paragraphs (lines joined), bullet lists
 * ("* " or "- " items with their continuation lines) and Markdown tables
 * ("|" rows, kept as written); a block laid out by indentation stays as
 * written, in a text block.
 */
export function toMarkdown(lines) {
  const body = lines.filter((l, i, all) => l.trim() !== "" || (i > 0 && i < all.length - 1));
  const present = body.filter((l) => l.trim() !== "");
  if (present.length === 0) return "";
  const base = Math.min(...present.map(indentOf));
  const blocks = [];
  let current;
  let laidOut = false;
  for (const line of body) {
    const text = line.trim();
    const n = indentOf(line) - base;
    if (text === "") {
      current = undefined;
    } else if (text.startsWith("|")) {
      if (current?.kind !== "table") {
        current = { kind: "table", rows: [] };
        blocks.push(current);
      }
      current.rows.push(text);
    } else if (text.startsWith("* ") || text.startsWith("- ")) {
      current = { kind: "bullet", indent: n, text: text.slice(2) };
      blocks.push(current);
    } else if (current?.kind === "bullet" && n > current.indent) {
      current.text += " " + text;
    } else if (n === 0) {
      if (current?.kind !== "para") {
        current = { kind: "para", text };
        blocks.push(current);
      } else current.text += " " + text;
    } else {
      laidOut = true;
    }
  }
  if (laidOut) {
    return ["```text", ...body.map((l) => l.slice(Math.min(base, indentOf(l))).trimEnd()), "```"].join("\n");
  }
  const out = [];
  blocks.forEach((b, i) => {
    if (b.kind === "bullet") out.push(`- ${b.text}`);
    else {
      if (i > 0) out.push("");
      out.push(...(b.kind === "table" ? b.rows : [b.text]));
    }
    // A list or table ends with a blank line before whatever follows it.
    if (b.kind !== "para" && blocks[i + 1] !== undefined && blocks[i + 1].kind !== "bullet") out.push("");
  });
  return out.join("\n");
}

function anchor(name) {
  return `idemq${name}`.toLowerCase().replace(/[^a-z0-9_-]/g, "");
}

function renderFunction(f, snapshot) {
  const parts = [`### idemq.${f.name}`, "", "```sql", f.signature, "```", "", toMarkdown(f.purpose), "", renderResult(f.name, resultOf(f.name, snapshot)), ""];
  for (const s of f.sections) {
    const title = `**${s.label}${s.qualifier ? ` ${s.qualifier}` : ""}:**`;
    let text = toMarkdown(s.lines);
    if (s.label === "Tests") text = text.replace(/test\/[\w./-]+\.test\.ts/g, (t) => `[${t}](../${t})`);
    if (text.startsWith("```") || text.startsWith("- ") || text.startsWith("|")) parts.push(title, "", text, "");
    else parts.push(`${title} ${text}`, "");
  }
  return parts.join("\n");
}

/** The whole page, from the files in `dir`. */
export function renderSqlDocs(dir = functionsDir, snapshot = JSON.parse(readFileSync(snapshotPath, "utf8"))) {
  const fns = functionPaths(dir).map((f) => parseHeader(f.file, readFileSync(path.join(dir, f.file), "utf8")));
  const publicFns = fns.filter((f) => !f.name.startsWith("_"));
  const privateFns = fns.filter((f) => f.name.startsWith("_"));
  const index = (list) =>
    [
      "| function | family | summary |",
      "|---|---|---|",
      ...list.map((f) => `| [\`${f.name}\`](#${anchor(f.name)}) | ${f.family} | ${f.summary.replace(/\|/g, "\\|")} |`),
    ].join("\n");
  return [
    "<!-- Generated by scripts/sql-docs.mjs from the headers of sql/functions/FAMILY/*.sql: do not edit; run `npm run docs:sql`. -->",
    "",
    "# idemq SQL API",
    "",
    "Every function lives in schema `idemq`, one file per function in `sql/functions/`, in a folder per family",
    "(its column in the indexes below; what each family holds: [sql/functions/README.md](../sql/functions/README.md)).",
    "Call them by named parameters (`idemq.enqueue(task => 'send_email', payload => '{...}')`), or the leading ones by position",
    "(`idemq.enqueue('send_email', '{...}')`, what the TypeScript client sends: a little cheaper for the server to parse);",
    "a parameter left out takes its DEFAULT. Errors: class `22` or `IQ404`/`IQ409`/`IQ410`/`IQ412`/`IQ422`,",
    "each with a HINT (see [design.md](design.md#error-codes)). Job states and their transitions: [state-machine.md](state-machine.md).",
    "",
    "Each function's **Returns** lists every column of the rows it returns, in order (a composite type's too, from the catalog).",
    "A job's id is `job_id` in every row a function returns (a job a row refers to in another role: `last_job_id`, as `schedules()` has it);",
    "its other fields keep their `idemq.jobs` column names. What a release may change in them, and what it may not, is in",
    "[design.md](design.md#migrations-and-releases).",
    "",
    "## Job filters",
    "",
    "`find_jobs`, `count_jobs` and the bulk actions (`retry_jobs`, `cancel_jobs`, `delete_jobs`, `run_jobs_now`) take the same",
    "filter: a JSON object whose fields must all match; `'{}'` matches every job. An unknown field, a wrong type or a bad value is",
    "refused with 22023 naming the field, before anything is read ([`_check_job_filter`](#idemq_check_job_filter)).",
    "",
    "| field | matches |",
    "|---|---|",
    "| `ids` | these job ids (1 to 10,000; numbers or digit strings) |",
    "| `state` | any of these states (an array) |",
    "| `task`, `queue`, `key`, `concurrency_key` | this task, queue, idempotency key, concurrency key |",
    "| `error` | text in the job's last error (`class: message`), any case |",
    "| `created_after`, `created_before` | created in [after, before) |",
    "| `finished_after`, `finished_before` | finished in [after, before) |",
    "| `payload` | payloads containing this object (`@>`); needs `task`, `key` or `ids` beside it |",
    "",
    "Which index serves which field, and what a page costs at 1,000,000 jobs: [`_matching_jobs`](#idemq_matching_jobs).",
    "A bulk action acts on one batch per call, newest first: call it again with `before_id => next_before_id` while `more` is",
    "true (`idemq jobs retry|cancel|delete|run-now` does, after `count_jobs(filter, action => ...)` says how many).",
    "",
    "```sql",
    "SELECT job_id, state, task FROM idemq.find_jobs('{\"state\": [\"failed\"], \"task\": \"send_email\", \"error\": \"timeout\"}');",
    "SELECT * FROM idemq.count_jobs('{\"task\": \"send_email\", \"error\": \"timeout\"}', action => 'retry');",
    "SELECT * FROM idemq.retry_jobs('{\"task\": \"send_email\", \"error\": \"timeout\"}', max_jobs => 1000);",
    "```",
    "",
    "## Public functions",
    "",
    index(publicFns),
    "",
    ...publicFns.map((f) => renderFunction(f, snapshot)),
    "## Private helpers",
    "",
    "Used by the public functions only; EXECUTE is revoked from PUBLIC.",
    "",
    index(privateFns),
    "",
    ...privateFns.map((f) => renderFunction(f, snapshot)),
  ]
    .join("\n")
    .replace(/\n{3,}/g, "\n\n")
    .trimEnd()
    .concat("\n");
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const check = process.argv.includes("--check");
  let text;
  try {
    text = renderSqlDocs();
  } catch (error) {
    console.error(error.message);
    process.exit(1);
  }
  if (check) {
    if (!existsSync(target) || readFileSync(target, "utf8") !== text) {
      console.error("docs/sql-api.md is stale: it differs from the headers of sql/functions/FAMILY/*.sql; run: npm run docs:sql");
      process.exit(1);
    }
    process.exit(0);
  }
  writeFileSync(target, text);
  console.log(`wrote ${path.relative(root, target)}`);
}
