// docs/sql-api.md is generated from the headers of sql/functions/FAMILY/*.sql
// (scripts/sql-docs.mjs); this test fails when it is stale, so the reference
// never drifts from the functions it documents. docs/design.md, the contract,
// is written by hand: its SQL signatures and the functions and parameters it
// names are checked against the migrated catalog, so it cannot drift either.
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { beforeAll, describe, expect, it } from "vitest";
import { functionPaths } from "../../scripts/migration-new.mjs";
import { useTestDatabase } from "../helpers/db.ts";
import { splitSqlList } from "../helpers/split-sql-list.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const run = promisify(execFile);
// sql/functions/FAMILY/NAME.sql: name -> FAMILY/NAME.sql.
const FUNCTION_FILES = new Map(functionPaths(join(ROOT, "sql", "functions")).map((f) => [f.name, f.file]));

describe("docs/sql-api.md", () => {
  it("is up to date with the function headers (regenerate with: npm run docs:sql)", async () => {
    const result = await run(process.execPath, ["scripts/sql-docs.mjs", "--check"], { cwd: ROOT }).then(
      () => ({ ok: true, stderr: "" }),
      (error: { stderr?: string }) => ({ ok: false, stderr: error.stderr ?? String(error) }),
    );
    expect(result.ok, `docs/sql-api.md is stale: run \`npm run docs:sql\` and commit it.\n${result.stderr}`).toBe(true);
  });

  it("documents every function file, public functions before private helpers", () => {
    const doc = readFileSync(join(ROOT, "docs", "sql-api.md"), "utf8");
    const names = [...FUNCTION_FILES.keys()];
    expect(names.length).toBeGreaterThan(90);
    const headings = [...doc.matchAll(/^### idemq\.(\w+)$/gm)].map((m) => m[1]!);
    expect([...headings].sort()).toEqual([...names].sort());
    const firstPrivate = headings.findIndex((h) => h.startsWith("_"));
    expect(firstPrivate).toBeGreaterThan(0);
    expect(headings.slice(firstPrivate).every((h) => h.startsWith("_")), "private helpers come last").toBe(true);
    expect(doc.indexOf("## Public functions")).toBeLessThan(doc.indexOf("## Private helpers"));
  });

  it("keeps a Markdown table in a header as written: the duplicate-policy matrix, row by row, as in docs/design.md", () => {
    const doc = readFileSync(join(ROOT, "docs", "sql-api.md"), "utf8");
    const design = readFileSync(join(ROOT, "docs", "design.md"), "utf8");
    const matrix = (text: string) => text.split("\n").filter((l) => /^\| (policy|`(allow|reject)_\w+`)/.test(l) || l === "|---|---|---|---|");
    const rows = matrix(doc.slice(doc.indexOf("### idemq._policy_rejects")));
    expect(rows).toHaveLength(6);
    expect(rows).toEqual(matrix(design));
    expect(doc).toContain("\n\n| policy | succeeded | failed | expired / cancelled |\n|---|---|---|---|\n");
  });

  it("gives each function its Guarantees, Concurrency, Errors and Tests", () => {
    const doc = readFileSync(join(ROOT, "docs", "sql-api.md"), "utf8");
    const sections = doc.split(/^### /m).slice(1);
    for (const section of sections) {
      const name = section.split("\n")[0];
      for (const label of ["Guarantees", "Concurrency", "Errors", "Tests"]) {
        expect(section, `${name}: ${label}`).toMatch(new RegExp(`\\*\\*${label}[^*]*:\\*\\*`));
      }
    }
  });
});

describe("docs/sql-api.md: what each function returns", () => {
  const db = useTestDatabase({ poolSize: 1 });

  it("lists every column of every function's rows, in order, as the migrated catalog has them (composite types expanded)", async () => {
    // The output columns: OUT and TABLE parameters, else a composite result type's attributes; none for a scalar.
    const { rows } = await db.pool.query<{ name: string; columns: string[] }>(`
      SELECT p.proname AS name,
             CASE WHEN p.proargmodes IS NOT NULL AND p.proargmodes::text[] && ARRAY['o', 'b', 't']
                  THEN array(SELECT n FROM unnest(p.proargnames, p.proargmodes::text[]) WITH ORDINALITY u(n, m, i)
                             WHERE m IN ('o', 'b', 't') ORDER BY i)
                  ELSE array(SELECT a.attname::text FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
                             WHERE t.oid = p.prorettype AND t.typtype = 'c' AND a.attnum > 0 AND NOT a.attisdropped
                             ORDER BY a.attnum)
             END AS columns
      FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace`);
    const doc = readFileSync(join(ROOT, "docs", "sql-api.md"), "utf8");
    const sections = new Map(doc.split(/^### idemq\./m).slice(1).map((s) => [s.slice(0, s.indexOf("\n")), s]));
    expect(rows.length).toBeGreaterThan(50);
    let withRows = 0;
    for (const { name, columns } of rows) {
      const line = /^\*\*Returns:\*\* .*$/m.exec(sections.get(name) ?? "")?.[0];
      expect(line, `docs/sql-api.md: idemq.${name} has a **Returns:** line`).toBeDefined();
      const listed = line!.includes(" with the columns ") ? [...line!.split(" with the columns ")[1]!.matchAll(/`(\w+)` /g)].map((m) => m[1]) : [];
      expect(listed, `docs/sql-api.md: the columns idemq.${name} returns`).toEqual(columns);
      if (columns.length > 0) withRows++;
    }
    // claim's rows (idemq.claimed_job) among them: a job's id named job_id as in enqueue's, appended after
    // id (its 0.1.0 name, kept for 0.1.0 consumers).
    expect(withRows).toBeGreaterThan(15);
    expect(sections.get("claim")).toMatch(/^\*\*Returns:\*\* rows of `idemq\.claimed_job`, with the columns `id` bigint, `task` text, .*, `lease_token` uuid, `job_id` bigint, `timeout` interval, `concurrency_key` text\.$/m);
  });
});

/** A function as the catalog has it: its input parameters and what it returns. */
interface CatalogFunction {
  names: string[];
  types: string[];
  result: string;
}

/**
 * The SQL calls docs/design.md writes as code spans, `name(args)` or
 * `idemq.name(args)`, outside its TypeScript section (where `snooze(duration)`
 * is a ctx method) and outside fenced blocks.
 */
function designCalls(): { span: string; name: string; args: string; returns: string | undefined }[] {
  const doc = readFileSync(join(ROOT, "docs", "design.md"), "utf8");
  const [before, rest] = doc.split(/^## TypeScript API$/m);
  expect(rest, 'docs/design.md has a "## TypeScript API" section').toBeDefined();
  const after = rest!.slice(rest!.search(/^## /m));
  const text = (before! + after).replace(/^```[^\n]*\n[\s\S]*?^```$/gm, "");
  const calls = [];
  // A code span is delimited by backtick runs of equal length (CommonMark).
  for (const m of text.matchAll(/(`+)(?!`)([\s\S]*?[^`])\1(?!`)/g)) {
    const span = m[2]!.replace(/\s+/g, " ").trim();
    const call = /^(?:idemq\.)?([a-z_][a-z0-9_]*)\((.*?)\)(?: RETURNS (.+))?$/.exec(span);
    if (call) calls.push({ span, name: call[1]!, args: call[2]!, returns: call[3] });
  }
  return calls;
}

/** The doc's SQL type spelling as format_type() prints it. */
function catalogType(type: string): string {
  return type
    .replace(/\bint\b/g, "integer")
    .replace(/\btimestamptz\b/g, "timestamp with time zone")
    .replace(/\s+/g, " ")
    .trim();
}

describe("docs/design.md", () => {
  const db = useTestDatabase({ poolSize: 1 });
  const catalog = new Map<string, CatalogFunction>();
  beforeAll(async () => {
    const { rows } = await db.pool.query<{ name: string; arg_names: string[]; modes: string[] | null; types: string[]; result: string }>(`
      SELECT p.proname AS name, coalesce(p.proargnames, '{}') AS arg_names, p.proargmodes::text[] AS modes,
             array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) WITH ORDINALITY u(t, i) ORDER BY i) AS types,
             pg_get_function_result(p.oid) AS result
      FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace`);
    for (const r of rows) {
      // Input parameters only: RETURNS TABLE columns are arguments of mode 't'.
      const names = r.arg_names.filter((_, i) => r.modes === null || ["i", "b", "v"].includes(r.modes[i]!));
      catalog.set(r.name, { names, types: r.types, result: r.result });
    }
  });

  it("names only SQL functions that exist, each with a file in sql/functions/<family>/", () => {
    const calls = designCalls();
    expect(calls.length, "SQL calls found in docs/design.md").toBeGreaterThan(20);
    for (const { span, name } of calls) {
      expect(FUNCTION_FILES.has(name), `docs/design.md: \`${span}\` names no file sql/functions/<family>/${name}.sql`).toBe(true);
      expect(catalog.has(name), `docs/design.md: \`${span}\`: no function idemq.${name} after migrating`).toBe(true);
    }
  });

  it("names only parameters the functions have", () => {
    for (const { span, name, args } of designCalls()) {
      const fn = catalog.get(name);
      if (fn === undefined) continue; // reported by the test above
      for (const arg of splitSqlList(args)) {
        if (arg === "...") continue;
        const param = /^[a-z_][a-z0-9_]*/.exec(arg)?.[0];
        expect(param, `docs/design.md: \`${span}\`: "${arg}" is not a parameter name`).toBeDefined();
        expect(fn.names, `docs/design.md: \`${span}\`: idemq.${name} has no parameter ${param} (it has: ${fn.names.join(", ")})`).toContain(param);
      }
    }
  });

  it("gives full signatures exactly as the catalog has them: every parameter, in order, with its type, and the result", () => {
    let checked = 0;
    for (const { span, name, args, returns } of designCalls()) {
      const fn = catalog.get(name);
      const parts = splitSqlList(args);
      // A full signature types its first parameter (`key text`); `guard(key, task)` and `claim(..., tasks)` only name some.
      const typed = parts.length > 0 && /^[a-z_][a-z0-9_]* (?!DEFAULT\b)\S/.test(parts[0]!);
      if (fn === undefined || !(typed || (parts.length === 0 && returns !== undefined))) continue;
      const params = parts.map((p) => /^([a-z_][a-z0-9_]*) (.+?)(?: DEFAULT .*)?$/.exec(p));
      expect(params.map((p) => p?.[1]), `docs/design.md: \`${span}\`: parameters`).toEqual(fn.names);
      expect(params.map((p) => catalogType(p?.[2] ?? "")), `docs/design.md: \`${span}\`: parameter types`).toEqual(fn.types);
      if (returns !== undefined) expect(catalogType(returns), `docs/design.md: \`${span}\`: result`).toBe(fn.result);
      checked++;
    }
    expect(checked, "full signatures checked").toBeGreaterThan(10);
  });
});

// The metrics a user can scrape are listed twice for readers: by name in the
// README, with type, labels and meaning in docs/worker.md. Both lists are held
// equal to the names the two collectors register (no database is reached:
// collectDatabaseMetrics reads stats() only when scraped).
describe("the metrics lists (README.md, docs/worker.md)", () => {
  it("name exactly the metrics collectWorkerMetrics and collectDatabaseMetrics register", async () => {
    const { collectDatabaseMetrics, collectWorkerMetrics, createWorker } = await import("../../src/index.ts");
    const worker = createWorker({ connectionString: "postgres://unused@127.0.0.1:1/x", tasks: { ok: async () => {} }, handleSignals: false });
    const { Registry } = await import("prom-client");
    const registry = new Registry();
    const workerMetrics = await collectWorkerMetrics(worker, { registry });
    const databaseMetrics = await collectDatabaseMetrics({ connectionString: "postgres://unused@127.0.0.1:1/x", registry });
    const registered = registry.getMetricsAsArray().map((m) => m.name).sort();
    await databaseMetrics.close();
    await workerMetrics.close();
    await worker.stop();
    expect(registered.length).toBeGreaterThan(20);

    const workerMd = readFileSync(join(ROOT, "docs", "worker.md"), "utf8");
    const section = workerMd.slice(workerMd.indexOf("\n## Metrics\n"), workerMd.indexOf("\n## Tracing\n"));
    const documented = [...section.matchAll(/^\| `(idemq_\w+)` \|/gm)].map((m) => m[1]!).sort();
    expect(documented).toEqual(registered);

    const readme = readFileSync(join(ROOT, "README.md"), "utf8");
    const metricsSection = readme.slice(readme.indexOf("\n## Metrics\n"), readme.indexOf("\n## Dashboard\n"));
    const listed = [...new Set([...metricsSection.matchAll(/`(idemq_\w+)`/g)].map((m) => m[1]!))].sort();
    expect(listed).toEqual(registered);
  });
});
