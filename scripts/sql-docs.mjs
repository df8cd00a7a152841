#!/usr/bin/env node
// Writes docs/sql-api.md from the headers of sql/functions/*.sql :
// public functions first, then private helpers, each with its signature,
// purpose, Guarantees, Concurrency, Errors and Tests, and the one-line
// COMMENT ON FUNCTION as its summary. The headers are the source; the page is
// generated, and test/contract/docs.test.ts fails when it is stale.
//
//   node scripts/sql-docs.mjs           (or: npm run docs:sql)  write docs/sql-api.md
//   node scripts/sql-docs.mjs --check   exit 1 when docs/sql-api.md differs from what the headers give
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const functionsDir = path.join(root, "sql", "functions");
const target = path.join(root, "docs", "sql-api.md");
const SECTIONS = ["Guarantees", "Concurrency", "Errors", "Tests"];

/** Parses one function file's header. Throws, naming the file, when the header lacks a part. */
export function parseHeader(fileName, text) {
  const name = fileName.replace(/\.sql$/, "");
  const fail = (why) => {
    throw new Error(`sql/functions/${fileName}: ${why} (a header is: the signature, a blank line, the purpose, then Guarantees, Concurrency, Errors and Tests)`);
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
  return { name, signature, purpose, sections, summary: comment[1].replace(/''/g, "'") };
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

function renderFunction(f) {
  const parts = [`### idemq.${f.name}`, "", "```sql", f.signature, "```", "", toMarkdown(f.purpose), ""];
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
export function renderSqlDocs(dir = functionsDir) {
  const files = readdirSync(dir).filter((f) => f.endsWith(".sql")).sort();
  const fns = files.map((f) => parseHeader(f, readFileSync(path.join(dir, f), "utf8")));
  const publicFns = fns.filter((f) => !f.name.startsWith("_"));
  const privateFns = fns.filter((f) => f.name.startsWith("_"));
  const index = (list) =>
    ["| function | summary |", "|---|---|", ...list.map((f) => `| [\`${f.name}\`](#${anchor(f.name)}) | ${f.summary.replace(/\|/g, "\\|")} |`)].join("\n");
  return [
    "<!-- Generated by scripts/sql-docs.mjs from the headers of sql/functions/*.sql: do not edit; run `npm run docs:sql`. -->",
    "",
    "# idemq SQL API",
    "",
    "Every function lives in schema `idemq`, one file per function in `sql/functions/`.",
    "Call them by named parameters (`idemq.enqueue(task => 'send_email', payload => '{...}')`), or the leading ones by position",
    "(`idemq.enqueue('send_email', '{...}')`, what the TypeScript client sends: a little cheaper for the server to parse);",
    "a parameter left out takes its DEFAULT. Errors: class `22` or `IQ404`/`IQ409`/`IQ410`/`IQ412`/`IQ422`,",
    "each with a HINT (see [design.md](design.md#error-codes)). Job states and their transitions: [state-machine.md](state-machine.md).",
    "",
    "## Public functions",
    "",
    index(publicFns),
    "",
    ...publicFns.map(renderFunction),
    "## Private helpers",
    "",
    "Used by the public functions only; EXECUTE is revoked from PUBLIC.",
    "",
    index(privateFns),
    "",
    ...privateFns.map(renderFunction),
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
      console.error("docs/sql-api.md is stale: it differs from the headers of sql/functions/*.sql; run: npm run docs:sql");
      process.exit(1);
    }
    process.exit(0);
  }
  writeFileSync(target, text);
  console.log(`wrote ${path.relative(root, target)}`);
}
