// The dashboard connected as a member of the installation's viewer role, in a
// real browser (headless Chromium): every page renders and says it is
// read-only, shows no action and no payload; a forged action POST (with the
// page's own CSRF token) is refused by the database, and nothing changes.
import pg from "pg";
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startDashboard, type Dashboard } from "../../src/dashboard/server.ts";
import { installationRoles } from "../../src/roles.ts";
import { launchBrowser, screenshot, type TestBrowser } from "../helpers/browser.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob, stateOf } from "../helpers/jobs.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";
import { claimJob } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });
let browser: TestBrowser;
let page: Page;
let viewerPool: pg.Pool;
let viewer: Dashboard;
let admin: Dashboard;
let failed: string;
const SECRET = "card 4242 4242 4242 4242";

beforeAll(async () => {
  failed = await makeJob(db.pool, { task: "charge", queue: "viewer-q", payload: { card: SECRET }, max_attempts: 1, idempotency_key: "viewer:1" });
  const attempt = await claimJob(db.pool, failed);
  await db.pool.query("SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => $3)", [
    failed,
    attempt,
    JSON.stringify({ class: "CardDeclined", message: "declined by issuer" }),
  ]);
  await db.pool.query(`SELECT * FROM idemq.schedule(name => 'viewer-nightly', cron => '0 3 * * *', task => 'report', payload => $1)`, [{ card: SECRET }]);
  await db.pool.query("SELECT idemq.set_limit(queue => 'viewer-q', concurrency => 2)");
  const role = await createLoginRole("viewer", { memberOf: [(await installationRoles(db.pool)).viewer] });
  viewerPool = new pg.Pool({ connectionString: role.urlFor(db.name), max: 2 });
  viewer = await startDashboard({ pool: viewerPool, port: 0 });
  admin = await startDashboard({ pool: db.pool, port: 0 });
  browser = await launchBrowser();
  page = await browser.newPage();
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await viewer?.close();
  await admin?.close();
  await viewerPool?.end();
  await db.drop();
  await dropLoginRoles();
});

describe("the dashboard as the viewer role", () => {
  it.each(["", "jobs", "jobs?queue=viewer-q", "schedules", "limits", "purge", "JOB"])("/%s renders (200), says it is read-only, and shows no action", async (path) => {
    const response = await page.goto(`${viewer.url}${path === "JOB" ? `jobs/${failed}` : path}`);
    expect(response?.status(), (await page.locator("main").textContent()) ?? "").toBe(200);
    expect(await page.locator("#read-only").textContent()).toBe("read-only (viewer): you can look, not act");
    // No visible action: no form that posts, no action link or button (a filter's GET form stays).
    expect(await page.locator("form[method=post]:visible, a.act:visible, button.danger:visible, form[method=post] button:visible").count()).toBe(0);
    expect(await page.locator("button:visible").evaluateAll((bs) => bs.filter((b) => b.closest("form")?.getAttribute("method") !== "get").length)).toBe(0);
    expect(await page.content()).not.toContain(SECRET);
  });

  it("the job page shows the error, not the payload", async () => {
    await page.goto(`${viewer.url}jobs/${failed}`);
    expect(await page.locator("#timeline").textContent()).toContain("declined by issuer");
    expect(await page.locator("#payload").textContent()).toBe("null");
    expect(await page.locator("#key").textContent()).toBe("viewer:1");
    // Times read relative to now, the exact instant on hover (title).
    const created = page.locator("dt:text-is('created') + dd time");
    expect(await created.textContent()).toMatch(/^(now|\d+ s ago)$/);
    const title = (await created.getAttribute("title")) ?? "";
    expect(title).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    const { rows } = await db.pool.query<{ created_at: Date }>("SELECT created_at FROM idemq.jobs WHERE id = $1", [failed]);
    expect(title).toBe(rows[0]!.created_at.toISOString());
    await screenshot(page, "dashboard-viewer-job");
  });

  it("a forged retry POST, with the page's CSRF token, is refused by the database (permission denied) and changes nothing", async () => {
    // The admin's confirm page carries the CSRF token of its own server; the viewer's confirm page carries its own (in a hidden form).
    await page.goto(`${viewer.url}jobs/${failed}/retry`);
    expect(await page.locator("#confirm").isVisible()).toBe(false);
    const csrf = await page.locator("input[name=csrf]").first().getAttribute("value");
    expect(csrf).toMatch(/^[\w-]{20,}$/);
    // The page's CSP allows the browser no fetch(): the forged POST comes from outside it.
    const response = await fetch(`${viewer.url}jobs/${failed}/retry`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: `csrf=${encodeURIComponent(csrf!)}`,
    });
    expect(response.status).toBe(403);
    expect(await response.text()).toMatch(/read-only \(viewer\): you can look, not act: the database refused this action \(permission denied for function retry/);
    expect(await stateOf(db.pool, failed)).toBe("failed");
  });

  it("connected as the admin, the same job page shows its actions and payload and no read-only line", async () => {
    await page.goto(`${admin.url}jobs/${failed}`);
    expect(await page.locator("#read-only").count()).toBe(0);
    expect(await page.locator("a.act button:visible").allTextContents()).toEqual(["retry…"]);
    expect(await page.locator("#payload").textContent()).toContain(SECRET);
  });
});
