// One attempt count for a job, wherever it is shown: the dashboard's jobs list
// and job page (over HTTP) and the CLI's `idemq jobs` and `jobs show` (a real
// subprocess) all show Job.countedAttempts of Job.attemptLimit. The dashboard
// showed attempt/max_attempts: 1/10 for a job whose task allowed one attempt
// (the CLI: 1/1), and claims that do not count (a snooze, the attempts before
// an operator's retry) as if they did.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { startDashboard, type Dashboard } from "../../src/dashboard/server.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueue, stateOf, unique } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 4 });
let dashboard: Dashboard;

beforeAll(async () => {
  dashboard = await startDashboard({ pool: db.pool, port: 0 });
});
afterAll(async () => {
  await dashboard?.close();
});

async function claim(queue: string): Promise<number> {
  const { rows } = await db.pool.query<{ attempt: number }>("SELECT attempt FROM idemq.claim(worker_id => 'w', queues => ARRAY[$1])", [queue]);
  expect(rows).toHaveLength(1);
  return rows[0]!.attempt;
}

async function fail(id: string, attempt: number, taskLimit?: number): Promise<void> {
  await db.pool.query(
    `SELECT idemq.fail(job_id => $1, attempt => $2, error => '{"class": "E", "message": "no"}', max_attempts => $3)`,
    [id, attempt, taskLimit ?? null],
  );
}

async function page(path: string): Promise<string> {
  const response = await fetch(new URL(path, dashboard.url));
  expect(response.status, path).toBe(200);
  return response.text();
}

const unescape = (html: string) => html.replaceAll("&#39;", "'").replaceAll("&quot;", '"').replaceAll("&lt;", "<").replaceAll("&gt;", ">").replaceAll("&amp;", "&");

/** The attempt count as each view shows it. */
async function shown(id: string, queue: string) {
  const list = await page(`/jobs?queue=${encodeURIComponent(queue)}`);
  const cell = new RegExp(`<a href="/jobs/${id}">${id}</a>.*?<td class="n">([^<]*)</td>`, "s").exec(list)?.[1];
  const jobPage = await page(`/jobs/${id}`);
  const dd = /<dd id="attempts">([^<]*)<\/dd>/.exec(jobPage)?.[1];

  const table = await runCli(["jobs", "--queue", queue, "--database-url", db.url]);
  expect(table, "idemq jobs").toMatchObject({ code: EXIT.OK, stderr: "" });
  const [header, row] = table.stdout.trimEnd().split("\n");
  const show = await runCli(["jobs", "show", id, "--database-url", db.url]);
  expect(show, "idemq jobs show").toMatchObject({ code: EXIT.OK, stderr: "" });
  return {
    dashboardList: cell,
    dashboardJob: dd === undefined ? undefined : unescape(dd),
    cliList: row!.slice(header!.indexOf("ATTEMPT")).split(/\s+/)[0],
    cliShow: show.stdout.split("\n").find((line) => line.startsWith("  attempts   "))?.slice("  attempts   ".length),
  };
}

describe("the attempt count, the same in the dashboard and the CLI", () => {
  it("a task that allows one attempt (fail's max_attempts 1) on a job of the default 10: 1/1 everywhere", async () => {
    const queue = unique("q");
    const { job_id: id } = await enqueue(db.pool, { task: "once", queue });
    await fail(id, await claim(queue), 1);
    expect(await stateOf(db.pool, id)).toBe("failed");
    expect(await shown(id, queue)).toEqual({
      dashboardList: "1/1",
      dashboardJob: "1 of 1 (the task's limit; the job's own is 10)",
      cliList: "1/1",
      cliShow: "1 of 1 (the task's limit; the job's own is 10)",
    });
  });

  it("a job of max_attempts 1, failed and retried by an operator: 0/1 everywhere (the attempt before the retry does not count)", async () => {
    const queue = unique("q");
    const { job_id: id } = await enqueue(db.pool, { task: "once", queue, max_attempts: 1 });
    await fail(id, await claim(queue));
    expect(await stateOf(db.pool, id)).toBe("failed");
    expect(await shown(id, queue)).toMatchObject({ dashboardList: "1/1", cliList: "1/1", dashboardJob: "1 of 1", cliShow: "1 of 1" });
    await db.pool.query("SELECT idemq.retry(job_id => $1)", [id]);
    const note = "0 of 1 (1 claim; 1 not counted: snoozes, hand-backs, attempts before a retry)";
    expect(await shown(id, queue)).toEqual({ dashboardList: "0/1", dashboardJob: note, cliList: "0/1", cliShow: note });
    // The page's Attempts table numbers its rows by claim, and says so where claims and attempts differ.
    const jobPage = await page(`/jobs/${id}`);
    expect(jobPage).toContain("<th>claim</th>");
    expect(jobPage).toContain("Numbered by claim: 1 of 1 claim did not count as an attempt");
  });

  it("a snoozed attempt does not count: 0/3 everywhere", async () => {
    const queue = unique("q");
    const { job_id: id } = await enqueue(db.pool, { task: "waits", queue, max_attempts: 3 });
    const attempt = await claim(queue);
    await db.pool.query("SELECT idemq.snooze(job_id => $1, attempt => $2, run_at => now() + interval '1 hour')", [id, attempt]);
    const note = "0 of 3 (1 claim; 1 not counted: snoozes, hand-backs, attempts before a retry)";
    expect(await shown(id, queue)).toEqual({ dashboardList: "0/3", dashboardJob: note, cliList: "0/3", cliShow: note });
  });
});
