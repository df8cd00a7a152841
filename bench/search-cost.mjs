#!/usr/bin/env node
// What a search (find_jobs, count_jobs) and a bulk batch cost with many jobs
// retained (issue 27: a page of results in under 300 ms at 1,000,000 jobs),
// and what a GIN index on payloads would cost every enqueue. Not a test: it
// writes jobs into the database you name, so give it a migrated database of
// its own:
//
//   createdb -h 127.0.0.1 -U postgres bench_search
//   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/bench_search
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_search node bench/search-cost.mjs [search|index-cost] [--rows N] [--runs N]
//
// search (default): builds --rows finished jobs (one INSERT ... SELECT, as
//   bench/dashboard-load.mjs does: 97% succeeded, 2% failed with an error,
//   1% cancelled, over 7 days; 20 tasks, 5 queues, a key on every tenth, a
//   payload {n, customer (10,000 values), region}) and 2,000 enqueued, then
//   prints the median and max wall time of --runs calls of each search (one
//   page of 50, and the scan of each of its passes), of count_jobs, and of one batch of 1,000 of each bulk action
//   (rolled back), with the plan's top scan node.
// index-cost [--index 'USING btree (task, id)']... [--jobs N]: what indexes
//   on idemq.jobs cost a job's life (enqueue_many, claim, complete_many):
//   backend CPU and WAL per job, without and with them, alternating rounds
//   (default: a GIN jsonb_path_ops index on payload). The jobs it makes are
//   deleted.
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import pg from "pg";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1];
};
const mode = args[0] === "index-cost" ? "index-cost" : "search";
const ROWS = Number(option("--rows", "1000000"));
const RUNS = Number(option("--runs", "7"));
const url = process.env.DATABASE_URL;
if (!url) {
  console.error("set DATABASE_URL to a migrated database of its own (see the header of bench/search-cost.mjs)");
  process.exit(2);
}
const pool = new pg.Pool({ connectionString: url, max: 2 });

async function time(run) {
  const ms = [];
  for (let i = 0; i < RUNS; i++) {
    const t = performance.now();
    await run();
    ms.push(performance.now() - t);
  }
  ms.sort((a, b) => a - b);
  return { median: ms[Math.floor(ms.length / 2)], max: ms.at(-1) };
}

const fmt = (t) => `${t.median.toFixed(1).padStart(7)} ms median, ${t.max.toFixed(1).padStart(7)} max`;

async function build() {
  const finished = Number((await pool.query("SELECT count(*) AS n FROM idemq.jobs WHERE finished_at IS NOT NULL")).rows[0].n);
  if (finished >= ROWS) return;
  const t0 = performance.now();
  await pool.query(
    `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, attempt, max_attempts, locked_by, locked_at,
                             errors, result, created_at, finished_at, idempotency_key)
     SELECT 'task_' || (g % 20), 'queue_' || (g % 5), jsonb_build_object('n', g, 'customer', g % 10000, 'region', 'r' || (g % 7)),
            s.state, 0, f.at - interval '1 minute', 1, 3, 'bench-worker', f.at - interval '2 seconds',
            CASE WHEN s.state = 'failed' THEN jsonb_build_array(jsonb_build_object('attempt', 1, 'class', 'BenchError',
                 'message', 'upstream timeout ' || g, 'worker', 'bench-worker')) ELSE '[]' END,
            CASE WHEN s.state = 'succeeded' THEN '{"ok": true}'::jsonb END,
            f.at - interval '1 minute', f.at,
            CASE WHEN g % 10 = 0 THEN 'key:' || g END
     FROM generate_series($1::bigint + 1, $2::bigint) g,
          LATERAL (SELECT (CASE WHEN g % 100 < 97 THEN 'succeeded' WHEN g % 100 < 99 THEN 'failed' ELSE 'cancelled' END)::idemq.job_state AS state) s,
          LATERAL (SELECT now() - (($2 - g)::numeric / $2 * 7 * 86400) * interval '1 second' AS at) f`,
    [finished, ROWS],
  );
  await pool.query(`SELECT count(*) FROM idemq.enqueue_many(jobs => (SELECT jsonb_agg(jsonb_build_object('task', 'task_' || (g % 20),
                    'queue', 'queue_' || (g % 5), 'payload', jsonb_build_object('n', g))) FROM generate_series(1, 2000) g))`);
  await pool.query("VACUUM ANALYZE idemq.jobs");
  console.log(`built ${(ROWS - finished).toLocaleString("en-US")} finished jobs + 2,000 enqueued in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

/** The first scan node of the plan of _matching_jobs's query for `filter` (auto_explain, nested). */
async function scanOf(filter) {
  const c = await pool.connect();
  const notices = [];
  const onNotice = (n) => notices.push(n.message);
  c.on("notice", onNotice);
  try {
    await c.query("LOAD 'auto_explain'");
    await c.query("SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on; SET client_min_messages = log");
    await c.query("SELECT count(*) FROM idemq._matching_jobs('bench', $1::jsonb, NULL, NULL, 51)", [JSON.stringify(filter)]);
  } finally {
    c.off("notice", onNotice);
    await c.query("RESET client_min_messages; RESET auto_explain.log_min_duration");
    c.release();
  }
  // The search's passes (_matching_jobs: a walk of the newest ids, then the rest scanned when the page is not full).
  const passes = notices.filter((m) => m.includes("FROM idemq.jobs j") && m.includes("v_ids IS NULL"));
  const scan = (plan) => /((?:Parallel )?(?:Index Only Scan|Index Scan|Bitmap Heap Scan|Seq Scan)[^(]*)/.exec(plan)?.[1]?.trim() ?? "?";
  return passes.length === 0 ? "?" : passes.map(scan).join("; then ");
}

async function search() {
  await build();
  const { rows: [info] } = await pool.query(
    "SELECT count(*) AS n, pg_size_pretty(pg_table_size('idemq.jobs')) AS size, version() AS version FROM idemq.jobs",
  );
  console.log(`idemq.jobs: ${Number(info.n).toLocaleString("en-US")} rows, ${info.size}; ${info.version.split(" on ")[0]}`);
  const { rows: [ids] } = await pool.query("SELECT min(id) AS lo, max(id) AS hi FROM idemq.jobs");
  const mid = String((BigInt(ids.lo) + BigInt(ids.hi)) / 2n);
  const ago = (hours) => new Date(Date.now() - hours * 3_600_000).toISOString();
  const searches = [
    ["every job", {}],
    ["ids (3)", { ids: [ids.lo, mid, ids.hi] }],
    ["state failed", { state: ["failed"] }],
    ["state cancelled", { state: ["cancelled"] }],
    ["state enqueued", { state: ["enqueued"] }],
    ["task (1 in 20)", { task: "task_3" }],
    ["task (none)", { task: "no_such_task" }],
    ["queue + task", { queue: "queue_3", task: "task_3" }],
    ["key", { key: `key:${Math.floor(ROWS / 2 / 10) * 10}` }],
    ["error (common)", { error: "upstream timeout" }],
    ["error (one)", { error: "timeout 4242" }],
    ["created_after 1h ago", { created_after: ago(1) }],
    ["created_before 6 days ago", { created_before: ago(144) }],
    ["failed, finished in the last day", { state: ["failed"], finished_after: ago(24) }],
    ["failed, finished over 6 days ago", { state: ["failed"], finished_before: ago(144) }],
    ["succeeded, finished over 6 days ago", { state: ["succeeded"], finished_before: ago(144) }],
    ["task + payload (1 in 10,000)", { task: "task_3", payload: { customer: 43 } }],
    ["task + payload (none)", { task: "task_3", payload: { customer: 42 } }],
    ["task + payload (common)", { task: "task_3", payload: { region: "r1" } }],
  ];
  console.log("\nfind_jobs, one page of 50 (the plan's scan):");
  for (const [what, filter] of searches) {
    const t = await time(() => pool.query("SELECT * FROM idemq.find_jobs($1::jsonb)", [JSON.stringify(filter)]));
    console.log(`  ${what.padEnd(38)} ${fmt(t)}   ${await scanOf(filter)}`);
  }
  console.log("\ncount_jobs (at_most 10,000):");
  for (const [what, filter, action] of [
    ["every job", {}, null],
    ["state failed (20,000: capped)", { state: ["failed"] }, null],
    ["retry of task_3 (1,000)", { task: "task_3" }, "retry"],
    ["cancel of queue_1 (400)", { queue: "queue_1" }, "cancel"],
  ]) {
    const t = await time(() => pool.query("SELECT * FROM idemq.count_jobs($1::jsonb, $2)", [JSON.stringify(filter), action]));
    console.log(`  ${what.padEnd(38)} ${fmt(t)}`);
  }
  console.log("\none batch of at most 1,000 (rolled back):");
  for (const [what, fn, filter] of [
    ["retry_jobs state failed", "retry_jobs", { state: ["failed"] }],
    ["cancel_jobs (2,000 enqueued)", "cancel_jobs", { state: ["enqueued"] }],
    ["delete_jobs state succeeded", "delete_jobs", { state: ["succeeded"] }],
  ]) {
    const c = await pool.connect();
    try {
      const t = await time(async () => {
        await c.query("BEGIN");
        await c.query(`SELECT * FROM idemq.${fn}($1::jsonb)`, [JSON.stringify(filter)]);
        await c.query("ROLLBACK");
      });
      console.log(`  ${what.padEnd(38)} ${fmt(t)}`);
    } finally {
      c.release();
    }
  }
}

/** utime + stime of a process, in ms (the backend's CPU: PostgreSQL runs on this machine). */
function cpuMs(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(rest[11]) + Number(rest[12])) * 10;
}

/**
 * What an index costs a job's life: --jobs jobs (keyed every tenth, as
 * search builds them) enqueued by enqueue_many, then claimed 100 at a time
 * and completed (complete_many) by one connection, without the --index
 * indexes and with them (created for the round on the retained table and
 * dropped after), alternating for --runs rounds. Per job: the backend's CPU
 * (/proc, so run it on the database's machine) and the WAL written. The
 * jobs it makes are deleted.
 */
async function indexCost() {
  const JOBS = Number(option("--jobs", "10000"));
  const defs = args.flatMap((a, i) => (args[i - 1] === "--index" ? [a] : []));
  const indexes = defs.length > 0 ? defs : ["USING gin (payload jsonb_path_ops)"];
  const c = await pool.connect();
  const pid = (await c.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
  const jobs = JSON.stringify(Array.from({ length: JOBS }, (_, i) => ({
    task: `bench_index_${i % 20}`, queue: "bench_index", payload: { n: i, customer: i % 100, region: "r1" },
    ...(i % 10 === 0 ? { idempotency_key: `bench-index:${i}:${Date.now()}` } : {}),
  })));
  const life = async () => {
    const cpu0 = cpuMs(pid);
    const lsn0 = (await c.query("SELECT pg_current_wal_insert_lsn() AS l")).rows[0].l;
    await c.query("SELECT count(*) FROM idemq.enqueue_many($1::jsonb)", [jobs.replaceAll("bench-index:", `bench-index:${Math.random()}:`)]);
    for (;;) {
      const { rows } = await c.query(
        `WITH c AS (SELECT * FROM idemq.claim(worker_id => 'bench-index', queues => '{bench_index}', batch_size => 100))
         SELECT coalesce(array_agg(c.job_id), '{}') AS ids, coalesce(array_agg(c.attempt), '{}') AS attempts, count(*)::int AS n FROM c`);
      if (rows[0].n === 0) break;
      await c.query("SELECT count(*) FROM idemq.complete_many($1::bigint[], $2::int[])", [rows[0].ids, rows[0].attempts]);
    }
    const { rows: [w] } = await c.query("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1) AS bytes", [lsn0]);
    const cpu = cpuMs(pid) - cpu0;
    await c.query("DELETE FROM idemq.jobs WHERE queue = 'bench_index'");
    await c.query("DELETE FROM idemq.keys WHERE key LIKE 'bench-index:%'");
    return { cpuUs: (cpu * 1000) / JOBS, walBytes: Number(w.bytes) / JOBS };
  };
  try {
    await life(); // warm up
    const rounds = { without: [], with: [] };
    for (let i = 0; i < RUNS; i++) {
      rounds.without.push(await life());
      for (const [k, d] of indexes.entries()) await c.query(`CREATE INDEX bench_jobs_index_${k} ON idemq.jobs ${d}`);
      try {
        rounds.with.push(await life());
      } finally {
        for (const k of indexes.keys()) await c.query(`DROP INDEX idemq.bench_jobs_index_${k}`);
      }
    }
    const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const line = (name, r) =>
      `  ${name.padEnd(8)} ${med(r.map((x) => x.cpuUs)).toFixed(0).padStart(5)} us CPU/job (${r.map((x) => x.cpuUs.toFixed(0)).join(", ")}), ` +
      `${med(r.map((x) => x.walBytes)).toFixed(0).padStart(5)} WAL bytes/job`;
    console.log(`a job's life (enqueue_many of ${JOBS.toLocaleString("en-US")}, claim 100 + complete_many), medians of ${RUNS} rounds; indexes: ${indexes.join("; ")}`);
    console.log(line("without", rounds.without));
    console.log(line("with", rounds.with));
    console.log(`  CPU x${(med(rounds.with.map((x) => x.cpuUs)) / med(rounds.without.map((x) => x.cpuUs))).toFixed(3)}, WAL x${(med(rounds.with.map((x) => x.walBytes)) / med(rounds.without.map((x) => x.walBytes))).toFixed(3)}`);
  } finally {
    c.release();
  }
}

try {
  if (mode === "search") await search();
  else await indexCost();
} finally {
  await pool.end();
}
