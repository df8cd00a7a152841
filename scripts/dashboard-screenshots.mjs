#!/usr/bin/env node
// Takes the README's screenshots (docs/dashboard-*.png, 1200x800; the job
// page's 1200 wide and as tall as its children table needs) of the dashboard
// on DATABASE_URL, with headless Chromium (/usr/bin/chromium).
// The committed overview, jobs and schedules were taken on
// bench/dashboard-load.mjs's database (1,000,000 finished jobs) with a
// schedule and a retried job added.
//
//   npm run build && DATABASE_URL=postgres://... node scripts/dashboard-screenshots.mjs [overview|jobs|job|schedules ...]
//
// Names: only those screenshots (default: all four), so a page that changed
// is taken again without the others. The job page's is of a workflow job
// this script runs to its end first, on a real worker (queue
// "screenshot-workflow"): steps transactional and external, one that fails
// its first attempt, a durable sleep, two children and an event wait, so the
// page shows its attempts, its step ledger and its children.
import { resolve } from "node:path";
import pg from "pg";
import { chromium } from "playwright-core";
import { startDashboard } from "../dist/dashboard/server.js";
import { Client, createWorker } from "../dist/index.js";

const PAGES = { overview: () => "", jobs: () => "jobs?state=failed", job: async () => `jobs/${await workflowJob()}`, schedules: () => "schedules" };
const names = process.argv.slice(2);
const unknown = names.filter((n) => !(n in PAGES));
if (unknown.length > 0) throw new Error(`no screenshot named ${unknown.join(", ")}: name some of ${Object.keys(PAGES).join(", ")}`);

const QUEUE = "screenshot-workflow";
const ORDER = 1042;

class MailUnavailable extends Error {
  name = "MailUnavailable";
}

/** Runs a checkout workflow to its end on a worker of this process; returns the job's id. */
async function workflowJob() {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  let receiptTries = 0;
  const worker = createWorker({
    connectionString: process.env.DATABASE_URL,
    queues: [QUEUE],
    handleSignals: false,
    tasks: {
      checkout: async (p, ctx) => {
        await ctx.step("reserve-stock", () => ({ sku: "mug-blue", reserved: p.items }));
        const charge = await ctx.step("charge-card", () => ({ chargeId: "ch_3Pq9", amountCents: p.amountCents }), { external: true });
        await ctx.step(
          "send-receipt",
          () => {
            if (++receiptTries === 1) throw new MailUnavailable("mail provider answered 503");
            return { messageId: "msg_81f" };
          },
          { external: true },
        );
        await ctx.sleep("1 second", { name: "cool-off" });
        const [shipped] = await ctx.spawn([
          { name: "ship", task: "ship", queue: QUEUE, payload: { order: p.order } },
          { name: "notify-warehouse", task: "notify_warehouse", queue: QUEUE, payload: { order: p.order } },
        ]);
        const delivery = await ctx.waitFor("order.delivered", { key: String(p.order), timeout: "3 days", name: "delivered" });
        return { chargeId: charge.chargeId, trackingId: shipped.result.trackingId, deliveredAt: delivery.at };
      },
      ship: async () => ({ trackingId: "tr_9Z41" }),
      notify_warehouse: async () => ({ acknowledged: true }),
    },
  });
  worker.on("worker:error", ({ during, error }) => console.error(`worker error during ${during}: ${error.message}`));
  await worker.start();
  try {
    const { jobId } = await client.enqueue(
      "checkout",
      { order: ORDER, items: 2, amountCents: 2598 },
      { queue: QUEUE, backoff: { kind: "fixed", delays: ["1 second"] } },
    );
    await until(client, async () => (await client.steps(jobId)).some((s) => s.name === "delivered" && s.status === "waiting"), "the job's wait");
    await client.emitEvent("order.delivered", { key: String(ORDER), payload: { at: new Date().toISOString() } });
    await until(client, async () => (await client.getJob(jobId))?.state === "succeeded", "the job's success");
    return jobId;
  } finally {
    await worker.stop();
    await client.close();
  }
}

/** Polls `done` (a script, not a test: nothing to notify it) for at most 60 s. */
async function until(client, done, what) {
  for (const deadline = Date.now() + 60_000; !(await done()); ) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const docs = resolve(import.meta.dirname, "..", "docs");
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 4 });
const dashboard = await startDashboard({ pool, port: 0 });
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
for (const name of names.length > 0 ? names : Object.keys(PAGES)) {
  await page.goto(dashboard.url + (await PAGES[name]()), { waitUntil: "load" });
  // The job page down to the end of its children table, what its screenshot is for: 800 px end inside it.
  const children = name === "job" ? await page.locator("#spawned").boundingBox() : null;
  const height = children ? Math.max(800, Math.ceil(children.y + children.height + 20)) : 800;
  await page.screenshot({ path: resolve(docs, `dashboard-${name}.png`), clip: { x: 0, y: 0, width: 1200, height }, fullPage: height > 800 });
  console.log(`docs/dashboard-${name}.png`);
}
await browser.close();
await dashboard.close();
await pool.end();
