#!/usr/bin/env node
// The dashboard's page load time with many finished jobs retained (issue 14:
// it must stay interactive at 1,000,000). Not a test: it builds the rows in
// the database you name (one INSERT ... SELECT generate_series), so give it
// a database of its own, migrated:
//
//   createdb -h 127.0.0.1 -U postgres bench_dashboard
//   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/bench_dashboard
//   npm run build
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_dashboard node bench/dashboard-load.mjs [--rows 1000000] [--no-browser]
//
// Prints the server's response time per page (median and max of --runs) and,
// with Chromium at /usr/bin/chromium, the browser's load time of each page.
import { performance } from "node:perf_hooks";
import pg from "pg";
import { startDashboard } from "../dist/dashboard/server.js";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1];
};
const ROWS = Number(option("--rows", "1000000"));
const RUNS = Number(option("--runs", "10"));
const url = process.env.DATABASE_URL;
if (!url) {
  console.error("set DATABASE_URL to a migrated database of its own (see the header of bench/dashboard-load.mjs)");
  process.exit(2);
}

const pool = new pg.Pool({ connectionString: url, max: 4 });
const finished = Number((await pool.query("SELECT count(*) AS n FROM idemq.jobs WHERE finished_at IS NOT NULL")).rows[0].n);
if (finished < ROWS) {
  const t0 = performance.now();
  // 97% succeeded, 2% failed (with an error entry), 1% cancelled; finished
  // over the last 7 days, so a few hundred fall in the overview's window.
  await pool.query(
    `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, attempt, max_attempts, locked_by, locked_at,
                             errors, result, created_at, finished_at)
     SELECT 'task_' || (g % 20), 'queue_' || (g % 5), jsonb_build_object('n', g),
            s.state, 0, f.at - interval '1 minute', 1, 3, 'bench-worker', f.at - interval '2 seconds',
            CASE WHEN s.state = 'failed' THEN jsonb_build_array(jsonb_build_object('attempt', 1, 'class', 'BenchError',
                 'message', 'upstream timeout ' || g, 'worker', 'bench-worker')) ELSE '[]' END,
            CASE WHEN s.state = 'succeeded' THEN '{"ok": true}'::jsonb END,
            f.at - interval '1 minute', f.at
     FROM generate_series($1::bigint + 1, $2::bigint) g,
          LATERAL (SELECT (CASE WHEN g % 100 < 97 THEN 'succeeded' WHEN g % 100 < 99 THEN 'failed' ELSE 'cancelled' END)::idemq.job_state AS state) s,
          LATERAL (SELECT now() - (g::numeric / $2 * 7 * 86400) * interval '1 second' AS at) f`,
    [finished, ROWS],
  );
  // Some active work, made by the SQL API.
  await pool.query(`SELECT idemq.enqueue_many(jobs => (SELECT jsonb_agg(jsonb_build_object('task', 'task_' || (g % 20), 'queue', 'queue_' || (g % 5), 'payload', jsonb_build_object('n', g)))
                    FROM generate_series(1, 2000) g))`);
  console.log(`built ${(ROWS - finished).toLocaleString("en-US")} finished jobs + 2,000 enqueued in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}
if (args.includes("--analyze")) await pool.query("VACUUM ANALYZE idemq.jobs");
const { rows: [info] } = await pool.query(
  "SELECT count(*) AS n, (SELECT reltuples FROM pg_class WHERE oid = 'idemq.jobs'::regclass) AS reltuples, version() AS version FROM idemq.jobs",
);
console.log(`idemq.jobs: ${Number(info.n).toLocaleString("en-US")} rows (reltuples ${info.reltuples}); ${info.version.split(" on ")[0]}`);
const failedId = (await pool.query("SELECT id FROM idemq.jobs WHERE state = 'failed' ORDER BY id DESC LIMIT 1")).rows[0].id;

async function time(what, run) {
  const ms = [];
  for (let i = 0; i < RUNS; i++) {
    const t = performance.now();
    await run();
    ms.push(performance.now() - t);
  }
  ms.sort((a, b) => a - b);
  console.log(`${what.padEnd(62)} median ${ms[Math.floor(ms.length / 2)].toFixed(1).padStart(7)} ms   max ${ms.at(-1).toFixed(1).padStart(7)} ms`);
}

await time("SELECT * FROM idemq.stats() (for comparison)", () => pool.query("SELECT * FROM idemq.stats()"));
await time("SELECT * FROM idemq.overview()", () => pool.query("SELECT * FROM idemq.overview()"));

const dashboard = await startDashboard({ pool, port: 0 });
const hourAgo = new Date(Date.now() - 3_600_000).toISOString();
const dayAgo = new Date(Date.now() - 86_400_000).toISOString();
const { rows: [some] } = await pool.query(
  `SELECT (SELECT string_agg(id::text, ',') FROM (SELECT id FROM idemq.jobs ORDER BY id DESC OFFSET 1000 LIMIT 3) i) AS ids,
          (SELECT idempotency_key FROM idemq.jobs WHERE idempotency_key IS NOT NULL ORDER BY id LIMIT 1 OFFSET 500) AS key`,
);
// Every search of issue 27 (id, key, task, queue, state, time range, error
// text, payload): the page, and the count its script asks for after it.
const searches = {
  "jobs (all)": "",
  "jobs ids (3)": `ids=${some.ids}`,
  "jobs state=failed": "state=failed",
  "jobs task": "task=task_1",
  "jobs queue": "queue=queue_1",
  "jobs queue+task": "queue=queue_1&task=task_1",
  "jobs created in the last hour": `created_after=${encodeURIComponent(hourAgo)}`,
  "jobs failed, finished in the last day": `state=failed&finished_after=${encodeURIComponent(dayAgo)}`,
  "jobs error text (matches)": "error=timeout%20999",
  "jobs error text (no match)": "error=no-such-text",
  // The key and payload of search-cost.mjs's rows (dashboard-load's own have neither: no match).
  ...(some.key === null ? {} : { "jobs key": `key=${encodeURIComponent(some.key)}` }),
  "jobs task + payload (rare)": `task=task_3&payload=${encodeURIComponent('{"customer": 43}')}`,
};
const pages = {
  overview: "",
  ...Object.fromEntries(Object.entries(searches).map(([name, q]) => [name, q === "" ? "jobs" : `jobs?${q}`])),
  "jobs page 3 (keyset)": null,
  "job detail": `jobs/${failedId}`,
  schedules: "schedules",
  workers: "workers",
  ...Object.fromEntries(Object.entries(searches).map(([name, q]) => [`count (the page's script): ${name.slice(5)}`, `jobs/count?${q}`])),
};
// The third page of the unfiltered list, as its "next" links lead to it.
const { rows: third } = await pool.query("SELECT id FROM idemq.jobs ORDER BY id DESC OFFSET 100 LIMIT 1");
pages["jobs page 3 (keyset)"] = `jobs?before=${Number(third[0].id) + 1}&from=101`;
for (const [name, path] of Object.entries(pages)) {
  await time(`server: ${name}`, async () => {
    const response = await fetch(dashboard.url + path);
    if (response.status !== 200) throw new Error(`${path}: ${response.status}`);
    await response.text();
  });
}

if (!args.includes("--no-browser")) {
  const { chromium } = await import("playwright-core");
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
  for (const [name, path] of Object.entries(pages)) {
    if (path.startsWith("jobs/count")) continue;
    await time(`browser load: ${name}`, async () => {
      await page.goto(dashboard.url + path, { waitUntil: "load" });
    });
  }
  await browser.close();
}
await dashboard.close();
await pool.end();
