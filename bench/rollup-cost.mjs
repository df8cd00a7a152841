#!/usr/bin/env node
// What the dashboard's history (roll_up(), sql/functions/reads/roll_up.sql)
// costs per job, against what processing the job costs. Not a test: it
// writes jobs into the database you name, so give it a migrated database of
// its own (the server on this machine: backend CPU is read from /proc):
//
//   createdb -h 127.0.0.1 -U postgres bench_rollup
//   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/bench_rollup
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_rollup node bench/rollup-cost.mjs [--jobs N] [--runs R] [--finished M]
//
// 1. Processing: --jobs jobs (20 tasks, 5 queues) enqueued, then claimed and
//    completed 100 at a time (claim(100) + complete_many, the worker's hot
//    path): backend CPU and wall time per job.
// 2. roll_up() over them: the mark set a minute back, as a call a minute
//    after the last finds it, so the call reads every job finished in its
//    window (the minute plus two minutes of overlap: here all --jobs of
//    them). Medians over --runs calls; the first call (it writes the rows)
//    apart. A job is read by about three calls (the overlap), so its cost is
//    3 x call / --jobs.
// 3. The same with --finished older finished jobs (default 1,000,000, spread
//    over a week, as bench/stats-cost.mjs builds them): the call still reads
//    only its window (jobs_by_finish).
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import pg from "pg";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1];
};
const JOBS = Number(option("--jobs", "20000"));
const RUNS = Number(option("--runs", "7"));
const FINISHED = Number(option("--finished", "1000000"));
const url = process.env.DATABASE_URL;
if (!url) {
  console.error("set DATABASE_URL to a migrated database of its own (see the header of bench/rollup-cost.mjs)");
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

async function processJobs(n) {
  const batch = JSON.stringify(Array.from({ length: n }, (_, i) => ({ task: `bench_t${i % 20}`, queue: `bench_q${i % 5}`, payload: { n: i } })));
  await client.query("SELECT count(*) FROM idemq.enqueue_many(jobs => $1::jsonb)", [batch]);
  await client.query("VACUUM ANALYZE idemq.jobs");
  return measure(async () => {
    for (let done = 0; done < n; done += 100) {
      await client.query(
        `SELECT idemq.complete_many(job_ids => array_agg(c.job_id), attempts => array_agg(c.attempt))
         FROM idemq.claim(worker_id => 'bench', batch_size => 100) c`,
      );
    }
  });
}

async function rollUps(label, n) {
  const call = async () => {
    await client.query("UPDATE idemq.job_minutes_mark SET rolled_at = now() - interval '1 minute'");
    return measure(() => client.query("SELECT idemq.roll_up()"));
  };
  const first = await call();
  const runs = [];
  for (let i = 0; i < RUNS; i++) runs.push(await call());
  const wall = median(runs.map((r) => r.wall));
  const cpu = median(runs.map((r) => r.cpu));
  console.log(
    `${label}: first call ${first.wall.toFixed(1)} ms wall; then ${wall.toFixed(1)} ms wall, ${cpu.toFixed(0)} ms backend CPU a call (median of ${RUNS}); ` +
      `per job (3 calls read it): ${((3 * wall * 1000) / n).toFixed(1)} us wall, ${((3 * cpu * 1000) / n).toFixed(1)} us CPU`,
  );
  return { wall: (3 * wall) / n, cpu: (3 * cpu) / n };
}

await client.query("DELETE FROM idemq.jobs WHERE task LIKE 'bench_t%'");
await client.query("DELETE FROM idemq.job_minutes");
const { rows: [info] } = await client.query("SELECT version() AS version");
console.log(`${info.version.split(" on ")[0]}; ${JOBS.toLocaleString("en-US")} jobs`);
const processed = await processJobs(JOBS);
const perJob = { wall: processed.wall / JOBS, cpu: processed.cpu / JOBS };
console.log(
  `processing (claim(100) + complete_many): ${(perJob.wall * 1000).toFixed(1)} us wall, ${(perJob.cpu * 1000).toFixed(1)} us backend CPU per job`,
);
const share = (cost) => `${((100 * cost.wall) / perJob.wall).toFixed(2)} % of wall, ${((100 * cost.cpu) / perJob.cpu).toFixed(2)} % of CPU`;
const small = await rollUps(`roll_up(), ${JOBS.toLocaleString("en-US")} jobs in its window`, JOBS);
console.log(`  share of processing: ${share(small)}`);

const old = Number((await client.query("SELECT count(*) AS n FROM idemq.jobs WHERE finished_at < now() - interval '1 hour'")).rows[0].n);
if (FINISHED > 0) {
  if (old < FINISHED) {
    await client.query(
      `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, attempt, max_attempts, locked_by, locked_at, created_at, finished_at)
       SELECT 'old_' || (g % 20), 'old_q' || (g % 5), '{}', 'succeeded', 0, f.at - interval '1 minute', 1, 3, 'w', f.at - interval '2 seconds',
              f.at - interval '1 minute', f.at
       FROM generate_series($1::bigint + 1, $2::bigint) g,
            LATERAL (SELECT now() - interval '1 hour' - (g::numeric / $2 * 7 * 86400) * interval '1 second' AS at) f`,
      [old, FINISHED],
    );
    await client.query("VACUUM ANALYZE idemq.jobs");
  }
  const big = await rollUps(`roll_up(), the same window, ${FINISHED.toLocaleString("en-US")} older finished jobs retained`, JOBS);
  console.log(`  share of processing: ${share(big)}`);
}
await client.query("DELETE FROM idemq.jobs WHERE task LIKE 'bench_t%'");
await client.end();
