// npm run bench -- profile [--concurrency N] [--jobs N] [--task noop|ledger] [--hold-xmin] [--jobs-per-key N]
//
// Where idemq's processing time goes, for whoever optimises it: one worker run
// (as in the process.* workloads) with track_functions on, then
//   - throughput, worker and backend CPU, worker round trips per job;
//   - per SQL function: calls, jobs per call, total and per-job time;
//   - row updates of idemq's tables and how many were HOT;
//   - the plans (EXPLAIN ANALYZE with buffers and WAL, via auto_explain's
//     nested statements) of one claim() and one complete_many() made while
//     other jobs are in flight, as in a busy worker.

import { parseArgs } from "node:util";
import pg from "pg";
import { spawnWorker } from "./child.ts";
import { adminClient, createDatabase, databaseUrl, dropMadeDatabases, dropMadeDatabasesOnSignal, runDatabase, serverUrl, withClient } from "./db.ts";
import { lockBenchRuns } from "./run-lock.ts";
import { SYSTEMS } from "./systems/index.ts";
import { LEDGER_TASK, NOOP_TASK } from "./systems/types.ts";
import * as sql from "../dist/sql/index.js"; // the compiled package, as bench/systems/idemq.ts

const { values: args } = parseArgs({
  args: process.argv.slice(2).filter((a) => a !== "profile"),
  options: {
    concurrency: { type: "string", default: "10" },
    jobs: { type: "string", default: "20000" },
    task: { type: "string", default: NOOP_TASK },
    "hold-xmin": { type: "boolean", default: false },
    // Concurrency keys (K = 1) of N consecutive jobs each, as process.keys enqueues them.
    "jobs-per-key": { type: "string", default: "0" },
  },
});
const concurrency = Number(args.concurrency);
const jobs = Number(args.jobs);
const task = args.task === LEDGER_TASK ? LEDGER_TASK : NOOP_TASK;
const jobsPerKey = Number(args["jobs-per-key"]);
const DB = runDatabase("bench_profile");

const server = serverUrl();
const log = (line: string) => process.stderr.write(line + "\n");
dropMadeDatabasesOnSignal(server, log);
const releaseLock = await lockBenchRuns(server, log);
const admin = await adminClient(server);
const url = databaseUrl(server, DB);
const idemq = SYSTEMS.idemq;
const out = (line = "") => process.stdout.write(line + "\n");

async function enqueue(count: number): Promise<void> {
  if (jobsPerKey > 0) {
    await withClient(url, async (c) => {
      for (let start = 0; start < count; start += 20_000) {
        const n = Math.min(20_000, count - start);
        await sql.enqueueMany(
          c,
          Array.from({ length: n }, (_, k) => ({ task, payload: { i: start + k }, concurrencyKey: `k${Math.floor((start + k) / jobsPerKey)}` })),
        );
      }
    });
    return;
  }
  const producer = await idemq.producer(url, { connections: 1 });
  for (let start = 0; start < count; start += 20_000) {
    const n = Math.min(20_000, count - start);
    await producer.enqueueBulk(Array.from({ length: n }, (_, k) => ({ task, payload: { i: start + k } })));
  }
  await producer.close();
}

try {
  await createDatabase(admin, DB);
  await idemq.setup(url);
  await enqueue(jobs);
  await withClient(url, (c) => c.query("ANALYZE"));

  // --hold-xmin: another session holds a transaction open for the whole run (scale.held-xmin).
  const holder = args["hold-xmin"] ? new pg.Client({ connectionString: url }) : null;
  if (holder) {
    holder.on("error", () => {});
    await holder.connect();
    await holder.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
    await holder.query("SELECT txid_current()");
  }
  // The worker's backends record per-function times (PGOPTIONS reaches every pg connection of the child).
  process.env.PGOPTIONS = `${process.env.PGOPTIONS ?? ""} -c track_functions=all`;
  const child = spawnWorker(
    { system: "idemq", mode: task === LEDGER_TASK ? "transactional" : "batched", concurrency, url, expect: jobs, kind: "throughput", notify: false },
    600_000,
  );
  const result = await child.done.finally(() => child.kill());
  await child.exited;
  delete process.env.PGOPTIONS;
  if (holder) {
    await holder.query("ROLLBACK");
    await holder.end();
  }

  out(`# idemq processing profile: ${jobs} jobs, task ${task}, concurrency ${concurrency}${holder ? ", xmin held" : ""}${jobsPerKey > 0 ? `, keys of ${jobsPerKey} jobs (K = 1)` : ""}`);
  out();
  out(`- throughput: ${(jobs / result.seconds).toFixed(0)} jobs/s`);
  out(`- worker process CPU: ${((result.workerCpuSeconds * 1e6) / jobs).toFixed(1)} µs/job`);
  if (result.backendCpuSeconds !== null) {
    out(`- its PostgreSQL backends CPU: ${((result.backendCpuSeconds * 1e6) / jobs).toFixed(1)} µs/job`);
  }
  out(`- worker round trips: ${(result.statements / jobs).toFixed(3)} per job`);

  await withClient(url, async (c) => {
    // Backends flush their statistics when they exit, just after the child.
    for (let i = 0; i < 50; i++) {
      const { rows } = await c.query(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
      );
      if ((rows[0] as { n: number }).n === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    await new Promise((r) => setTimeout(r, 1200));
    const fns = await c.query(
      `SELECT schemaname || '.' || funcname AS fn, calls, total_time, self_time FROM pg_stat_user_functions
       WHERE schemaname = 'idemq' ORDER BY total_time DESC`,
    );
    out();
    out("| function | calls | jobs per call | total ms | self ms | µs per job |");
    out("|---|---|---|---|---|---|");
    for (const f of fns.rows as { fn: string; calls: string; total_time: number; self_time: number }[]) {
      const calls = Number(f.calls);
      out(`| ${f.fn} | ${calls} | ${(jobs / calls).toFixed(1)} | ${f.total_time.toFixed(1)} | ${f.self_time.toFixed(1)} | ${((f.total_time * 1000) / jobs).toFixed(1)} |`);
    }
    const tables = await c.query(
      `SELECT schemaname || '.' || relname AS t, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
       FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY 1`,
    );
    out();
    out("| table | inserts | updates | of which HOT | deletes |");
    out("|---|---|---|---|---|");
    for (const t of tables.rows as Record<string, string>[]) {
      out(`| ${t.t} | ${t.n_tup_ins} | ${t.n_tup_upd} | ${t.n_tup_hot_upd} | ${t.n_tup_del} |`);
    }
  });

  // Plans of one claim and one complete_many while 2 x concurrency other jobs are in flight.
  const batch = 2 * concurrency;
  await enqueue(4 * batch);
  await withClient(url, async (c) => {
    await c.query("ANALYZE");
    await c.query(`SELECT count(*) FROM idemq.claim(worker_id => 'other', batch_size => ${batch})`);
    await c.query("LOAD 'auto_explain'");
    for (const setting of [
      "auto_explain.log_min_duration = 0",
      "auto_explain.log_nested_statements = on",
      "auto_explain.log_analyze = on",
      "auto_explain.log_buffers = on",
      "auto_explain.log_wal = on",
      "client_min_messages = log",
    ]) {
      await c.query(`SET ${setting}`);
    }
    const plans: string[] = [];
    c.on("notice", (msg: { message?: string }) => {
      if (msg.message && /plan:/.test(msg.message) && /Query Text: (WITH|UPDATE|INSERT|SELECT j|SELECT h)/.test(msg.message)) {
        plans.push(msg.message);
      }
    });
    const claimed = await c.query(`SELECT job_id AS id, attempt, lease_token FROM idemq.claim(worker_id => 'profile', batch_size => ${batch})`);
    const ids = claimed.rows.map((r: { id: string }) => r.id);
    const attempts = claimed.rows.map((r: { attempt: number }) => r.attempt);
    const tokens = claimed.rows.map((r: { lease_token: string }) => r.lease_token);
    await c.query("SELECT count(*) FROM idemq.complete_many($1::bigint[], $2::int[], $3::uuid[])", [ids, attempts, tokens]);
    out();
    out(`## Plans: claim(batch_size ${batch}) and complete_many of those, ${batch} other jobs in flight`);
    for (const plan of plans) {
      out();
      out("```");
      out(plan.replace(/^duration: [\d.]+ ms\s+plan:\n?/, ""));
      out("```");
    }
  });
} finally {
  await dropMadeDatabases(admin);
  await admin.end();
  await releaseLock();
}
