#!/usr/bin/env node
// What fan-out and fan-in (spawn, wait_for_children, children(); sql/
// functions/children/) cost for one parent with many children, against the
// same jobs enqueued and processed without a parent. Not a test: it writes
// jobs into the database you name, so give it a migrated database of its
// own (the server on this machine: backend CPU is read from /proc):
//
//   createdb -h 127.0.0.1 -U postgres bench_fanout
//   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/bench_fanout
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_fanout node bench/fanout-cost.mjs [--children N] [--results]
//
// Rows, each wall time and the backend's CPU: enqueue_many of N plain jobs
// and spawn of N children (one call each); processing them 100 at a time,
// claim(100) + complete_many (the worker's path for results it need not
// store) and, with --results, claim(100) + complete() with a result per job
// (minutes on a loaded machine: one transaction per job), the children's
// row without the last one; the parent's release (the last child's claim
// and completion, alone); children() reading all N.
import { readFileSync } from "node:fs";
import { loadavg } from "node:os";
import { performance } from "node:perf_hooks";
import pg from "pg";

const args = process.argv.slice(2);
const at = args.indexOf("--children");
const N = Number(at === -1 ? "20000" : args[at + 1]);
const url = process.env.DATABASE_URL;
if (!url) {
  console.error("set DATABASE_URL to a migrated database of its own (see the header of bench/fanout-cost.mjs)");
  process.exit(2);
}

function cpuSeconds(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(rest[11]) + Number(rest[12])) / 100;
}

const client = new pg.Client({ connectionString: url });
await client.connect();
const pid = (await client.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
const rows = [];

async function measure(name, work) {
  const cpu0 = cpuSeconds(pid);
  const t0 = performance.now();
  await work();
  const row = { name, wallMs: Math.round(performance.now() - t0), cpuMs: Math.round((cpuSeconds(pid) - cpu0) * 1000) };
  rows.push(row);
  console.log(`${row.name.padEnd(58)} wall ${String(row.wallMs).padStart(6)} ms   backend CPU ${String(row.cpuMs).padStart(6)} ms`);
}

const tag = `r${Date.now()}`;
const jobs = (queue, named) =>
  JSON.stringify(Array.from({ length: N }, (_, i) => ({ ...(named ? { name: `c${i}` } : {}), task: "work", queue, payload: { i } })));

/** Claims and completes `count` jobs of `queue`, 100 at a time. */
async function processAll(queue, withResults, count) {
  for (let done = 0; done < count; ) {
    const { rows: claimed } = await client.query("SELECT job_id, attempt, lease_token FROM idemq.claim(worker_id => 'bench', queues => ARRAY[$1], batch_size => $2, token => true)", [queue, Math.min(100, count - done)]);
    if (claimed.length === 0) throw new Error(`${queue}: ${count - done} jobs fewer than expected`);
    done += claimed.length;
    if (withResults) {
      for (const j of claimed) {
        await client.query("SELECT idemq.complete(job_id => $1, attempt => $2, result => $3::jsonb, lease_token => $4)", [j.job_id, j.attempt, JSON.stringify({ ok: j.job_id }), j.lease_token]);
      }
    } else {
      await client.query("SELECT idemq.complete_many(job_ids => $1::bigint[], attempts => $2::int[], lease_tokens => $3::uuid[])", [
        claimed.map((j) => j.job_id),
        claimed.map((j) => j.attempt),
        claimed.map((j) => j.lease_token),
      ]);
    }
  }
}

async function parent() {
  const queue = `${tag}-parent-${rows.length}`;
  await client.query("SELECT idemq.enqueue(task => 'parent', queue => $1)", [queue]);
  const { rows: [p] } = await client.query("SELECT job_id, attempt, lease_token FROM idemq.claim(worker_id => 'bench', queues => ARRAY[$1], token => true)", [queue]);
  return p;
}

console.log(`${N} children; load average before: ${loadavg().map((l) => l.toFixed(2)).join(" ")}`);
for (const withResults of args.includes("--results") ? [false, true] : [false]) {
  const how = withResults ? "complete() with a result" : "complete_many";
  const plain = `${tag}-plain-${withResults}`;
  const kids = `${tag}-kids-${withResults}`;
  await measure(`enqueue_many of ${N} plain jobs`, () => client.query("SELECT count(*) FROM idemq.enqueue_many($1::jsonb)", [jobs(plain, false)]));
  const p = await parent();
  await measure(`spawn of ${N} children + wait_for_children`, async () => {
    await client.query("SELECT count(*) FROM idemq.spawn(job_id => $1, attempt => $2, children => $3::jsonb, lease_token => $4)", [p.job_id, p.attempt, jobs(kids, true), p.lease_token]);
    await client.query("SELECT idemq.wait_for_children(job_id => $1, attempt => $2, lease_token => $3)", [p.job_id, p.attempt, p.lease_token]);
  });
  await measure(`process the ${N} plain jobs (claim(100), ${how})`, () => processAll(plain, withResults, N));
  await measure(`process ${N - 1} of the children (claim(100), ${how})`, () => processAll(kids, withResults, N - 1));
  const state = async () => (await client.query("SELECT state FROM idemq.jobs WHERE id = $1", [p.job_id])).rows[0].state;
  if ((await state()) !== "awaiting") throw new Error("the parent was released before its last child finished");
  await measure(`the parent's release: the last child's claim + ${how}`, () => processAll(kids, withResults, 1));
  if ((await state()) !== "enqueued") throw new Error(`the parent is ${await state()}, not released`);
  await measure(`children() of the parent (${N} rows)`, async () => {
    const { rows: out } = await client.query("SELECT * FROM idemq.children(job_id => $1)", [p.job_id]);
    if (out.length !== N || out.some((r) => r.state !== "succeeded")) throw new Error("children() is wrong");
  });
}
console.log(`load average after: ${loadavg().map((l) => l.toFixed(2)).join(" ")}`);
await client.end();
