// examples/sql-only.sql is a psql session a reader can run as is: it must run
// without error on a freshly migrated database and show what its comments say.
import { execFile } from "node:child_process";
import { resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase, type TestDatabase } from "../helpers/db.ts";

const run = promisify(execFile);
const EXAMPLE = resolve(import.meta.dirname, "..", "..", "examples", "sql-only.sql");

let db: TestDatabase;
beforeAll(async () => {
  db = await freshDatabase({ poolSize: 2 });
});
afterAll(async () => {
  await db?.drop();
});

/** The cells of the first row of the nth table printed after the line `== <step>`, keyed by column. */
function rowAfter(output: string, step: string, nth = 0): Record<string, string> {
  const lines = output.split(`== ${step}`)[1]!.split("\n== ")[0]!.split("\n");
  const rules = lines.flatMap((line, i) => (/^-+(\+-+)*$/.test(line) ? [i] : []));
  const rule = rules[nth];
  if (rule === undefined) throw new Error(`no table ${nth} after "== ${step}" in:\n${lines.join("\n")}`);
  const cells = (line: string) => line.split("|").map((c) => c.trim());
  const header = cells(lines[rule - 1]!);
  return Object.fromEntries(header.map((h, i) => [h, cells(lines[rule + 1]!)[i] ?? ""]));
}

describe("examples/sql-only.sql", () => {
  it("runs with psql -v ON_ERROR_STOP=1 -f on a fresh database and shows enqueue, dedupe, claim, complete, fail-retry, stats", async () => {
    const { stdout } = await run("psql", ["-X", "-v", "ON_ERROR_STOP=1", "-f", EXAMPLE, db.url]);

    expect(stdout).toMatch(/^enqueued job \d+$/m);
    expect(rowAfter(stdout, "2.")).toEqual({ same_job: "t", deduplicated: "t" });
    expect(rowAfter(stdout, "3.")).toMatchObject({ task: "send_invoice", state: "processing", attempt: "1", locked_by: "psql-worker" });
    expect(rowAfter(stdout, "4.", 0)).toEqual({ go_ahead: "t" });
    expect(rowAfter(stdout, "4.", 2)).toMatchObject({ state: "succeeded", result: '{"sent": true}' });
    expect(rowAfter(stdout, "5.", 0)).toEqual({ state_after_failure: "scheduled" });
    expect(stdout).toMatch(/^claimed again: attempt 2$/m);
    expect(rowAfter(stdout, "5.", 2)).toMatchObject({ state: "succeeded", attempt: "2", errors: "1", first_error: "CardDeclined" });

    const stats = stdout.split("== 6.")[1]!;
    expect(stats).toMatch(/example\s*\|\s*charge_card\s*\|\s*succeeded\s*\|\s*1\b/);
    expect(stats).toMatch(/example\s*\|\s*send_invoice\s*\|\s*succeeded\s*\|\s*1\b/);
    expect(stats).toMatch(/^\s*\|\s*send_invoice\s*\|\s*deduplicated\s*\|\s*1\b/m);
  });

  it("left the database in the state its output shows: 2 succeeded jobs, one guard row, one key", async () => {
    const { rows } = await db.pool.query(`
      SELECT (SELECT count(*) FROM idemq.jobs WHERE state = 'succeeded')::int AS succeeded,
             (SELECT count(*) FROM idemq.jobs)::int AS jobs,
             (SELECT count(*) FROM idemq.processed WHERE key = 'invoice-email:42')::int AS guards,
             (SELECT count(*) FROM idemq.keys WHERE key = 'invoice:42' AND finished_state = 'succeeded')::int AS keys`);
    expect(rows[0]).toEqual({ succeeded: 2, jobs: 2, guards: 1, keys: 1 });
  });

  it("a failing statement stops the session with a non-zero exit (ON_ERROR_STOP), so the test above cannot pass on a broken example", async () => {
    const failure = await run("psql", ["-X", "-v", "ON_ERROR_STOP=1", "-c", "SELECT idemq.cancel(job_id => 987654321)", db.url]).then(
      () => undefined,
      (error: { code?: number; stderr?: string }) => error,
    );
    expect(failure?.code).toBe(1);
    expect(failure?.stderr).toMatch(/job 987654321 does not exist/);
  });
});
