#!/usr/bin/env node
// What refusing an oversized payload costs the server: wall time and the
// backend's peak memory (VmHWM from /proc/<pid>/status, so the server must
// run on this machine), each call on a fresh connection so its peak is its
// own. Not a test; it enqueues nothing (every call is refused), but give it
// a migrated database of its own all the same:
//
//   createdb -h 127.0.0.1 -U postgres bench_refusal
//   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/bench_refusal
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_refusal node bench/payload-refusal.mjs [--mb 100] [--runs 3]
//
// Rows: the text parameter received and measured (the floor: the bytes
// arrive whatever the function does), the same text parsed as jsonb (what
// PostgreSQL does before any function can look at a jsonb argument), parsed
// and printed once (what the refusal's message needs: the exact size of the
// JSON text), then enqueue() refusing it, the one-element array enqueue_many
// gets built (in SQL, by concatenation) and parsed, and enqueue_many()
// refusing it. Two shapes of payload: many
// small objects (parsing builds a value per field) and one long string.
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import pg from "pg";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1];
};
const MB = Number(option("--mb", "100"));
const RUNS = Number(option("--runs", "3"));
const url = process.env.DATABASE_URL;
if (!url) {
  console.error("set DATABASE_URL to a migrated database of its own (see the header of bench/payload-refusal.mjs)");
  process.exit(2);
}

const kib = (line) => Number(/(\d+) kB/.exec(line)?.[1] ?? NaN);
function memory(pid) {
  const status = readFileSync(`/proc/${pid}/status`, "utf8").split("\n");
  return { hwm: kib(status.find((l) => l.startsWith("VmHWM")) ?? ""), rss: kib(status.find((l) => l.startsWith("VmRSS")) ?? "") };
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

function payloads() {
  const bytes = MB * 1024 * 1024;
  const item = JSON.stringify({ id: 123456, name: "item name", tags: ["a", "b"], price: 12.5 });
  const many = `{"items": [${Array.from({ length: Math.ceil(bytes / (item.length + 2)) }, () => item).join(", ")}]}`;
  const string = JSON.stringify({ blob: "x".repeat(bytes) });
  return { "many small objects": many, "one long string": string };
}

async function once(sql, values) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query("SELECT pg_backend_pid() AS pid");
    const pid = rows[0].pid;
    const before = memory(pid);
    const t0 = performance.now();
    let code = "ok";
    try {
      await client.query(sql, values);
    } catch (error) {
      code = error.code ?? "error";
    }
    const ms = performance.now() - t0;
    const after = memory(pid);
    return { ms, peakMb: after.hwm / 1024, addedMb: (after.hwm - before.rss) / 1024, code };
  } finally {
    await client.end();
  }
}

const { rows: [info] } = await (async () => {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const r = await c.query("SELECT version() AS version, (SELECT value FROM idemq.settings WHERE name = 'payload_bytes') AS limit");
  await c.end();
  return r;
})();
console.log(`${info.version.split(" on ")[0]}; payload_bytes ${info.limit}; payloads of ${MB} MiB; median of ${RUNS} fresh connections each`);
for (const [shape, text] of Object.entries(payloads())) {
  const calls = [
    ["text received (octet_length($1::text))", "SELECT octet_length($1::text)", [text]],
    ["parsed as jsonb (pg_column_size($1::jsonb))", "SELECT pg_column_size($1::jsonb)", [text]],
    ["parsed and printed once (octet_length($1::jsonb::text))", "SELECT octet_length($1::jsonb::text)", [text]],
    ["enqueue(task, payload)", "SELECT * FROM idemq.enqueue($1, $2::jsonb)", ["bench_task", text]],
    ["the enqueue_many array built and parsed", `SELECT pg_column_size(('[{"task": "bench_task", "payload": ' || $1::text || '}]')::jsonb)`, [text]],
    ["enqueue_many([{task, payload}])", `SELECT * FROM idemq.enqueue_many(('[{"task": "bench_task", "payload": ' || $1::text || '}]')::jsonb)`, [text]],
  ];
  for (const [name, sql, values] of calls) {
    const runs = [];
    for (let i = 0; i < RUNS; i++) runs.push(await once(sql, values));
    console.log(
      `${shape}, ${name}: ${median(runs.map((r) => r.ms)).toFixed(0)} ms, backend peak ${median(runs.map((r) => r.peakMb)).toFixed(0)} MB ` +
        `(+${median(runs.map((r) => r.addedMb)).toFixed(0)} MB over its start), ${runs[0].code}`,
    );
  }
}
