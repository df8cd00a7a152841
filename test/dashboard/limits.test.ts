// The dashboard's flow-control page (/limits, issue 26 items 4 and 8) over
// HTTP against a real database: each scope's limits, pause, use and why its
// runnable jobs wait (paused, a slot, the rate, or a worker); pause, resume,
// set and clear through forms carrying the CSRF token; bad input refused with
// SQL's message and HINT and nothing written; a login without the admin role
// is told what it may do, sees no form, and is refused by the database.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { installationRoles } from "../../src/roles.ts";
import { startDashboard, type Dashboard } from "../../src/dashboard/server.ts";
import { limits } from "../../src/sql/index.ts";
import { launchBrowser, screenshot } from "../helpers/browser.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob } from "../helpers/jobs.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";

const db = useTestDatabase({ poolSize: 4 });
let dashboard: Dashboard;

beforeAll(async () => {
  dashboard = await startDashboard({ pool: db.pool, port: 0 });
});

afterAll(async () => {
  await dashboard?.close();
  await db.drop();
  await dropLoginRoles();
});

async function getPage(base: string, path = "limits"): Promise<{ status: number; text: string; csrf: string | undefined }> {
  const response = await fetch(`${base}${path}`);
  const text = await response.text();
  return { status: response.status, text, csrf: /name="csrf" value="([^"]+)"/.exec(text)?.[1] };
}

/** POSTs a form (with the page's CSRF token) without following the redirect. */
async function post(base: string, action: string, fields: Record<string, string>): Promise<{ status: number; location: string | null; text: string }> {
  const { csrf } = await getPage(dashboard.url);
  const response = await fetch(`${base}limits/${action}`, {
    method: "POST",
    redirect: "manual",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ csrf: csrf ?? "none", ...fields }).toString(),
  });
  return { status: response.status, location: response.headers.get("location"), text: await response.text() };
}

/** The cells of the /limits row of one scope ("queue:mail"). */
function row(text: string, scope: string): string[] {
  const tr = new RegExp(`<tr data-scope="${scope}">([\\s\\S]*?)</tr>`).exec(text)?.[1];
  expect(tr, `a row for ${scope}`).toBeDefined();
  return [...tr!.matchAll(/<td[^>]*>([\s\S]*?)<\/td>/g)].map((m) => m[1]!.replace(/<[^>]+>/g, "").trim());
}

const COLUMNS = ["scope", "name", "paused", "concurrency", "running", "rate", "started", "waiting", "oldest", "why"] as const;
function cell(text: string, scope: string, column: (typeof COLUMNS)[number]): string {
  return row(text, scope)[COLUMNS.indexOf(column)]!;
}

describe("flow control in the dashboard", () => {
  it("is linked from the nav and says when no scope has a limit or a pause", async () => {
    const page = await getPage(dashboard.url);
    expect(page.status).toBe(200);
    expect(page.text).toContain(`<a href="/limits">Flow control</a>`);
    expect(page.text).toContain('id="no-limits"');
    expect(page.text).toMatch(/id="access">Signed in to the database as <b>[^<]+<\/b>, which may pause, resume, set and clear limits/);
  });

  it("set through the form: the limit is stored and shown with its use; jobs wait for a slot once every slot is held", async () => {
    const done = await post(dashboard.url, "set", { kind: "queue", name: "mail", concurrency: "2" });
    expect(done).toMatchObject({ status: 303, location: `/limits?done=${encodeURIComponent("set queue mail: concurrency 2")}` });
    expect((await limits(db.pool)).map((l) => [l.queue, l.task, l.concurrency])).toEqual([["mail", null, 2]]);
    for (let i = 0; i < 3; i++) await makeJob(db.pool, { task: "send", queue: "mail" });
    let page = await getPage(dashboard.url, done.location!.slice(1));
    expect(page.text).toContain(`<p class="note" id="notice">set queue mail: concurrency 2</p>`);
    expect(cell(page.text, "queue:mail", "running")).toBe("0 / 2");
    expect(cell(page.text, "queue:mail", "waiting")).toBe("3");
    expect(cell(page.text, "queue:mail", "why")).toBe("not held back by this limit: waiting for a worker");

    await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'w1', queues => ARRAY['mail'], batch_size => 5)");
    page = await getPage(dashboard.url);
    expect(cell(page.text, "queue:mail", "running")).toBe("2 / 2");
    expect(cell(page.text, "queue:mail", "waiting")).toBe("1");
    expect(cell(page.text, "queue:mail", "why")).toBe("waiting for a slot (every slot held)");
  });

  it("a rate used up reads as waiting for the rate; clear removes the limits", async () => {
    expect((await post(dashboard.url, "set", { kind: "task", name: "sms", rate: "1", per: "1 hour" })).status).toBe(303);
    await makeJob(db.pool, { task: "sms", queue: "texts" });
    await makeJob(db.pool, { task: "sms", queue: "texts" });
    await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'w1', queues => ARRAY['texts'], batch_size => 5)");
    const page = await getPage(dashboard.url);
    expect(cell(page.text, "task:sms", "rate")).toBe("1 per 01:00:00");
    expect(cell(page.text, "task:sms", "started")).toBe("1 / 1");
    expect(cell(page.text, "task:sms", "why")).toBe("waiting for the rate (used up in this period)");

    const cleared = await post(dashboard.url, "clear", { task: "sms" });
    expect(cleared.location).toBe(`/limits?done=${encodeURIComponent("cleared the limits of task sms")}`);
    expect((await limits(db.pool)).some((l) => l.task === "sms")).toBe(false);
  });

  it("pause and resume from a row's buttons: the claim takes nothing while paused, and the page says why", async () => {
    const report = await makeJob(db.pool, { task: "report", queue: "reports" });
    const paused = await post(dashboard.url, "pause", { kind: "queue", name: "reports" });
    expect(paused.location).toBe(`/limits?done=${encodeURIComponent("paused queue reports")}`);
    const claimed = await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'w1', queues => ARRAY['reports'])");
    expect(claimed.rowCount).toBe(0);
    let page = await getPage(dashboard.url);
    expect(cell(page.text, "queue:reports", "paused")).toBe("paused");
    expect(cell(page.text, "queue:reports", "why")).toBe("paused: they wait for resume");
    // The job's own page says it too (job()'s waiting_for).
    const jobPage = await getPage(dashboard.url, `jobs/${report}`);
    expect(/<dd id="waiting-for">([^<]*)<\/dd>/.exec(jobPage.text)?.[1]).toBe("its queue or task to be resumed (paused)");
    expect(page.text).toMatch(/<tr data-scope="queue:reports">[\s\S]*?action="\/limits\/resume"[\s\S]*?<\/tr>/);
    // The overview says so above its queues, with the limit whose slots are all held, and links here.
    const overview = await (await fetch(dashboard.url)).text();
    expect(/<p class="note" id="flow">([\s\S]*?)<\/p>/.exec(overview)?.[1]?.replace(/<[^>]+>/g, "")).toBe(
      "Flow control: 2 queue(s) or task(s) with a limit or a pause; paused: queue reports; every slot held: queue mail. Details",
    );
    expect((await post(dashboard.url, "pause", { queue: "reports" })).location).toBe(`/limits?done=${encodeURIComponent("queue reports was paused already")}`);

    expect((await post(dashboard.url, "resume", { queue: "reports" })).location).toBe(`/limits?done=${encodeURIComponent("resumed queue reports")}`);
    // Without a limit, the resumed scope has nothing left to show.
    page = await getPage(dashboard.url);
    expect(page.text).not.toContain(`data-scope="queue:reports"`);
    expect((await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'w1', queues => ARRAY['reports'])")).rowCount).toBe(1);
  });

  it("a held scope (hold(): an API's Retry-After) reads as held, on /limits and on its waiting job's page", async () => {
    const first = await makeJob(db.pool, { task: "quote", queue: "quotes" });
    const second = await makeJob(db.pool, { task: "quote", queue: "quotes" });
    const { rows } = await db.pool.query("SELECT job_id, attempt FROM idemq.claim(worker_id => 'w1', queues => ARRAY['quotes'])");
    expect(rows.map((r) => r.job_id)).toEqual([first]);
    await db.pool.query("SELECT idemq.hold(job_id => $1, attempt => $2, scope => 'task', until => now() + interval '1 hour')", [first, rows[0].attempt]);
    const page = await getPage(dashboard.url);
    expect(cell(page.text, "task:quote", "why")).toBe("held: they wait for the hold to end (an API&#39;s Retry-After)");
    const jobPage = await getPage(dashboard.url, `jobs/${second}`);
    expect(/<dd id="waiting-for">([^<]*)<\/dd>/.exec(jobPage.text)?.[1]).toBe("its queue&#39;s or task&#39;s hold to end (hold(): an API&#39;s Retry-After)");
    expect((await getPage(dashboard.url, `jobs/${first}`)).text, "the held job waits for its run_at").not.toContain('id="waiting-for"');
    await db.pool.query("SELECT idemq.resume(task => 'quote')");
  });

  it("bad input is refused with SQL's message and HINT, or named by the form, and writes nothing", async () => {
    const before = JSON.stringify(await limits(db.pool));
    const zero = await post(dashboard.url, "set", { kind: "queue", name: "mail", concurrency: "0" });
    expect(zero.status).toBe(409);
    expect(zero.text).toContain("set_limit: concurrency must be between 1 and 10000, not 0 concurrency is how many jobs of the scope may process at once");
    const noPer = await post(dashboard.url, "set", { kind: "queue", name: "mail", rate: "10" });
    expect(noPer.status).toBe(409);
    expect(noPer.text).toContain("set_limit: rate and per go together, got rate without per A rate limit is rate starts per period");
    const nothing = await post(dashboard.url, "set", { kind: "task", name: "x" });
    expect(nothing.status).toBe(409);
    expect(nothing.text).toContain("give at least one limit");
    const both = await post(dashboard.url, "pause", { queue: "a", task: "b" });
    expect(both.status).toBe(409);
    expect(both.text).toMatch(/pause: .*queue.*task/);
    const word = await post(dashboard.url, "set", { kind: "queue", name: "mail", concurrency: "five" });
    expect(word.status).toBe(400);
    expect(word.text).toContain("concurrency must be a whole number, not &quot;five&quot;");
    expect(JSON.stringify(await limits(db.pool))).toBe(before);
  });

  it("in a browser: the nav leads to the page, the set form stores a limit, a row's pause button pauses it", async () => {
    const browser = await launchBrowser();
    try {
      const page = await browser.newPage();
      await page.goto(dashboard.url);
      await page.click('header a:text-is("Flow control")');
      expect(new URL(page.url()).pathname).toBe("/limits");
      await page.selectOption("#set-limit select[name=kind]", "task");
      await page.fill("#set-limit input[name=name]", "push");
      await page.fill("#set-limit input[name=rate]", "30");
      await page.fill("#set-limit input[name=per]", "1 minute");
      await page.click("#set-limit button[type=submit]");
      expect(await page.locator("#notice").textContent()).toBe("set task push: rate 30 per 1 minute");
      await page.click('tr[data-scope="task:push"] button[data-action=pause]');
      expect(await page.locator("#notice").textContent()).toBe("paused task push");
      expect(await page.locator('tr[data-scope="task:push"] td').nth(2).textContent()).toBe("paused");
      expect((await limits(db.pool)).find((l) => l.task === "push")).toMatchObject({ rate: 30, per: "00:01:00", paused: true });
      await screenshot(page, "dashboard-limits");
    } finally {
      await browser.close();
    }
  });

  it("a POST without the page's CSRF token is refused and pauses nothing", async () => {
    const response = await fetch(`${dashboard.url}limits/pause`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: "csrf=forged&queue=mail",
    });
    expect(response.status).toBe(400);
    expect((await limits(db.pool)).find((l) => l.queue === "mail")?.paused).toBe(false);
  });

  it("a login with the worker role reads the page, is told it may not change flow control, sees no form, and is refused by the database", async () => {
    const role = await createLoginRole("dashlimits", { memberOf: [(await installationRoles(db.pool)).worker] });
    const pool = new pg.Pool({ connectionString: role.urlFor(db.name), max: 2 });
    const limited = await startDashboard({ pool, port: 0 });
    try {
      const page = await getPage(limited.url);
      expect(page.status).toBe(200);
      expect(page.text).toContain(`may read flow control but not change it`);
      expect(page.text).toContain(`<b>${role.name}</b>`);
      expect(cell(page.text, "queue:mail", "running")).toBe("2 / 2");
      expect(page.text).not.toContain("<form");
      // Hiding the forms is not the guard: a POST carrying this server's own CSRF token (its purge
      // confirmation page has one) is the database's to refuse.
      const confirm = await (await fetch(`${limited.url}purge/confirm?amount=1&unit=days&state=succeeded`)).text();
      const own = /name="csrf" value="([^"]+)"/.exec(confirm)?.[1];
      expect(own).toBeDefined();
      const refused = await fetch(`${limited.url}limits/pause`, {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ csrf: own!, queue: "mail" }).toString(),
      });
      expect(refused.status).toBe(403);
      expect(await refused.text()).toMatch(/permission denied for function pause.*needs this installation&#39;s admin role/);
      expect((await limits(db.pool)).find((l) => l.queue === "mail")?.paused).toBe(false);
    } finally {
      await limited.close();
      await pool.end();
    }
  });
});
