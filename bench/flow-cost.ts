// What flow control costs the claim (issue 26, item 9), as a tight SQL loop
// with no worker in between: N no-op jobs enqueued (untimed), then one
// connection runs claim(batch_size => 100, token => true) + complete_many
// until the queue is empty (timed), per configuration, rounds interleaved so
// drift hits each alike; the median of the rounds is reported.
//
//   node --import tsx bench/flow-cost.ts [--base <commit>] [--jobs 20000] [--rounds 5]
//
// Configurations: `base`, the schema of <commit> (default: the commit before
// the flow-control work), and this checkout's schema with no limit, with a
// limit on another task only (idemq.limits has a row: the gate runs, no scope
// of these jobs), and with a non-binding concurrency limit (1000) on the jobs'
// task. Each has a database of its own on the server of DATABASE_URL.
// Results: bench/FINDINGS.md, "Flow control: what a limited claim costs".
import { execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import pg from "pg";
import { databaseUrl } from "../src/embedded/server.ts";
import { migrate } from "../src/migrate.ts";

const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i]!.replace(/^--/, ""), process.argv[i + 1]!);
const BASE = args.get("base") ?? "dff6cd6";
const JOBS = Number(args.get("jobs") ?? 20_000);
const ROUNDS = Number(args.get("rounds") ?? 5);
const BATCH = 100;
const TASK = "noop";
const server = process.env.DATABASE_URL;
if (server === undefined) throw new Error("set DATABASE_URL to a server to create the bench databases on");

interface Config {
  name: string;
  migrationsDir?: string;
  setup?: string;
}

const ROOT = resolve(import.meta.dirname, "..");
const baseDir = mkdtempSync(join(tmpdir(), "idemq-flow-cost-"));
execFileSync("sh", ["-c", `git -C '${ROOT}' archive '${BASE}' sql/migrations | tar -x -C '${baseDir}'`]);

const CONFIGS: Config[] = [
  { name: "base", migrationsDir: join(baseDir, "sql", "migrations") },
  { name: "no limit" },
  { name: "limit elsewhere", setup: "SELECT idemq.set_limit(task => 'other', concurrency => 5)" },
  { name: "limit 1000", setup: `SELECT idemq.set_limit(task => '${TASK}', concurrency => 1000)` },
];

async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: server });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

const dbs: { config: Config; name: string; client: pg.Client }[] = [];
for (const [i, config] of CONFIGS.entries()) {
  const name = `idemq_flow_cost_${i}`;
  await admin(async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await c.query(`CREATE DATABASE ${name}`);
  });
  const url = databaseUrl(server, name);
  await migrate({ connectionString: url, ...(config.migrationsDir ? { migrationsDir: config.migrationsDir } : {}) });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  if (config.setup) await client.query(config.setup);
  dbs.push({ config, name, client });
}

async function round(client: pg.Client): Promise<number> {
  await client.query("TRUNCATE idemq.jobs CASCADE");
  for (let start = 0; start < JOBS; start += 5000) {
    const chunk = Array.from({ length: Math.min(5000, JOBS - start) }, (_, k) => ({ task: TASK, payload: { i: start + k } }));
    await client.query("SELECT count(*) FROM idemq.enqueue_many($1::jsonb)", [JSON.stringify(chunk)]);
  }
  await client.query("VACUUM ANALYZE idemq.jobs");
  const started = process.hrtime.bigint();
  let done = 0;
  for (;;) {
    const { rows } = await client.query<{ job_id: string; attempt: number; lease_token: string }>(
      "SELECT id AS job_id, attempt, lease_token FROM idemq.claim('bench', tasks => ARRAY[$1], batch_size => $2, token => true)",
      [TASK, BATCH],
    );
    if (rows.length === 0) break;
    await client.query("SELECT count(*) FROM idemq.complete_many($1::bigint[], $2::int[], $3::uuid[])", [
      rows.map((r) => r.job_id),
      rows.map((r) => r.attempt),
      rows.map((r) => r.lease_token),
    ]);
    done += rows.length;
  }
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  if (done !== JOBS) throw new Error(`claimed ${done} of ${JOBS}`);
  return ms;
}

const times = new Map<string, number[]>(CONFIGS.map((c) => [c.name, []]));
for (let r = 0; r < ROUNDS; r++) {
  // Rotate the order each round.
  for (let k = 0; k < dbs.length; k++) {
    const db = dbs[(r + k) % dbs.length]!;
    const ms = await round(db.client);
    times.get(db.config.name)!.push(ms);
    console.error(`round ${r + 1} ${db.config.name}: ${ms.toFixed(0)} ms`);
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const base = median(times.get("base")!);
console.log(`claim(${BATCH}) + complete_many over ${JOBS} jobs, ${ROUNDS} rounds, median (base ${BASE}):`);
console.log("| configuration | median ms | µs/job | vs base | rounds (ms) |");
console.log("|---|---:|---:|---:|---|");
for (const [name, xs] of times) {
  const m = median(xs);
  console.log(`| ${name} | ${m.toFixed(0)} | ${((m * 1000) / JOBS).toFixed(1)} | ${(m / base).toFixed(3)} | ${xs.map((x) => x.toFixed(0)).join(", ")} |`);
}
for (const db of dbs) {
  await db.client.end();
  await admin((c) => c.query(`DROP DATABASE IF EXISTS ${db.name} WITH (FORCE)`));
}
