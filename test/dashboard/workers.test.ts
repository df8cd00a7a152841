// The workers page in a real browser (headless Chromium): a real worker,
// running, shown live with its host, pid, concurrency and the jobs it holds
// (how long each has run); a worker whose row stopped being refreshed shown
// late, with the outages it said it lived through; the running worker, once
// stopped cleanly, shown stopped (never late) until apply_retention prunes
// its row stopped_worker_seconds later.
import { hostname } from "node:os";
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startDashboard, type Dashboard } from "../../src/dashboard/server.ts";
import { createWorker } from "../../src/worker/create-worker.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { launchBrowser, screenshot, type TestBrowser } from "../helpers/browser.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob, stateOf } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 4 });
let browser: TestBrowser;
let dashboard: Dashboard;
let page: Page;

beforeAll(async () => {
  dashboard = await startDashboard({ pool: db.pool, port: 0 });
  browser = await launchBrowser();
  page = await browser.newPage();
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await dashboard?.close();
  await db.drop();
});

/** The text of each cell of the row of `workerId`, by its class. */
async function cellsOf(workerId: string): Promise<Record<string, string>> {
  const row = page.locator(`#workers tr[data-worker="${workerId}"]`);
  expect(await row.count(), `one row for ${workerId}`).toBe(1);
  const out: Record<string, string> = {};
  for (const name of ["status", "host", "pid", "held", "concurrency", "outages", "seen"]) out[name] = (await row.locator(`.${name}`).textContent())!.trim();
  out.running = (await row.locator(".running").allTextContents()).join("|");
  out.jobs = (await row.locator(".in-hand a").allTextContents()).join(",");
  out.rowClass = (await row.getAttribute("class"))!;
  return out;
}

describe("workers page", () => {
  it("a running worker is live with its host, pid, concurrency and jobs in hand; a worker not seen for minutes is late, with its outages", async () => {
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const worker = createWorker({
      connectionString: db.url,
      workerId: "page-worker",
      queues: ["wq"],
      concurrency: 3,
      handleSignals: false,
      tasks: { hold: async () => released },
    });
    // A worker that stopped refreshing its row five minutes ago, after two outages (4.5 s down in all).
    await db.pool.query(
      "SELECT idemq.worker_seen(worker_id => 'gone-worker', queues => '{old}', host => 'old-host', pid => 4242, concurrency => 2, refresh_every => '15 seconds', outages => 1, outage_ms => 1000)",
    );
    await db.pool.query("SELECT idemq.worker_seen(worker_id => 'gone-worker', queues => '{old}', outages => 2, outage_ms => 4500)");
    await db.pool.query("UPDATE idemq.workers SET last_seen_at = now() - interval '5 minutes' WHERE worker_id = 'gone-worker'");
    // One that stopped cleanly a moment ago (worker_stopped keeps its row, stopped).
    await db.pool.query("SELECT idemq.worker_seen(worker_id => 'done-worker', host => 'done-host', pid => 77, concurrency => 1, refresh_every => '15 seconds')");
    expect((await db.pool.query("SELECT idemq.worker_stopped(worker_id => 'done-worker') AS had")).rows).toEqual([{ had: true }]);
    const jobs = [await makeJob(db.pool, { task: "hold", queue: "wq" }), await makeJob(db.pool, { task: "hold", queue: "wq" })];
    await worker.start();
    try {
      await waitFor(async () => (await Promise.all(jobs.map((j) => stateOf(db.pool, j)))).every((s) => s === "processing"), { what: "both jobs to run" });
      expect((await page.goto(`${dashboard.url}workers`))?.status()).toBe(200);
      expect(await page.locator("header a[href='/workers']").count()).toBe(1);
      const live = await cellsOf("page-worker");
      expect(live).toMatchObject({ status: "live", rowClass: "live", host: hostname(), pid: String(process.pid), held: "2", concurrency: "3", outages: "none" });
      expect(live.jobs!.split(",").sort()).toEqual([...jobs].sort());
      expect(live.running).toMatch(/^running \d+ ms\|running \d+ ms$|^running [\d.]+ (ms|s)\|running [\d.]+ (ms|s)$/);
      expect(live.seen).toMatch(/ago; every 15\.0 s\)$/);
      const gone = await cellsOf("gone-worker");
      expect(gone).toMatchObject({ status: "late", rowClass: "late", host: "old-host", pid: "4242", held: "0", concurrency: "2" });
      // Relative, as every time the pages print (the exact time is the <time>'s title).
      expect(gone.outages).toMatch(/^2, 4\.5 s down in all; the latest ended (now|\d+ (s|min) ago)$/);
      expect(gone.seen).toMatch(/\(5 min \d+ s ago; every 15\.0 s\)$/);
      expect(await page.locator("#summary").textContent()).toMatch(/^2 workers, 1 late \(two refreshes of its row missed\), 2 jobs in hand; 1 stopped recently\./);
      expect(await cellsOf("done-worker")).toMatchObject({ rowClass: "stopped", host: "done-host", held: "0" });
      await screenshot(page, "dashboard-workers");
    } finally {
      release();
      await worker.stop();
    }
    const listedWorkers = () => page.locator("#workers tr[data-worker]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-worker")));
    // A clean stop keeps the row, stopped: listed after the others, not late, holding nothing.
    await page.goto(`${dashboard.url}workers`);
    expect(await listedWorkers()).toEqual(["gone-worker", "page-worker", "done-worker"]);
    const stopped = await cellsOf("page-worker");
    expect(stopped).toMatchObject({ rowClass: "stopped", host: hostname(), pid: String(process.pid), held: "0", concurrency: "3" });
    expect(stopped.status).toMatch(/^stopped (now|\d+ s ago)$/);
    expect(await page.locator("#summary").textContent()).toMatch(/^1 worker, 1 late \(two refreshes of its row missed\), 0 jobs in hand; 2 stopped recently\./);
    expect((await db.pool.query("SELECT worker_id, late, stopped_at IS NOT NULL AS stopped FROM idemq.workers() WHERE worker_id = 'page-worker'")).rows).toEqual([
      { worker_id: "page-worker", late: false, stopped: true },
    ]);
    // Pruned by apply_retention once stopped longer than stopped_worker_seconds (an hour): just inside it stays.
    await db.pool.query("UPDATE idemq.workers SET stopped_at = now() - interval '59 minutes 59 seconds' WHERE worker_id = 'page-worker'");
    await db.pool.query("SELECT idemq.apply_retention()");
    await page.goto(`${dashboard.url}workers`);
    expect(await listedWorkers()).toEqual(["gone-worker", "page-worker", "done-worker"]);
    await db.pool.query("UPDATE idemq.workers SET stopped_at = now() - interval '1 hour 1 second' WHERE worker_id = 'page-worker'");
    await db.pool.query("SELECT idemq.apply_retention()");
    await page.goto(`${dashboard.url}workers`);
    expect(await listedWorkers()).toEqual(["gone-worker", "done-worker"]);
  }, 60_000);
});
