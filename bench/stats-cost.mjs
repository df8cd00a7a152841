#!/usr/bin/env node
// What a metrics scrape costs as finished jobs pile up, and what keeping the
// job counts costs the hot paths. Not a test: it writes jobs into the
// database you name, so give it a migrated database of its own:
//
//   createdb -h 127.0.0.1 -U postgres bench_stats
//   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/bench_stats
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_stats node bench/stats-cost.mjs [hot|scrape] [--rows N]
//
// hot: backend CPU (utime + stime from /proc/<pid>/stat, so the server must
//   run on this machine) and wall time of a 10,000-job enqueue_many, of
//   2,000 single enqueue() calls, of 2,000 claim() + complete() pairs (each
//   call its own transaction), and of claim(100) + complete_many; medians
//   over --runs rounds. The jobs it makes are deleted at the end.
// scrape: stats() and overview() with --rows finished jobs (built by one
//   INSERT ... SELECT, as bench/dashboard-load.mjs does; a smaller --rows than
//   the database holds adds none) and 2,000 enqueued: wall time of --runs
//   calls, and the idemq.jobs rows one call reads (pg_stat_user_tables:
//   seq_tup_read + idx_tup_fetch).
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import pg from "pg";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1];
};
const mode = args[0] === "scrape" ? "scrape" : "hot";
const RUNS = Number(option("--runs", "5"));
const url = process.env.DATABASE_URL;
if (!url) {
  console.error("set DATABASE_URL to a migrated database of its own (see the header of bench/stats-cost.mjs)");
  process.exit(2);
}

function cpuSeconds(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(rest[11]) + Number(rest[12])) / 100;
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const client = new pg.Client({ connectionString: url });
await client.connect();
const pid = (await client.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;

async function measure(work) {
  const cpu0 = cpuSeconds(pid);
  const t0 = performance.now();
  await work();
  return { wall: performance.now() - t0, cpu: (cpuSeconds(pid) - cpu0) * 1000 };
}

async function report(name, per, unit, work) {
  const runs = [];
  for (let i = 0; i < RUNS; i++) runs.push(await measure(work));
  const wall = median(runs.map((r) => r.wall)) / per;
  const cpu = median(runs.map((r) => r.cpu)) / per;
  console.log(`${name}: ${(wall * 1000).toFixed(1)} us wall, ${(cpu * 1000).toFixed(1)} us backend CPU per ${unit} (median of ${RUNS})`);
}

async function reportCall(name, work) {
  const runs = [];
  for (let i = 0; i < RUNS; i++) runs.push(await measure(work));
  const walls = runs.map((r) => r.wall).sort((a, b) => a - b);
  console.log(`${name}: ${median(walls).toFixed(2)} ms median, ${walls[0].toFixed(2)}-${walls.at(-1).toFixed(2)} ms (${RUNS} calls)`);
}

if (mode === "hot") {
  const batch = JSON.stringify(Array.from({ length: 10000 }, (_, i) => ({ task: "bench_t", queue: "bench_q", payload: { n: i } })));
  await report("enqueue_many(10,000 jobs)", 10000, "job", async () => {
    await client.query("SELECT count(*) FROM idemq.enqueue_many(jobs => $1::jsonb)", [batch]);
  });
  await report("claim(100) + complete_many, 100 jobs a round", 10000, "job", async () => {
    for (let i = 0; i < 100; i++) {
      await client.query(
        `SELECT idemq.complete_many(job_ids => array_agg(c.id), attempts => array_agg(c.attempt))
         FROM idemq.claim(worker_id => 'bench', tasks => '{bench_t}', batch_size => 100) c`,
      );
    }
  });
  await client.query("DELETE FROM idemq.jobs WHERE task = 'bench_t'");
  await report("enqueue()", 2000, "call", async () => {
    for (let i = 0; i < 2000; i++) {
      await client.query("SELECT idemq.enqueue($1, $2)", ["bench_t", { n: i }]);
    }
  });
  await report("claim() + complete()", 2000, "job", async () => {
    for (let i = 0; i < 2000; i++) {
      const { rows } = await client.query("SELECT id, attempt FROM idemq.claim('bench', NULL, 1, '30 seconds', '{bench_t}')");
      await client.query("SELECT idemq.complete($1, $2)", [rows[0].id, rows[0].attempt]);
    }
  });
  await client.query("DELETE FROM idemq.jobs WHERE task = 'bench_t'");
} else {
  const ROWS = Number(option("--rows", "1000000"));
  const finished = Number((await client.query("SELECT count(*) AS n FROM idemq.jobs WHERE finished_at IS NOT NULL")).rows[0].n);
  if (finished < ROWS) {
    await client.query(
      `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, attempt, max_attempts, locked_by, locked_at,
                               result, created_at, finished_at)
       SELECT 'task_' || (g % 20), 'queue_' || (g % 5), jsonb_build_object('n', g),
              s.state, 0, f.at - interval '1 minute', 1, 3, 'bench-worker', f.at - interval '2 seconds',
              CASE WHEN s.state = 'succeeded' THEN '{"ok": true}'::jsonb END, f.at - interval '1 minute', f.at
       FROM generate_series($1::bigint + 1, $2::bigint) g,
            LATERAL (SELECT (CASE WHEN g % 100 < 97 THEN 'succeeded' WHEN g % 100 < 99 THEN 'failed' ELSE 'cancelled' END)::idemq.job_state AS state) s,
            LATERAL (SELECT now() - (g::numeric / $2 * 7 * 86400) * interval '1 second' AS at) f`,
      [finished, ROWS],
    );
  }
  const active = Number((await client.query("SELECT count(*) AS n FROM idemq.jobs WHERE finished_at IS NULL")).rows[0].n);
  if (active < 2000) {
    await client.query(`SELECT idemq.enqueue_many(jobs => (SELECT jsonb_agg(jsonb_build_object('task', 'task_' || (g % 20), 'queue', 'queue_' || (g % 5)))
                        FROM generate_series(1, $1::int) g))`, [2000 - active]);
  }
  await client.query("VACUUM ANALYZE idemq.jobs");
  const { rows: [info] } = await client.query("SELECT count(*) AS n, version() AS version FROM idemq.jobs");
  console.log(`idemq.jobs: ${Number(info.n).toLocaleString("en-US")} rows; ${info.version.split(" on ")[0]}`);
  const tuplesRead = async () => {
    // The statistics of this backend's own transaction are flushed at its end;
    // pg_stat_force_next_flush makes them visible to the next statement.
    await client.query("SELECT pg_stat_force_next_flush()").catch(() => {});
    const { rows: [r] } = await client.query(
      "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) AS n FROM pg_stat_user_tables WHERE relid = 'idemq.jobs'::regclass",
    );
    return Number(r.n);
  };
  for (const [name, sql] of [["stats()", "SELECT * FROM idemq.stats()"], ["overview()", "SELECT * FROM idemq.overview()"]]) {
    await client.query(sql); // warm the plan cache
    const before = await tuplesRead();
    await client.query(sql);
    const read = (await tuplesRead()) - before;
    await reportCall(`${name}, ${Number(info.n).toLocaleString("en-US")} jobs, ${read.toLocaleString("en-US")} job rows read a call`, async () => {
      await client.query(sql);
    });
  }
}
await client.end();
