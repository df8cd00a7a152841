// The charts page in a real browser (headless Chromium) with real data: a
// real worker runs jobs (some succeed, some fail), its maintenance service
// rolls the history up (roll_up(), called by its retention timer's
// runOnce()), and the page's SVG series carry exactly those counts, per
// queue and per task, for the last hour and the last day; the waiting chart
// shows jobs no worker serves; hovering reads a minute's values.
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startDashboard, type Dashboard } from "../../src/dashboard/server.ts";
import { createWorker } from "../../src/worker/create-worker.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { launchBrowser, screenshot, type TestBrowser } from "../helpers/browser.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { count, makeJob } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 4 });
let browser: TestBrowser;
let dashboard: Dashboard;
let page: Page;

beforeAll(async () => {
  for (let i = 0; i < 12; i++) await makeJob(db.pool, { queue: "images", task: "resize", payload: { i } });
  for (let i = 0; i < 3; i++) await makeJob(db.pool, { queue: "images", task: "mail", payload: { i }, max_attempts: 1 });
  for (let i = 0; i < 2; i++) await makeJob(db.pool, { queue: "later", task: "report", payload: { i } });
  const worker = createWorker({
    connectionString: db.url,
    queues: ["images"],
    handleSignals: false,
    tasks: {
      resize: async () => ({ resized: true }),
      mail: async () => {
        throw new Error("mail server down");
      },
    },
  });
  await worker.start();
  try {
    await waitFor(async () => (await count(db.pool, "SELECT id FROM idemq.jobs WHERE queue = 'images' AND finished_at IS NOT NULL")) === 15, {
      what: "the worker to finish the 15 jobs",
    });
    // The worker's own maintenance run: apply_retention, then roll_up.
    await worker.retainer.runOnce();
  } finally {
    await worker.stop();
  }
  dashboard = await startDashboard({ pool: db.pool, port: 0 });
  browser = await launchBrowser();
  page = await browser.newPage();
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await dashboard?.close();
  await db.drop();
});

/** Each series of a chart: its values (null where none was sampled) and its drawn points. */
async function series(chart: string): Promise<Record<string, { values: (number | null)[]; points: [number, number][] }>> {
  return page.locator(`#${chart} g[data-series]`).evaluateAll((groups) =>
    Object.fromEntries(
      groups.map((g) => [
        g.getAttribute("data-series")!,
        {
          values: g.getAttribute("data-values")!.split(",").map((v) => (v === "" ? null : Number(v))),
          points: [...g.querySelectorAll("polyline")].flatMap((p) =>
            p.getAttribute("points")!.split(" ").map((xy) => xy.split(",").map(Number) as [number, number]),
          ),
        },
      ]),
    ),
  );
}

const sum = (values: (number | null)[]) => values.reduce<number>((a, v) => a + (v ?? 0), 0);

describe("the charts page", () => {
  it("is in the navigation, and its throughput series sum to the jobs the worker ran, a point per minute", async () => {
    await page.goto(dashboard.url);
    await page.locator("header a", { hasText: "Charts" }).click();
    expect(new URL(page.url()).pathname).toBe("/charts");
    const all = await series("throughput");
    expect(Object.keys(all)).toEqual(["started", "succeeded", "failed", "retried"]);
    expect([sum(all.started!.values), sum(all.succeeded!.values), sum(all.failed!.values), sum(all.retried!.values)]).toEqual([15, 12, 3, 0]);
    // The last hour: 61 minutes, each drawn; the highest value at the top of the plot (y = 8).
    expect(all.started!.values).toHaveLength(61);
    expect(all.started!.points).toHaveLength(61);
    const top = all.started!.values.indexOf(Math.max(...all.started!.values.map((v) => v ?? 0)));
    expect(all.started!.points[top]![1]).toBeCloseTo(8, 0);
    expect(await page.locator("#run-time g[data-series=p95]").getAttribute("data-values")).toMatch(/\d/);
    await screenshot(page, "dashboard-charts");
  });

  it("per task and per queue: mail's jobs failed, resize's succeeded; the waiting chart shows the queue no worker serves", async () => {
    await page.goto(new URL("/charts", dashboard.url).href);
    await page.selectOption("select[name=task]", "mail");
    await page.locator("#choose button").click();
    const mail = await series("throughput");
    expect([sum(mail.started!.values), sum(mail.succeeded!.values), sum(mail.failed!.values)]).toEqual([3, 0, 3]);
    await page.goto(new URL("/charts?queue=later", dashboard.url).href);
    const waiting = await series("waiting");
    expect(waiting.waiting!.values.filter((v) => v !== null)).toEqual([2]);
    expect(sum((await series("throughput")).started!.values)).toBe(0);
  });

  it("the last day: 1,441 minutes, the same sums; hovering reads a minute's values", async () => {
    await page.goto(new URL("/charts?queue=images", dashboard.url).href);
    await page.locator("#range-day").click();
    expect(new URL(page.url()).searchParams.get("range")).toBe("day");
    const day = await series("throughput");
    expect(day.started!.values).toHaveLength(1441);
    expect([sum(day.started!.values), sum(day.succeeded!.values), sum(day.failed!.values)]).toEqual([15, 12, 3]);
    const svg = page.locator("#throughput svg");
    const box = (await svg.boundingBox())!;
    await page.mouse.move(box.x + box.width - 10, box.y + box.height / 2);
    await waitFor(async () => /UTC: started \d+, succeeded \d+, failed \d+, retried \d+/.test((await page.locator("#throughput .readout").textContent()) ?? ""), {
      what: "the hover readout",
    });
    await screenshot(page, "dashboard-charts-day");
  });
});
