#!/usr/bin/env node
// The worker's hot calls sent unnamed against as named prepared statements
// (src/worker/prepared-calls.ts; read in bench/FINDINGS.md, "The claim's
// round trip (issue 29)"). Not a test: it writes jobs into the database you
// name, so give it a migrated database of its own, and build dist/ first:
//
//   npm run build
//   createdb -h 127.0.0.1 -U postgres bench_prepared
//   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/bench_prepared
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_prepared node bench/claim-prepared.mjs [--calls N] [--rounds N]
//
// A connection per mode (a pool of one, as the worker's calls see theirs), the
// worker's own call modules (dist/sql, dist/worker/prepared-calls.js) with
// the worker's arguments (batch_size 500, a lease, its tasks, a token), each
// step of each shape sent once unnamed and once prepared, alternating (so the
// machine's load falls on both alike), --calls measured steps per mode
// (after 50 unmeasured), shape and round:
//   idle      claim on an empty queue (no row, no write: no commit to flush);
//   one job   enqueue one (unmeasured), then claim it, then complete_many it;
//   backlog   claim one job (batch_size 1) from a backlog, then heartbeat it.
// Each mode has a connection of its own, so its backend's CPU (from
// /proc/<pid>/stat: the server must run on this machine; ticks of 10 ms, so
// keep --calls in the thousands) is the mode's: less at the mercy of the
// machine's load than the round trips. Prints each call's p50 and p90 and
// each step's backend CPU per round and mode, then medians over rounds.
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import pg from "pg";
import * as sql from "../dist/sql/index.js";
import { PreparedCalls } from "../dist/worker/prepared-calls.js";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1];
};
const CALLS = Number(option("--calls", "2000"));
const ROUNDS = Number(option("--rounds", "3"));
const WARMUP = 50;
const TASK = "claim-prepared";
if (!process.env.DATABASE_URL) throw new Error("set DATABASE_URL to a migrated database of its own");

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 1 });
const { rows: [{ n: left }] } = await pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE state IN ('enqueued', 'processing')");
if (left > 0) throw new Error(`${left} jobs enqueued or processing: use a database of its own`);

const claimArgs = (batchSize) => ({ workerId: "bench-prepared", batchSize, lease: "5 minutes", tasks: [TASK] });
const enqueue = (count) =>
  pool.query("SELECT count(*) FROM idemq.enqueue_many($1::jsonb)", [JSON.stringify(Array.from({ length: count }, () => ({ task: TASK, payload: {} })))]);

async function timed(fn) {
  const t = performance.now();
  const value = await fn();
  return [performance.now() - t, value];
}

const stats = (ms) => {
  const sorted = [...ms].sort((a, b) => a - b);
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  return { p50: at(0.5), p90: at(0.9) };
};

// One measured step of each shape, given the calls' Queryable; each returns ms per call.
const SHAPES = {
  idle: {
    async step(db) {
      const [ms, jobs] = await timed(() => sql.claim(db, claimArgs(500)));
      if (jobs.length !== 0) throw new Error("idle: the queue is not empty");
      return { claim: ms };
    },
  },
  "one job": {
    async step(db) {
      await enqueue(1);
      const [claimMs, jobs] = await timed(() => sql.claim(db, claimArgs(500)));
      if (jobs.length !== 1) throw new Error(`one job: claimed ${jobs.length}`);
      const [completeMs] = await timed(() => sql.completeClaimed(db, jobs.map((job) => ({ job }))));
      return { claim: claimMs, complete_many: completeMs };
    },
  },
  backlog: {
    async before(steps) {
      await enqueue(steps);
    },
    async step(db, held) {
      const [claimMs, jobs] = await timed(() => sql.claim(db, claimArgs(1)));
      if (jobs.length !== 1) throw new Error(`backlog: claimed ${jobs.length}`);
      const attempts = jobs.map((j) => ({ jobId: j.id, attempt: j.attempt, leaseToken: j.leaseToken }));
      const [beatMs] = await timed(() => sql.heartbeat(db, attempts, { lease: "5 minutes" }));
      held.push(...jobs);
      return { claim: claimMs, heartbeat: beatMs };
    },
  },
};

// Each mode on a connection of its own, so each backend's CPU is that mode's.
const modes = await Promise.all(
  [false, true].map(async (prepared) => {
    const own = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 1 });
    const { rows: [{ pid }] } = await own.query("SELECT pg_backend_pid() AS pid");
    const db = new PreparedCalls(own, () => {
      throw new Error("a prepared statement was gone");
    });
    db.decide(prepared);
    return { name: prepared ? "prepared" : "unnamed", db, pool: own, pid };
  }),
);
/** Backend CPU (utime + stime, /proc/<pid>/stat: the server must run on this machine) in seconds; ticks of 10 ms. */
const cpuSeconds = (pid) => {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
};

const { rows: [{ version }] } = await pool.query("SELECT current_setting('server_version') AS version");
console.log(`PostgreSQL ${version}, ${CALLS} steps per shape, mode and round (after ${WARMUP}), ${ROUNDS} rounds; the modes alternate step by step`);
console.log("| round | shape | call | unnamed p50 | prepared p50 | unnamed p90 | prepared p90 | backend CPU per step, µs: unnamed | prepared |");
console.log("|---|---|---|---|---|---|---|---|---|");
const p50s = {};
const cpus = {};
for (let round = 1; round <= ROUNDS; round++) {
  for (const [shape, { before, step }] of Object.entries(SHAPES)) {
    const ms = {};
    const held = [];
    await before?.(2 * (WARMUP + CALLS));
    const cpu = {};
    for (let i = 0; i < WARMUP + CALLS; i++) {
      if (i === WARMUP) for (const mode of modes) cpu[mode.name] = cpuSeconds(mode.pid);
      // Which mode goes first alternates too, so neither always follows the other.
      for (const mode of i % 2 === 0 ? modes : [...modes].reverse()) {
        const times = await step(mode.db, held);
        if (i < WARMUP) continue;
        for (const [call, t] of Object.entries(times)) ((ms[call] ??= { unnamed: [], prepared: [] })[mode.name]).push(t);
      }
    }
    for (const mode of modes) cpu[mode.name] = ((cpuSeconds(mode.pid) - cpu[mode.name]) / CALLS) * 1e6;
    // Done, so the next round starts from an empty queue.
    for (let i = 0; i < held.length; i += 500) await sql.completeClaimed(pool, held.slice(i, i + 500).map((job) => ({ job })));
    for (const [call, { unnamed, prepared }] of Object.entries(ms)) {
      const [u, p] = [stats(unnamed), stats(prepared)];
      console.log(`| ${round} | ${shape} | ${call} | ${u.p50.toFixed(3)} | ${p.p50.toFixed(3)} | ${u.p90.toFixed(3)} | ${p.p90.toFixed(3)} | ${cpu.unnamed.toFixed(0)} | ${cpu.prepared.toFixed(0)} |`);
      (p50s[`${shape} | ${call}`] ??= []).push([u.p50, p.p50]);
    }
    (cpus[shape] ??= []).push([cpu.unnamed, cpu.prepared]);
  }
}
console.log("\nmedian over rounds of each round's p50, ms:\n");
console.log("| shape | call | unnamed | prepared | saved |");
console.log("|---|---|---|---|---|");
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];
for (const [key, rounds] of Object.entries(p50s)) {
  const [u, p] = [median(rounds.map((r) => r[0])), median(rounds.map((r) => r[1]))];
  console.log(`| ${key} | ${u.toFixed(3)} | ${p.toFixed(3)} | ${(u - p).toFixed(3)} |`);
}
console.log("\nbackend CPU per step (all its calls), µs, median over rounds:\n");
console.log("| shape | unnamed | prepared | saved |");
console.log("|---|---|---|---|");
for (const [shape, rounds] of Object.entries(cpus)) {
  const [u, p] = [median(rounds.map((r) => r[0])), median(rounds.map((r) => r[1]))];
  console.log(`| ${shape} | ${u.toFixed(0)} | ${p.toFixed(0)} | ${(u - p).toFixed(0)} |`);
}
await Promise.all([pool, ...modes.map((m) => m.pool)].map((p) => p.end()));
