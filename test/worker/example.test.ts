// examples/worker.js (the worker example in docs/worker.md) runs as written,
// with plain node, against a migrated database and prints what it promises.
import { execFile } from "node:child_process";
import { resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase, type TestDatabase } from "../helpers/db.ts";

let db: TestDatabase;

beforeAll(async () => {
  db = await freshDatabase({ poolSize: 1 });
});
afterAll(async () => {
  await db?.drop();
});

describe("examples/worker.js", () => {
  it("runs to the end: one ledger row per order for three credit deliveries, one email for two receipt jobs", async () => {
    const root = resolve(import.meta.dirname, "..", "..");
    const result = await new Promise<{ code: number; stdout: string; stderr: string }>((done) => {
      execFile(
        process.execPath,
        ["examples/worker.js"],
        { cwd: root, env: { ...process.env, DATABASE_URL: db.url }, timeout: 60_000 },
        (error, stdout, stderr) => done({ code: error ? Number(error.code ?? 1) : 0, stdout, stderr }),
      );
    });
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("ledger rows: 2 (three credit deliveries for two orders)");
    expect(result.stdout).toContain("emails sent: 1 (two receipt jobs for one order)");
    expect(result.stdout).toMatch(/^duplicate +credit#\d+ attempt 1$/m);
    expect(result.stdout).toMatch(/^failed +send_receipt#\d+ attempt 1: not an email address: nobody$/m);
    expect(result.stdout).toMatch(/^retry +flaky_report#\d+ attempt 1: the report service timed out$/m);
    expect(result.stdout).toMatch(/^success +flaky_report#\d+ attempt 2$/m);
  });
});
