// The jobs page's search and bulk actions in a real browser (headless
// Chromium) against a real database: each kind of filter through the form,
// bad filters answered 400 with the database's message and nothing read, a
// confirmation that counts the jobs and changes nothing, bulk cancel and
// retry over 10,000 jobs run batch after batch by the page (counts asserted
// in the database), a run stopped from the page (Stop: the batch in flight
// finishes, the page says how many were touched, nothing more is), and an
// action on a selection where a job moved on.
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { confirmBulk } from "../../src/dashboard/bulk-page.ts";
import { startDashboard, type Dashboard } from "../../src/dashboard/server.ts";
import { launchBrowser, screenshot, type TestBrowser } from "../helpers/browser.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { count, makeJob, makeJobs, stateOf } from "../helpers/jobs.ts";
import { claimJobRow, failRow, jobIn } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });
let browser: TestBrowser;
let dashboard: Dashboard;
let page: Page;
const MANY = 10_000;
/** The search's jobs, by what tells them apart. */
const s: Record<string, string> = {};

beforeAll(async () => {
  for (let i = 0; i < MANY; i += 5000) await makeJobs(db.pool, 5000, { task: "bulk_task", queue: "bulk" });
  // The finished ones first: a claim takes the oldest job of the queue.
  s.timedOut = await makeJob(db.pool, { task: "find_task", queue: "find", max_attempts: 1 });
  await failRow(db.pool, s.timedOut, await claimJobRow(db.pool, s.timedOut), { class: "Timeout", message: "gateway timeout 504" }, { retryable: false });
  s.done = await jobIn(db.pool, "succeeded", { task: "find_task", queue: "find" });
  s.alice = await makeJob(db.pool, { task: "find_task", queue: "find", payload: { customer: "alice", plan: "pro" }, idempotency_key: "order:1" });
  s.bob = await makeJob(db.pool, { task: "find_task", queue: "find", payload: { customer: "bob" }, concurrency_key: "tenant:7" });
  s.other = await makeJob(db.pool, { task: "other_task", queue: "find", payload: { customer: "alice" } });
  dashboard = await startDashboard({ pool: db.pool, port: 0 });
  browser = await launchBrowser();
  page = await browser.newPage();
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await dashboard?.close();
  await db.drop();
});

/** The ids the jobs table lists. */
async function listed(): Promise<string[]> {
  return page.locator("#jobs tr td:nth-child(2)").allTextContents();
}

async function search(fields: Record<string, string>, states: string[] = []): Promise<number | undefined> {
  await page.goto(`${dashboard.url}jobs`);
  for (const state of states) await page.check(`input[name=state][value=${state}]`);
  for (const [name, value] of Object.entries(fields)) await page.fill(`#search input[name=${name}]`, value);
  const [response] = await Promise.all([page.waitForNavigation(), page.click("#filter")]);
  return response?.status();
}

describe("search", () => {
  it("each kind of filter, typed into the form, finds exactly its jobs", async () => {
    const since = (await db.pool.query<{ t: string }>("SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS t FROM idemq.jobs WHERE id = $1", [s.timedOut])).rows[0]!.t;
    const cases: [string, Record<string, string>, string[], string[]][] = [
      ["task", { task: "find_task" }, [], [s.bob!, s.alice!, s.done!, s.timedOut!]],
      ["queue and state", { queue: "find" }, ["enqueued"], [s.other!, s.bob!, s.alice!]],
      ["two states", { queue: "find" }, ["failed", "succeeded"], [s.done!, s.timedOut!]],
      ["key", { key: "order:1" }, [], [s.alice!]],
      ["concurrency key", { concurrency_key: "tenant:7" }, [], [s.bob!]],
      ["error text", { error: "GATEWAY timeout" }, [], [s.timedOut!]],
      ["payload with its task", { task: "find_task", payload: '{"customer": "alice"}' }, [], [s.alice!]],
      ["payload with ids", { ids: `${s.alice}, ${s.other} ${s.bob}`, payload: '{"customer": "alice"}' }, [], [s.other!, s.alice!]],
      ["ids", { ids: `${s.done},${s.bob}` }, [], [s.bob!, s.done!]],
      ["created range", { queue: "find", created_after: since, created_before: "2999-01-01T00:00:00Z" }, [], [s.other!, s.bob!, s.alice!, s.done!, s.timedOut!]],
      ["created before the first", { queue: "find", created_before: since }, [], []],
      ["finished range", { queue: "find", finished_after: since }, [], [s.done!, s.timedOut!]],
    ];
    for (const [what, fields, states, ids] of cases) {
      expect(await search(fields, states), what).toBe(200);
      expect(await listed(), what).toEqual(ids);
      expect(await page.locator("#count").textContent(), what).toBe(ids.length === 0 ? "No jobs match." : `Jobs 1-${ids.length} of ${ids.length}.`);
      // The form keeps what was searched, and the address holds it (a link to the search).
      for (const [name, value] of Object.entries(fields)) expect(await page.inputValue(`#search input[name=${name}]`), what).toBe(value);
    }
    await search({ task: "find_task" });
    await screenshot(page, "dashboard-search");
  });

  it("a search matching more than a page answers with its rows before its count; the page's script fills the count in, a link counts without scripts", async () => {
    // The page's own HTML holds no count (count_jobs is not on its path), only the script's hook and the link.
    const raw = await (await fetch(`${dashboard.url}jobs?task=bulk_task`)).text();
    expect(raw).toMatch(/Jobs 1-50 of <span id="total" data-count="\/jobs\/count\?task=bulk_task"><a id="count-link" href="\/jobs\?task=bulk_task&amp;count=all">count them<\/a><\/span>\./);
    await page.goto(`${dashboard.url}jobs?task=bulk_task`);
    expect(await listed()).toHaveLength(50);
    await page.waitForFunction(() => document.getElementById("total")?.textContent === "10,000");
    expect(await page.locator("#count").textContent()).toBe("Jobs 1-50 of 10,000.");
    // Without scripts: the link renders the page with the count; the next page keeps the search, not the count.
    await page.goto(`${dashboard.url}jobs?task=bulk_task&count=all`);
    expect(await page.locator("#count").textContent()).toBe("Jobs 1-50 of 10,000.");
    expect(new URL(await page.locator("#next").getAttribute("href") ?? "", dashboard.url).searchParams.get("count")).toBeNull();
    // The count's answer, and a bad filter's: refused with the database's words, nothing read.
    const counted = await fetch(`${dashboard.url}jobs/count?task=bulk_task&state=enqueued`);
    expect({ status: counted.status, body: await counted.json() }).toEqual({ status: 200, body: { total: "10,000" } });
    const bad = await fetch(`${dashboard.url}jobs/count?colour=red`);
    expect(bad.status).toBe(400);
    expect((await bad.json()).error).toMatch(/filter field "colour" is not a filter field/);
  });

  it("a bad filter is answered 400 with the database's message and hint, on the page, the form kept", async () => {
    const bad: [string, () => Promise<number | undefined>, RegExp][] = [
      ["malformed JSON", () => search({ task: "find_task", payload: "{customer: alice" }), /payload must be JSON/],
      ["payload alone", () => search({ payload: '{"customer": "alice"}' }), /filter field "payload" needs task \(or key, or ids\) beside it.*payload is a JSON object the job's payload must contain/],
      ["payload not an object", () => search({ task: "find_task", payload: "[1]" }), /filter field "payload" must be a JSON object/],
      ["a bad time", () => search({ created_after: "yesterday-ish" }), /filter field "created_after" is not a time.*e\.g\./],
      ["a bad id", () => search({ ids: "12, x" }), /filter field "ids" must hold only job ids/],
      ["an unknown filter", async () => (await page.goto(`${dashboard.url}jobs?colour=red`))?.status(), /filter field "colour" is not a filter field.*The fields are ids, state, task/],
      ["an unknown state", async () => (await page.goto(`${dashboard.url}jobs?state=done`))?.status(), /filter field "state" holds something that is not a state/],
    ];
    for (const [what, go, message] of bad) {
      expect(await go(), what).toBe(400);
      expect(await page.locator("#error").textContent(), what).toMatch(message);
      expect(await page.locator("#jobs").count(), what).toBe(0);
      expect(await page.locator("#search").count(), what).toBe(1);
    }
    expect(await page.inputValue("#search input[name=ids]").catch(() => "")).toBe("");
  });
});

describe("bulk actions", () => {
  /** Runs `action` on every job of task bulk_task through the page: the confirmation's text, then the result's counts. */
  async function bulkAll(action: string): Promise<{ confirmation: string; touched: string; skipped: string; ms: number }> {
    await page.goto(`${dashboard.url}jobs?task=bulk_task`);
    await page.selectOption("#bulk select[name=action]", action);
    await page.click("#bulk-all");
    expect(new URL(page.url()).pathname).toBe("/bulk");
    const confirmation = (await page.locator("#will-touch").textContent())!;
    const started = performance.now();
    await page.click("#confirm");
    await page.locator("#result").waitFor({ timeout: 120_000 });
    const ms = performance.now() - started;
    return { confirmation, touched: (await page.locator("#touched").textContent())!, skipped: (await page.locator("#skipped").textContent())!, ms };
  }

  it(`cancel, then retry, over ${MANY.toLocaleString("en-US")} jobs: counted first, changed nothing until confirmed, then in batches`, async () => {
    const bulkStates = async () =>
      Object.fromEntries((await db.pool.query<{ state: string; n: number }>("SELECT state::text, count(*)::int AS n FROM idemq.jobs WHERE task = 'bulk_task' GROUP BY 1")).rows.map((r) => [r.state, r.n]));
    // The confirmation alone changes nothing.
    await page.goto(`${dashboard.url}jobs?task=bulk_task`);
    await page.selectOption("#bulk select[name=action]", "cancel");
    await page.click("#bulk-all");
    expect(await page.locator("#will-touch").textContent()).toMatch(/This will cancel 10,000 jobs of those the search matches\./);
    await screenshot(page, "dashboard-bulk-confirm");
    expect(await bulkStates()).toEqual({ enqueued: MANY });

    const cancelled = await bulkAll("cancel");
    expect(cancelled).toMatchObject({ touched: "10,000", skipped: "0" });
    expect(await page.locator("#result").textContent()).toMatch(/in 10 batches\.$/); // of 1,000, over several requests
    expect(await bulkStates()).toEqual({ cancelled: MANY });
    // Nothing else was touched.
    expect(await stateOf(db.pool, s.alice!)).toBe("enqueued");

    const retried = await bulkAll("retry");
    expect(retried.confirmation).toMatch(/This will retry 10,000 jobs/);
    expect(retried).toMatchObject({ touched: "10,000", skipped: "0" });
    expect(await bulkStates()).toEqual({ enqueued: MANY });
    expect(await count(db.pool, "SELECT id FROM idemq.jobs WHERE task = 'bulk_task' AND errors->-1->>'class' = 'Retried'")).toBe(MANY);
    console.log(`bulk cancel of ${MANY} jobs through the page: ${Math.round(cancelled.ms)} ms; retry: ${Math.round(retried.ms)} ms`);
  }, 240_000);

  it("a count past its cap is said as 'at least', and the form then carries no count to compare with", async () => {
    const { title, body } = await confirmBulk(db.pool, new URLSearchParams({ scope: "all", action: "cancel", task: "bulk_task" }), "csrf-token", 5);
    expect(title).toBe("Cancel: at least 5 jobs?");
    expect(body.text).toContain("This will cancel <b>at least 5</b> jobs of those the search matches (counted no further).");
    expect(body.text).not.toContain('name="counted"');
  });

  it("on a selection: counts what the action takes of it; a job that moved on meanwhile is named and left as it is", async () => {
    await page.goto(`${dashboard.url}jobs?queue=find`);
    await page.check(`input[name=job][value="${s.timedOut}"]`);
    await page.check(`input[name=job][value="${s.done}"]`);
    await page.check(`input[name=job][value="${s.bob}"]`);
    await page.selectOption("#bulk select[name=action]", "retry");
    await page.click("#bulk-selected");
    // Only the failed one of the three is retried: succeeded and enqueued jobs are not retry's.
    expect(await page.locator("#will-touch").textContent()).toMatch(/This will retry 1 job of the 3 selected\./);
    expect(JSON.parse((await page.locator("#filter").textContent())!)).toEqual({ ids: [s.bob, s.done, s.timedOut] }); // in the table's order
    // It moves on before the confirmation: retried by someone else.
    await db.pool.query("SELECT idemq.retry($1)", [s.timedOut]);
    const errorsBefore = (await db.pool.query("SELECT errors FROM idemq.jobs WHERE id = $1", [s.timedOut])).rows[0];
    await page.click("#confirm");
    await page.locator("#result").waitFor();
    expect(await page.locator("#touched").textContent()).toBe("0");
    expect(await page.locator("#moved-on").textContent()).toMatch(/^1 of the 1 jobs the confirmation counted had moved on/);
    expect((await db.pool.query("SELECT errors FROM idemq.jobs WHERE id = $1", [s.timedOut])).rows[0]).toEqual(errorsBefore);
    expect(await stateOf(db.pool, s.done!)).toBe("succeeded");
    expect(await stateOf(db.pool, s.bob!)).toBe("enqueued");
  });

  it("on a selection, cancel acts on exactly the ticked jobs", async () => {
    await page.goto(`${dashboard.url}jobs?queue=find`);
    await page.check(`input[name=job][value="${s.other}"]`);
    await page.selectOption("#bulk select[name=action]", "cancel");
    await page.click("#bulk-selected");
    expect(await page.locator("#will-touch").textContent()).toMatch(/This will cancel 1 job of the 1 selected\./);
    await page.click("#confirm");
    await page.locator("#result").waitFor();
    expect(await page.locator("#touched").textContent()).toBe("1");
    expect(await stateOf(db.pool, s.other!)).toBe("cancelled");
    expect(await stateOf(db.pool, s.alice!)).toBe("enqueued");
  });

  it("refuses no selection, an unknown action, and a POST without the CSRF token, changing nothing", async () => {
    await page.goto(`${dashboard.url}jobs?queue=find`);
    const [response] = await Promise.all([page.waitForNavigation(), page.click("#bulk-selected")]);
    expect(response?.status()).toBe(400);
    expect(await page.locator("#error").textContent()).toMatch(/no job is selected/);
    expect((await page.goto(`${dashboard.url}bulk?scope=all&action=explode&task=find_task`))?.status()).toBe(400);
    expect(await page.locator("#error").textContent()).toMatch(/action must be one of retry, cancel, delete, run_now/);
    const forged = await fetch(`${dashboard.url}bulk`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ csrf: "forged", action: "cancel", filter: JSON.stringify({ queue: "find" }) }).toString(),
    });
    expect(forged.status).toBe(400);
    expect(await stateOf(db.pool, s.alice!)).toBe("enqueued");
  });

  it(`Stop on a running bulk action: the batch in flight finishes, no other starts, and the page says how many were touched; it can go on from there`, async () => {
    // One batch of 1,000 a request, so the run is still going when Stop is pressed.
    const stepwise = await startDashboard({ pool: db.pool, port: 0, bulkRequestMs: 0 });
    const cancelled = async () => count(db.pool, "SELECT id FROM idemq.jobs WHERE task = 'bulk_task' AND state = 'cancelled'");
    try {
      expect(await cancelled()).toBe(0);
      // Hold the page's first continuation (its second POST) until Stop is pressed.
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      let posts = 0;
      await page.route("**/bulk", async (route) => {
        if (route.request().method() === "POST" && ++posts === 2) await held;
        await route.continue();
      });
      await page.goto(`${stepwise.url}jobs?task=bulk_task`);
      await page.selectOption("#bulk select[name=action]", "cancel");
      await page.click("#bulk-all");
      await page.click("#confirm");
      expect(await page.locator("#progress").textContent()).toMatch(/^So far: 1,000 cancelled, 0 skipped/);
      await page.click("#stop");
      expect(await page.locator("#stop").textContent()).toBe("stopping after the batch in flight…");
      release();
      await page.locator("#stopped").waitFor();
      expect(await page.locator("#stopped").textContent()).toMatch(/^Stopped: 2,000 cancelled, 0 skipped\s.* in 2 batches\. The jobs no batch reached were left as they were\.$/s);
      expect(posts).toBe(3); // the confirmation, the held continuation, and the stop (which runs no batch)
      expect(await cancelled()).toBe(2000);
      // No request is left going on behind the page.
      await page.waitForLoadState("networkidle");
      expect(await cancelled()).toBe(2000);
      await page.unroute("**/bulk");

      // Going on finishes the rest, the totals carried on.
      await page.click("#resume button");
      await page.locator("#result").waitFor({ timeout: 120_000 });
      expect(await page.locator("#touched").textContent()).toBe("10,000");
      expect(await page.locator("#result").textContent()).toMatch(/in 10 batches\.$/);
      expect(await cancelled()).toBe(MANY);
      // A stop value other than 1 is refused, and changes nothing.
      const csrf = await (async () => {
        await page.goto(`${stepwise.url}bulk?scope=all&action=retry&task=bulk_task`);
        return page.locator("#run input[name=csrf]").getAttribute("value");
      })();
      const bad = await page.request.post(`${stepwise.url}bulk`, { form: { csrf: csrf!, action: "retry", filter: JSON.stringify({ task: "bulk_task" }), stop: "yes" } });
      expect(bad.status()).toBe(400);
      expect(await bad.text()).toContain("stop must be 1, not &quot;yes&quot;");
      expect(await cancelled()).toBe(MANY);
    } finally {
      await page.unroute("**/bulk");
      await stepwise.close();
    }
  }, 240_000);
});
