#!/usr/bin/env node
// Takes the README's screenshots (docs/dashboard-*.png, 1200x800) of the
// dashboard on DATABASE_URL, with headless Chromium (/usr/bin/chromium).
// The committed ones were taken on bench/dashboard-load.mjs's database
// (1,000,000 finished jobs) with a schedule and a retried job added.
//
//   npm run build && DATABASE_URL=postgres://... node scripts/dashboard-screenshots.mjs
import { resolve } from "node:path";
import pg from "pg";
import { chromium } from "playwright-core";
import { startDashboard } from "../dist/dashboard/server.js";

const docs = resolve(import.meta.dirname, "..", "docs");
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 4 });
const dashboard = await startDashboard({ pool, port: 0 });
const { rows } = await pool.query("SELECT id FROM idemq.jobs WHERE errors <> '[]' ORDER BY jsonb_array_length(errors) DESC, id DESC LIMIT 1");
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
for (const [name, path] of [
  ["overview", ""],
  ["jobs", "jobs?state=failed"],
  ["job", `jobs/${rows[0]?.id ?? 1}`],
  ["schedules", "schedules"],
]) {
  await page.goto(dashboard.url + path, { waitUntil: "load" });
  await page.screenshot({ path: resolve(docs, `dashboard-${name}.png`) });
  console.log(`docs/dashboard-${name}.png`);
}
await browser.close();
await dashboard.close();
await pool.end();
