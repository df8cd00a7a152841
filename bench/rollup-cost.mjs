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
//    path): backend CPU and wall time per job. The jobs trigger stamps each
//    count row it appends (idemq.job_counts.at, a column default).
// 2. The fold: apply_retention() over those jobs' count rows, which adds
//    them to idemq.job_minutes as it folds them: its CPU per job.
// 3. roll_up(): the mark set a minute back, as a call a minute after the
//    last finds it; it samples at most 200 finished jobs per minute of its
//    window, so its cost is per minute, not per job: medians over --runs.
//    Its share of processing at a rate of R jobs a minute is
//    roll_up CPU / (R x processing CPU per job).
// 4. The same with --finished older finished jobs (default 1,000,000, spread
//    over a week): roll_up() still reads only its window (jobs_by_finish).
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import pg from "pg";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1];
};
const JOBS = Number(option("--jobs", "20000"));
const RUNS = Number(option("--runs", "50"));
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

async function rollUps(label) {
  const call = async () => {
    await client.query("UPDATE idemq.job_minutes_mark SET rolled_at = now() - interval '1 minute'");
    await client.query("SELECT idemq.roll_up()");
  };
  const first = await measure(call);
  // CPU from /proc is in 10 ms ticks: RUNS calls measured together.
  const all = await measure(async () => {
    for (let i = 0; i < RUNS; i++) await call();
  });
  const wall = all.wall / RUNS;
  const cpu = all.cpu / RUNS;
  console.log(`${label}: first call ${first.wall.toFixed(1)} ms wall; then ${wall.toFixed(1)} ms wall, ${cpu.toFixed(2)} ms backend CPU a call (mean of ${RUNS})`);
  return cpu;
}

await client.query("DELETE FROM idemq.jobs WHERE task LIKE 'bench_t%'");
await client.query("SELECT idemq.apply_retention()");
await client.query("DELETE FROM idemq.job_minutes");
await client.query("VACUUM ANALYZE idemq.jobs");
const { rows: [info] } = await client.query("SELECT version() AS version");
console.log(`${info.version.split(" on ")[0]}; ${JOBS.toLocaleString("en-US")} jobs`);
const processed = await processJobs(JOBS);
const perJob = processed.cpu / JOBS;
console.log(`processing (claim(100) + complete_many): ${((processed.wall / JOBS) * 1000).toFixed(1)} us wall, ${(perJob * 1000).toFixed(1)} us backend CPU per job`);
// The fold with the history and without it (the same rows unstamped), in
// alternating rounds of --jobs jobs each; medians.
const folds = { with: [], without: [] };
let countRows = 0;
for (let round = 0; round < 6; round++) {
  const kind = round % 2 === 0 ? "with" : "without";
  await client.query("DELETE FROM idemq.jobs WHERE task LIKE 'bench_t%'");
  await client.query("SELECT idemq.apply_retention()");
  await processJobs(JOBS);
  countRows = Number((await client.query("SELECT count(*) AS n FROM idemq.job_counts WHERE at IS NOT NULL")).rows[0].n);
  if (kind === "without") await client.query("UPDATE idemq.job_counts SET at = NULL WHERE at IS NOT NULL");
  folds[kind].push(await measure(() => client.query("SELECT idemq.apply_retention()")));
}
const foldWith = median(folds.with.map((r) => r.cpu));
const foldWithout = median(folds.without.map((r) => r.cpu));
const added = (foldWith - foldWithout) / JOBS;
console.log(
  `apply_retention() folding ${countRows.toLocaleString("en-US")} count rows (${JOBS.toLocaleString("en-US")} jobs): ${foldWith.toFixed(0)} ms CPU ` +
    `with the history, ${foldWithout.toFixed(0)} ms without (rows unstamped), medians of 3: the history adds ` +
    `${(added * 1000).toFixed(2)} us CPU per job, ${((100 * added) / perJob).toFixed(2)} % of processing ` +
    `(with: ${folds.with.map((r) => r.cpu.toFixed(0)).join(", ")} ms; without: ${folds.without.map((r) => r.cpu.toFixed(0)).join(", ")} ms)`,
);
const rates = [1000, 10000, 100000];
const shares = (cpu) => rates.map((r) => `${r.toLocaleString("en-US")} jobs/min: ${((100 * cpu) / (r * perJob)).toFixed(2)} %`).join(", ");
const small = await rollUps(`roll_up(), ${JOBS.toLocaleString("en-US")} jobs finished in its window`);
console.log(`  share of processing at ${shares(small)}`);

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
    await client.query("SELECT idemq.apply_retention()");
    await client.query("VACUUM ANALYZE idemq.jobs");
  }
  const big = await rollUps(`roll_up(), the same window, ${FINISHED.toLocaleString("en-US")} older finished jobs retained`);
  console.log(`  share of processing at ${shares(big)}`);
}
await client.query("DELETE FROM idemq.jobs WHERE task LIKE 'bench_t%'");
await client.end();
