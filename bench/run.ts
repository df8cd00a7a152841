// npm run bench [-- --json] [--quick] [--scale] [--rounds N] [--only a,b]
//
// Runs every workload for idemq, Graphile Worker, pg-boss and the raw-SQL
// baseline on one PostgreSQL server (DATABASE_URL, else the machine's
// postgres://postgres@127.0.0.1:5432), systems interleaved within each round,
// each measurement in a fresh database, and prints medians, min-max and the
// ratios idemq/peer per round. Runs under Node 22 (bench/launch.mjs).

import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import os from "node:os";
import { parseArgs } from "node:util";
import { adminClient, createDatabase, databaseUrl, dropMadeDatabases, dropMadeDatabasesOnSignal, runDatabase, serverFacts, serverUrl, withClient } from "./db.ts";
import { buildReport, toMarkdown, type Sample } from "./report.ts";
import { lockBenchRuns } from "./run-lock.ts";
import { SYSTEMS } from "./systems/index.ts";
import type { SystemName } from "./systems/types.ts";
import { FULL_SIZES, QUICK_SIZES, type Context, type Workload } from "./workloads/common.ts";
import { enqueueWorkloads } from "./workloads/enqueue.ts";
import { latencyWorkload } from "./workloads/latency.ts";
import { manyQueuesWorkload } from "./workloads/many-queues.ts";
import { flowWorkloads } from "./workloads/flow.ts";
import { processWorkloads } from "./workloads/process.ts";
import { scaleWorkloads } from "./workloads/scale.ts";
import { shareWorkload } from "./workloads/share.ts";
import { stepsWorkload } from "./workloads/steps.ts";

const USAGE = `usage: npm run bench -- [--json] [--quick] [--scale] [--rounds N] [--only id,id]
       npm run bench -- profile [--concurrency N] [--jobs N] [--task noop|ledger] [--hold-xmin]   (bench/profile.ts)
  --json       print the report as JSON (progress goes to stderr)
  --quick      tiny sizes, one round (CI: proves the harness runs, measures nothing)
  --scale      add the scale rows (1M finished jobs retained; a transaction held open)
  --rounds N   rounds (default 3; --quick: 1)
  --only ids   only workloads whose id starts with one of these (e.g. enqueue,process.c10)
Server: DATABASE_URL, else postgres://postgres@127.0.0.1:5432. Databases bench_*_<pid> are created and dropped.`;

const { values: args } = parseArgs({
  options: {
    json: { type: "boolean", default: false },
    quick: { type: "boolean", default: false },
    scale: { type: "boolean", default: false },
    rounds: { type: "string" },
    only: { type: "string" },
    help: { type: "boolean", default: false },
  },
});
if (args.help) {
  console.log(USAGE);
  process.exit(0);
}

const rounds = args.rounds ? Number(args.rounds) : args.quick ? 1 : 3;
if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds must be a positive integer, not ${args.rounds}`);
const sizes = args.quick ? QUICK_SIZES : FULL_SIZES;
const only = args.only?.split(",").map((s) => s.trim()).filter(Boolean);

let workloads: Workload[] = [
  ...enqueueWorkloads,
  ...processWorkloads,
  ...flowWorkloads,
  stepsWorkload,
  manyQueuesWorkload,
  shareWorkload,
  latencyWorkload,
  ...(args.scale ? scaleWorkloads : []),
];
if (only) workloads = workloads.filter((w) => only.some((prefix) => w.id.startsWith(prefix)));
if (workloads.length === 0) throw new Error(`--only ${args.only} matches no workload`);

const log = (line: string) => process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);
const server = serverUrl();
dropMadeDatabasesOnSignal(server, log);
const releaseLock = await lockBenchRuns(server, log);
const admin = await adminClient(server);
const names = Object.keys(SYSTEMS) as SystemName[];
const templateName = (system: SystemName) => runDatabase(`bench_tpl_${system}`);
const scaleTemplates = new Map<SystemName, Promise<string>>();

async function makeScaleTemplate(system: SystemName): Promise<string> {
  const seed = SYSTEMS[system].seedFinished;
  if (!seed) throw new Error(`${system} has no scale seed`);
  const name = runDatabase(`bench_tpl_${system}_scale`);
  log(`seeding ${name}: ${sizes.scaleFinished} finished jobs, ${sizes.scaleKeys} keys retained`);
  await createDatabase(admin, name, templateName(system));
  await withClient(databaseUrl(server, name), async (client) => {
    await seed(client, sizes.scaleFinished, sizes.scaleKeys);
    await client.query("VACUUM ANALYZE"); // the state autovacuum would leave behind
  });
  return name;
}

const ctx: Context = {
  server,
  admin,
  sizes,
  template: templateName,
  scaleTemplate(system) {
    let made = scaleTemplates.get(system);
    if (!made) scaleTemplates.set(system, (made = makeScaleTemplate(system)));
    return made;
  },
  log,
  timeoutMs: args.quick ? 120_000 : 600_000,
  checkpoints: !args.quick,
};

function packageVersion(name: string): string {
  // The peers are bench/package.json's, in bench/node_modules.
  const url = new URL(name === "idemq" ? "../package.json" : `./node_modules/${name}/package.json`, import.meta.url);
  return (JSON.parse(readFileSync(url, "utf8")) as { version: string }).version;
}

function gitCommit(): string {
  try {
    const sha = execFileSync("git", ["rev-parse", "--short", "HEAD"], { encoding: "utf8" }).trim();
    const dirty = execFileSync("git", ["status", "--porcelain", "--", "src", "sql"], { encoding: "utf8" }).trim();
    return dirty ? `${sha} (+ uncommitted changes in src/ or sql/)` : sha;
  } catch {
    return "unknown";
  }
}

const samples: Sample[] = [];
let failed = false;
const started = new Date();
try {
  for (const system of names) {
    log(`template ${templateName(system)}`);
    await createDatabase(admin, templateName(system));
    await SYSTEMS[system].setup(databaseUrl(server, templateName(system)));
  }
  for (let round = 1; round <= rounds; round++) {
    for (const w of workloads) {
      for (const v of w.variants) {
        log(`round ${round}/${rounds} ${w.id} ${v.label}`);
        try {
          const measured = await w.run(ctx, v, round);
          samples.push({ workload: w.id, variant: v.label, round, ...measured });
        } catch (err) {
          failed = true;
          const message = err instanceof Error ? err.stack ?? err.message : String(err);
          log(`FAILED ${w.id} ${v.label}: ${message}`);
          samples.push({ workload: w.id, variant: v.label, round, metrics: {}, error: message });
        }
      }
    }
  }
} finally {
  // The templates, the scale templates, and a measurement's clone if its own drop failed.
  await dropMadeDatabases(admin).catch((err) => log(`dropping this run's databases failed: ${err instanceof Error ? err.message : String(err)}`));
}

const facts = await serverFacts(admin);
await admin.end();
await releaseLock();
const cpus = os.cpus();
const meta = {
  date: started.toISOString(),
  machine: `${cpus.length} × ${cpus[0]?.model ?? "unknown CPU"}, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB, Linux ${os.release()}`,
  node: process.version,
  postgresql: `${facts.version} (synchronous_commit ${facts.synchronous_commit}, fsync ${facts.fsync}, full_page_writes ${facts.full_page_writes}, shared_buffers ${facts.shared_buffers}, autovacuum ${facts.autovacuum})`,
  versions: `idemq ${packageVersion("idemq")} @ ${gitCommit()}, graphile-worker ${packageVersion("graphile-worker")}, pg-boss ${packageVersion("pg-boss")}, pg ${packageVersion("pg")}`,
  mode: args.quick ? "quick (tiny sizes: proves the harness runs, measures nothing)" : "full",
  rounds,
  sizes,
  duration: `${((Date.now() - started.getTime()) / 60_000).toFixed(1)} min`,
};
const report = buildReport(workloads, samples, rounds, meta);
process.stdout.write(args.json ? JSON.stringify(report, null, 2) + "\n" : toMarkdown(report) + "\n");
process.exitCode = failed ? 1 : 0;
