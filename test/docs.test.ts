// docs/sql-api.md is generated from the headers of sql/functions/*.sql
// (scripts/sql-docs.mjs); this test fails when it is stale, so the reference
// never drifts from the functions it documents.
import { execFile } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const ROOT = resolve(import.meta.dirname, "..");
const run = promisify(execFile);

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
    const names = readdirSync(join(ROOT, "sql", "functions"))
      .filter((f) => f.endsWith(".sql"))
      .map((f) => f.slice(0, -4));
    const headings = [...doc.matchAll(/^### idemq\.(\w+)$/gm)].map((m) => m[1]!);
    expect([...headings].sort()).toEqual([...names].sort());
    const firstPrivate = headings.findIndex((h) => h.startsWith("_"));
    expect(firstPrivate).toBeGreaterThan(0);
    expect(headings.slice(firstPrivate).every((h) => h.startsWith("_")), "private helpers come last").toBe(true);
    expect(doc.indexOf("## Public functions")).toBeLessThan(doc.indexOf("## Private helpers"));
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
