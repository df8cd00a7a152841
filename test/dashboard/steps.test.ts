// The dashboard's job page of a job with durable steps and children, in a real
// browser (headless Chromium): its step ledger (steps, sleeps, event waits,
// times relative via <time>) and the children it spawned with their outcomes,
// every name and result shown as text (user data, escaped); as the viewer
// role, the page still renders, with its children and one line where the
// steps would be (steps() is the worker's and admin's).
import pg from "pg";
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startDashboard, type Dashboard } from "../../src/dashboard/server.ts";
import { installationRoles } from "../../src/roles.ts";
import { launchBrowser, screenshot, type TestBrowser } from "../helpers/browser.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { jobIn } from "../helpers/work.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";
import { MARKUP, workflowJob, type WorkflowJob } from "../helpers/workflow.ts";

const db = useTestDatabase({ poolSize: 4 });
let browser: TestBrowser;
let page: Page;
let admin: Dashboard;
let viewer: Dashboard;
let viewerPool: pg.Pool;
let job: WorkflowJob;
const dialogs: string[] = [];

beforeAll(async () => {
  job = await workflowJob(db.pool);
  const role = await createLoginRole("viewer", { memberOf: [(await installationRoles(db.pool)).viewer] });
  viewerPool = new pg.Pool({ connectionString: role.urlFor(db.name), max: 2 });
  admin = await startDashboard({ pool: db.pool, port: 0 });
  viewer = await startDashboard({ pool: viewerPool, port: 0 });
  browser = await launchBrowser();
  page = await browser.newPage();
  // An unescaped <script> from a step's result would open an alert.
  page.on("dialog", (dialog) => {
    dialogs.push(dialog.message());
    void dialog.dismiss();
  });
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await admin?.close();
  await viewer?.close();
  await viewerPool?.end();
  await db.drop();
  await dropLoginRoles();
});

const cells = (row: number) => page.locator(`#steps tr:nth-child(${row + 1}) td`).allTextContents();

describe("the job page: steps and children", () => {
  it("shows the step ledger oldest first: kind, name, status, attempt, a result excerpt, times relative", async () => {
    expect((await page.goto(`${admin.url}jobs/${job.id}`))?.status()).toBe(200);
    // Claimed once, parked by the wait: not "not claimed yet".
    expect(await page.locator("#parked").textContent()).toMatch(/^Claimed 1 time \(latest (now|\d+ (s|min) ago)\), no attempt failed: snoozed or parked/);
    expect(await page.locator("#steps tr").count()).toBe(4); // header and three steps
    const [charge, coolOff, paid] = [await cells(1), await cells(2), await cells(3)];
    expect(charge).toEqual([expect.stringMatching(/^(now|\d+ (s|min) ago)$/), "step", "charge", "done", "1", JSON.stringify({ note: MARKUP, chargeId: "ch_1" })]);
    expect(coolOff.slice(1, 5)).toEqual(["sleep", "cool-off", expect.stringMatching(/^slept until \d+ (s|min) ago$/), "1"]);
    // A one-hour timeout, a few seconds (or a minute on a slow machine) ago.
    expect(paid.slice(1, 5)).toEqual(["wait", "paid", expect.stringMatching(new RegExp(`^waiting for ${job.event} key ${job.key}, times out in 5\\d min$`)), "1"]);
    // Each time is a <time> with the exact instant in its title.
    const timeout = page.locator("#steps tr:nth-child(4) td:nth-child(4) time");
    const { rows } = await db.pool.query<{ wake_at: Date }>("SELECT wake_at FROM idemq.steps($1) WHERE name = 'paid'", [job.id]);
    expect(await timeout.getAttribute("title")).toBe(rows[0]!.wake_at.toISOString());
    // The result is text: no element made from it, no script run.
    expect(await page.locator("#steps script").count()).toBe(0);
    expect(dialogs).toEqual([]);
  });

  it("shows the children with their ids (links), states and results or errors, names as text", async () => {
    await page.goto(`${admin.url}jobs/${job.id}`);
    const rows = page.locator("#spawned tr");
    expect(await rows.count()).toBe(3);
    expect(await rows.nth(1).locator("td").allTextContents()).toEqual(["ship", job.shipped, "succeeded", '{"trackingId":"tr_9"}']);
    expect(await rows.nth(2).locator("td").allTextContents()).toEqual(["<i>notify</i>", job.notified, "failed", "SmtpError: mailbox <full>"]);
    expect(await page.locator("#spawned i").count()).toBe(0);
    await screenshot(page, "dashboard-job-steps");
    await rows.nth(1).locator("a").click();
    await page.waitForURL(`${admin.url}jobs/${job.shipped}`);
    expect(await page.locator("#state").textContent()).toBe("succeeded");
  });

  it("shows no steps or children section for a job without them", async () => {
    const plain = await jobIn(db.pool, "succeeded", { task: "plain" });
    expect((await page.goto(`${admin.url}jobs/${plain}`))?.status()).toBe(200);
    expect(await page.locator("h2").allTextContents()).not.toContain("Steps");
    expect(await page.locator("#steps, #steps-hidden, #spawned").count()).toBe(0);
    expect(await page.locator("#timeline").count()).toBe(1);
  });

  it("as the viewer role: the page renders, with the children and one line saying the steps need the worker or admin role", async () => {
    expect((await page.goto(`${viewer.url}jobs/${job.id}`))?.status()).toBe(200);
    expect(await page.locator("#read-only").count()).toBe(1);
    expect(await page.locator("#steps-hidden").textContent()).toBe("Steps are not shown: reading a job's steps needs the worker or admin role.");
    expect(await page.locator("#steps").count()).toBe(0);
    expect(await page.locator("#spawned tr").count()).toBe(3);
    expect(await page.content()).not.toContain("ch_1");
  });
});
