// The dashboard in a real browser (headless Chromium, test/helpers/browser.ts)
// against a real database: the overview with a job in every state, the jobs
// list filtered, a job's timeline, a retry that a worker then runs, a task
// name with <script> shown as text, actions refused to a non-admin role, and
// the token rules. Each page is saved as a screenshot in test-artifacts/.
import { get } from "node:http";
import pg from "pg";
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { installationRoles } from "../../src/roles.ts";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { ACTIVE_STATES, TERMINAL_STATES } from "../../src/contract.ts";
import { startDashboard, type Dashboard } from "../../src/dashboard/server.ts";
import { createWorker } from "../../src/worker/create-worker.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { launchBrowser, screenshot, type TestBrowser } from "../helpers/browser.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob, stateOf } from "../helpers/jobs.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";
import { claimJob } from "../helpers/work.ts";
import { buildZoo, type Zoo } from "../helpers/zoo.ts";

const db = useTestDatabase({ poolSize: 4 });
let browser: TestBrowser;
let dashboard: Dashboard;
let zoo: Zoo;
let page: Page;
/** A job of task "charge" that failed its only attempt with a known error and stack. */
let charged: string;
const SCRIPT_TASK = `<script>window.__injected = 1</script><img src=x onerror="window.__injected = 2">`;

beforeAll(async () => {
  zoo = await buildZoo(db.pool);
  charged = await makeJob(db.pool, { task: "charge", queue: "payments", payload: { order: 42 }, max_attempts: 1, idempotency_key: "order:42" });
  const attempt = await claimJob(db.pool, charged);
  await db.pool.query("SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => $3)", [
    charged,
    attempt,
    JSON.stringify({ class: "CardDeclined", message: "card declined by issuer", stack: "CardDeclined: card declined by issuer\n    at charge (payments.ts:12)" }),
  ]);
  await makeJob(db.pool, { task: SCRIPT_TASK, queue: "hostile", payload: { html: "<b>bold</b>" } });
  await db.pool.query(`SELECT * FROM idemq.schedule(name => 'nightly-report', cron => '0 3 * * *', task => 'report', timezone => 'Europe/Paris')`);
  dashboard = await startDashboard({ pool: db.pool, port: 0 });
  browser = await launchBrowser();
  page = await browser.newPage();
  page.on("dialog", (dialog) => void dialog.dismiss());
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await dashboard?.close();
  await db.drop();
  await dropLoginRoles();
});

/** The cells of the overview's row for `queue` (its first cell). */
async function cells(queue: string): Promise<string[]> {
  const rows = await page.locator("#queues tr").evaluateAll((trs) => trs.map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent ?? "")));
  const found = rows.filter((r) => r[0] === queue);
  expect(found, `one overview row for ${queue}`).toHaveLength(1);
  return found[0]!;
}

describe("dashboard pages", () => {
  it("the overview counts a job in every state: active ones per queue and task, finished ones in the totals", async () => {
    const response = await page.goto(dashboard.url);
    expect(response?.status()).toBe(200);
    for (const state of ACTIVE_STATES) {
      const row = await cells(zoo[state].queue);
      // queue, task, then one column per active state.
      expect(row[2 + ACTIVE_STATES.indexOf(state)], `${state} in ${zoo[state].queue}`).toBe("1");
    }
    expect(await cells(zoo.leaseExpired.queue).then((r) => r[6])).toBe("1"); // lease expired
    // The zoo's terminal jobs plus the failed charge job.
    const totals = await page.locator("#totals td").allTextContents();
    expect(totals).toEqual(TERMINAL_STATES.map((s) => (s === "failed" ? "2" : "1")));
    expect(await cells("payments")).toContain("100.0 %"); // its one finish in the window failed
    await screenshot(page, "dashboard-overview");
  });

  it("the jobs list filters by state and by text in the error, and says how many match", async () => {
    await page.goto(`${dashboard.url}jobs`);
    await page.check("input[name=state][value=failed]");
    await page.click("#filter");
    await expect.poll(() => page.locator("#count").textContent()).toBe("Jobs 1-2 of 2.");
    await page.fill("input[name=error]", "DECLINED BY");
    await page.click("#filter");
    await expect.poll(() => page.locator("#count").textContent()).toBe("Jobs 1-1 of 1.");
    expect(await page.locator("#jobs tr td:nth-child(2)").allTextContents()).toEqual([charged]);
    expect(new URL(page.url()).searchParams.get("error")).toBe("DECLINED BY");
    await page.goto(`${dashboard.url}jobs`);
    await screenshot(page, "dashboard-jobs");
  });

  it("a job's page shows its attempt timeline: claimed at, worker, duration, outcome, error and stack; payload and key", async () => {
    await page.goto(`${dashboard.url}jobs?error=declined`);
    await page.click(`#jobs a:text-is("${charged}")`);
    expect(new URL(page.url()).pathname).toBe(`/jobs/${charged}`);
    const attempt = await page.locator("#timeline tr").nth(1).locator("td").allTextContents();
    expect(attempt[0]).toBe("1");
    // Rows are numbered by claim; every claim of this job counted, so no note says otherwise.
    expect(await page.locator("#timeline th").first().textContent()).toBe("claim");
    expect(await page.locator("#claim-numbers").count()).toBe(0);
    // Claimed moments ago (relative to now), the exact instant on hover.
    expect(attempt[1]).toMatch(/^(now|\d+ s ago|\d+ min ago)$/);
    expect(await page.locator("#timeline tr").nth(1).locator("td time").getAttribute("title")).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
    expect(attempt[2]).toBe("test-worker");
    expect(attempt[3]).toMatch(/ms|s$/);
    expect(attempt[4]).toBe("failed CardDeclined");
    expect(attempt[5]).toContain("card declined by issuer");
    expect(await page.locator("#timeline details pre").textContent()).toContain("at charge (payments.ts:12)");
    expect(JSON.parse((await page.locator("#payload").textContent())!)).toEqual({ order: 42 });
    expect(await page.locator("#key").textContent()).toBe("order:42");
    await screenshot(page, "dashboard-job");
  });

  it("retry, confirmed, puts a failed job back; a worker runs it and the timeline shows the run", async () => {
    await page.goto(`${dashboard.url}jobs/${charged}`);
    await page.click("text=retry…");
    expect(new URL(page.url()).pathname).toBe(`/jobs/${charged}/retry`);
    expect(await stateOf(db.pool, charged)).toBe("failed"); // the confirm page changes nothing
    await page.click("#confirm");
    expect(await page.locator("#notice").textContent()).toBe("retried: now enqueued");
    const worker = createWorker({ connectionString: db.url, queues: ["payments"], handleSignals: false, tasks: { charge: async () => ({ charged: true }) } });
    await worker.start();
    try {
      await waitFor(async () => (await stateOf(db.pool, charged)) === "succeeded", { what: "the retried job to succeed" });
    } finally {
      await worker.stop();
    }
    await page.reload();
    expect(await page.locator("#state").textContent()).toBe("succeeded");
    const outcomes = await page.locator("#timeline tr td:nth-child(5)").allTextContents();
    expect(outcomes).toEqual(["failed CardDeclined", "retried", "succeeded"]);
    expect(JSON.parse((await page.locator("#result").textContent())!)).toEqual({ charged: true });
  });

  it("a task name with <script> renders as text, in the list and on the job's page", async () => {
    await page.goto(`${dashboard.url}jobs?queue=hostile`);
    expect(await page.locator("#jobs tr td:nth-child(4)").allTextContents()).toEqual([SCRIPT_TASK]);
    await page.click("#jobs tr td:nth-child(2) a");
    expect(await page.locator("#task").textContent()).toBe(SCRIPT_TASK);
    expect(await page.evaluate(() => (window as { __injected?: number }).__injected)).toBeUndefined();
    expect(await page.locator("main script, main img").count()).toBe(0);
  });

  it("the schedules page lists each schedule with its next slot", async () => {
    await page.goto(`${dashboard.url}schedules`);
    const row = await page.locator('#schedules tr:has(td:text-is("nightly-report")) td').allTextContents();
    expect(row.slice(0, 5)).toEqual(["nightly-report", "0 3 * * *", "Europe/Paris", "report", "default"]);
    await screenshot(page, "dashboard-schedules");
  });

  it("cancel and reschedule, each confirmed, act through their SQL functions", async () => {
    await page.goto(`${dashboard.url}jobs/${zoo.processing.id}`);
    await page.click("text=cancel…");
    await page.click("#confirm");
    expect(await page.locator("#notice").textContent()).toBe("cancelled: now cancelled");
    expect(await stateOf(db.pool, zoo.processing.id)).toBe("cancelled");

    await page.goto(`${dashboard.url}jobs/${zoo.scheduled.id}/reschedule`);
    await page.fill("input[name=run_at]", "2030-01-01T00:00:00Z");
    await page.click("#confirm");
    expect(await page.locator("#notice").textContent()).toBe("rescheduled to 2030-01-01T00:00:00.000Z: now scheduled");
    const { rows } = await db.pool.query<{ run_at: Date }>("SELECT run_at FROM idemq.jobs WHERE id = $1", [zoo.scheduled.id]);
    expect(rows[0]!.run_at.toISOString()).toBe("2030-01-01T00:00:00.000Z");
  });

  it("purge shows what it will delete, and deletes only once confirmed", async () => {
    await page.goto(`${dashboard.url}purge`);
    await page.uncheck("input[name=state][value=succeeded]");
    await page.check("input[name=state][value=expired]");
    await page.fill("input[name=amount]", "0");
    await page.selectOption("select[name=unit]", "minutes");
    await page.click("text=Review…");
    expect(await page.locator("main p").first().textContent()).toContain("finished more than 0 minutes ago");
    expect(await stateOf(db.pool, zoo.expired.id)).toBe("expired"); // the review changes nothing
    await page.click("#confirm");
    expect(await page.locator("#notice").textContent()).toBe("purged 1 job(s)");
    expect(await stateOf(db.pool, zoo.expired.id)).toBeUndefined();
  });

  it("a POST without the page's CSRF token is refused and changes nothing", async () => {
    const response = await fetch(`${dashboard.url}jobs/${zoo.enqueued.id}/cancel`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: "csrf=forged",
    });
    expect(response.status).toBe(400);
    expect(await response.text()).toContain("CSRF token is missing or stale");
    expect(await stateOf(db.pool, zoo.enqueued.id)).toBe("enqueued");
  });
});

describe("dashboard security", () => {
  it("actions fail for a role that is not the installation's admin, with a message naming the role it needs", async () => {
    const role = await createLoginRole("dash", { memberOf: [(await installationRoles(db.pool)).worker] });
    // Enough to read the job's page, not to act on it.
    await db.pool.query(`GRANT SELECT ON idemq.jobs, idemq.keys, idemq.job_dependencies TO ${role.name}`);
    const pool = new pg.Pool({ connectionString: role.urlFor(db.name), max: 2 });
    const limited = await startDashboard({ pool, port: 0 });
    try {
      await page.goto(`${limited.url}jobs/${zoo.cancelled.id}/retry`);
      await page.click("#confirm");
      expect(await page.locator("#error").textContent()).toMatch(/permission denied for function retry.*needs this installation's admin role/);
      expect(await stateOf(db.pool, zoo.cancelled.id)).toBe("cancelled");
    } finally {
      await limited.close();
      await pool.end();
      await db.pool.query(`REVOKE ALL ON idemq.jobs, idemq.keys, idemq.job_dependencies FROM ${role.name}`);
    }
  });

  it("the 403 page's hint is a real command: run as it says, it lets the same role retry the job", async () => {
    const role = await createLoginRole("dashgrant", { memberOf: [(await installationRoles(db.pool)).worker] });
    await db.pool.query(`GRANT SELECT ON idemq.jobs, idemq.keys, idemq.job_dependencies TO ${role.name}`);
    const pool = new pg.Pool({ connectionString: role.urlFor(db.name), max: 2 });
    const limited = await startDashboard({ pool, port: 0 });
    try {
      await page.goto(`${limited.url}jobs/${zoo.failed.id}/retry`);
      await page.click("#confirm");
      const error = (await page.locator("#error").textContent()) ?? "";
      const hinted = /`(idemq [^`]+)`, ROLE being the role it connects as\.$/.exec(error)?.[1];
      expect(hinted, error).toBe("idemq roles grant ROLE --admin");
      const granted = await runCli([...hinted!.replace("ROLE", role.name).split(" ").slice(1), "--database-url", db.url]);
      expect(granted, hinted).toMatchObject({ code: EXIT.OK, stdout: `Granted ${(await installationRoles(db.pool)).admin} to ${role.name}.\n`, stderr: "" });
      await page.goto(`${limited.url}jobs/${zoo.failed.id}/retry`);
      await page.click("#confirm");
      expect(await page.locator("#notice").textContent()).toBe("retried: now enqueued");
    } finally {
      await limited.close();
      await pool.end();
      await db.pool.query(`REVOKE ALL ON idemq.jobs, idemq.keys, idemq.job_dependencies FROM ${role.name}`);
    }
  });

  it("with a token, a request without it gets 401; ?token= sets a cookie and leaves the address; a wrong token stays out", async () => {
    const token = "t".repeat(12) + "0123456789";
    const guarded = await startDashboard({ pool: db.pool, port: 0, token });
    try {
      expect((await fetch(guarded.url)).status).toBe(401);
      expect((await fetch(`${guarded.url}?token=${"x".repeat(token.length)}`)).status).toBe(401);
      expect((await fetch(guarded.url, { headers: { authorization: `Bearer ${token}` } })).status).toBe(200);
      const fresh = await browser.newPage();
      await fresh.goto(`${guarded.url}jobs?token=${token}&state=failed`);
      expect(new URL(fresh.url()).search).toBe("?state=failed");
      expect(await fresh.locator("h1").textContent()).toBe("Jobs");
      await fresh.close();
    } finally {
      await guarded.close();
    }
  });

  it("without a token, a request naming another host (DNS rebinding) gets 421", async () => {
    const status = (host: string) =>
      new Promise<number>((resolve, reject) => {
        get({ hostname: "127.0.0.1", port: dashboard.port, path: "/", headers: { host } }, (res) => {
          res.resume();
          resolve(res.statusCode!);
        }).on("error", reject);
      });
    expect(await status(`evil.example:${dashboard.port}`)).toBe(421);
    expect(await status(`localhost:${dashboard.port}`)).toBe(200);
    expect(await status(`127.0.0.1:${dashboard.port}`)).toBe(200);
  });

  it("a bind beyond loopback without a token is refused before listening", async () => {
    await expect(startDashboard({ pool: db.pool, port: 0, host: "0.0.0.0" })).rejects.toThrow(
      "binding 0.0.0.0 (not loopback) needs an auth token: pass --token TOKEN or set IDEMQ_DASHBOARD_TOKEN",
    );
  });
});
