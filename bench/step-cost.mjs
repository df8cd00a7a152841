#!/usr/bin/env node
// Where a transactional step's backend CPU goes (issue 28 item 8; read in
// bench/FINDINGS.md, "Durable steps: where a step's cost goes"). Not a test:
// it writes jobs and steps into the database you name, so give it a migrated
// database of its own:
//
//   createdb -h 127.0.0.1 -U postgres bench_steps
//   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/bench_steps
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_steps node bench/step-cost.mjs [--steps N] [--runs N]
//
// One connection, one held job (enqueue_many + claim), then --steps calls
// (after 50 unmeasured) of each shape, --runs times in turn: what ctx.step
// sends (BEGIN; step_record; COMMIT) with synchronous_commit on and off,
// step_record alone (every call in one transaction: no commit per step),
// and an empty transaction (BEGIN; SELECT 1; COMMIT: no xid, no WAL flush).
// Backend CPU is utime + stime from /proc/<pid>/stat (the server must run on
// this machine), in clock ticks of 10 ms: keep --steps in the thousands.
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import pg from "pg";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at === -1 ? fallback : args[at + 1];
};
const STEPS = Number(option("--steps", "2000"));
const RUNS = Number(option("--runs", "2"));
if (!process.env.DATABASE_URL) throw new Error("set DATABASE_URL to a migrated database of its own");

const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
await client.connect();
const pid = (await client.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
const cpuSeconds = () => {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
};

async function heldJob() {
  await client.query(`SELECT count(*) FROM idemq.enqueue_many('[{"task":"step-cost","payload":{}}]'::jsonb)`);
  const { rows } = await client.query(
    "SELECT id, attempt, lease_token FROM idemq.claim('step-cost', tasks => ARRAY['step-cost'], batch_size => 1, token => true)",
  );
  if (rows.length !== 1) throw new Error("no job claimed: use a database of its own");
  return rows[0];
}

const record = (job, name) =>
  client.query("SELECT idemq.step_record($1, $2, $3, $4::jsonb, $5)", [job.id, job.attempt, name, "1", job.lease_token]);
const inTransaction = async (job, name) => {
  await client.query("BEGIN");
  await record(job, name);
  await client.query("COMMIT");
};

const SHAPES = [
  { label: "BEGIN; step_record; COMMIT, synchronous_commit on (what ctx.step sends)", step: inTransaction },
  { label: "BEGIN; step_record; COMMIT, synchronous_commit off", setup: "SET synchronous_commit = off", reset: "RESET synchronous_commit", step: inTransaction },
  { label: "step_record alone, every call in one transaction", setup: "BEGIN", reset: "COMMIT", step: record },
  {
    label: "BEGIN; SELECT 1; COMMIT (no write: no xid, no WAL flush)",
    step: async () => {
      await client.query("BEGIN");
      await client.query("SELECT 1");
      await client.query("COMMIT");
    },
  },
];

const results = new Map(SHAPES.map((s) => [s.label, { cpu: [], wall: [] }]));
for (let run = 0; run < RUNS; run++) {
  for (const shape of SHAPES) {
    const job = await heldJob();
    if (shape.setup) await client.query(shape.setup);
    let k = 0;
    for (let i = 0; i < 50; i++) await shape.step(job, `warm-${k++}`);
    const cpu0 = cpuSeconds();
    const t0 = performance.now();
    for (let i = 0; i < STEPS; i++) await shape.step(job, `s-${k++}`);
    const r = results.get(shape.label);
    r.cpu.push(((cpuSeconds() - cpu0) * 1e6) / STEPS);
    r.wall.push(((performance.now() - t0) * 1e3) / STEPS);
    if (shape.reset) await client.query(shape.reset);
  }
}
await client.query("DELETE FROM idemq.jobs WHERE task = 'step-cost'");
await client.end();

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log(`${STEPS} steps per run, ${RUNS} runs, medians (per run)`);
console.log("| shape | backend CPU µs/step | wall µs/step |");
console.log("|---|---:|---:|");
for (const [label, r] of results) {
  console.log(`| ${label} | ${median(r.cpu).toFixed(0)} (${r.cpu.map((x) => x.toFixed(0)).join(", ")}) | ${median(r.wall).toFixed(0)} (${r.wall.map((x) => x.toFixed(0)).join(", ")}) |`);
}
