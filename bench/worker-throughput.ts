// Throughput of one idemq worker process (this one), not a test:
//   plain tasks          a no-op handler; completions batched by complete_many
//   transactional tasks  BEGIN; guard(key); INSERT one ledger row; complete(); COMMIT
// For each, 20,000 jobs are enqueued first (enqueue_many), then a worker with
// the given concurrency starts, and the clock runs until the last job is done.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npx tsx bench/worker-throughput.ts [--jobs 20000] [--concurrency 10,50]
//
// It creates (and drops) a database of its own on that server.
import { parseArgs } from "node:util";
import pg from "pg";
import { Client, createWorker, type Tasks } from "../src/index.ts";
import { databaseUrl } from "../src/embedded/server.ts";
import { migrate } from "../src/migrate.ts";

const { values } = parseArgs({
  options: { jobs: { type: "string", default: "20000" }, concurrency: { type: "string", default: "10,50" } },
});
const JOBS = Number(values.jobs);
const CONCURRENCIES = values.concurrency.split(",").map(Number);
const server = process.env.DATABASE_URL;
if (!server) {
  console.error("Set DATABASE_URL to a PostgreSQL server; the benchmark creates its own database there.");
  process.exit(2);
}

const dbName = `idemq_bench_worker_${process.pid}`;
const admin = new pg.Client({ connectionString: server });
await admin.connect();
await admin.query(`DROP DATABASE IF EXISTS ${dbName}`);
await admin.query(`CREATE DATABASE ${dbName}`);
const url = databaseUrl(server, dbName);

try {
  await migrate({ connectionString: url });
  // Client.close() keeps its error listener on the pool it owns: the DROP below may still reach a closing connection.
  const client = new Client({ connectionString: url, poolConfig: { max: 2 } });
  await client.pool.query("CREATE TABLE public.bench_ledger (n int NOT NULL)");

  const tasks: Tasks = {
    noop: async () => {},
    credit: {
      transactional: true,
      guardKey: (p: { n: number }) => `bench-credit:${p.n}`,
      run: async (p: { n: number }, ctx) => {
        await ctx.tx.query("INSERT INTO public.bench_ledger (n) VALUES ($1)", [p.n]);
      },
    },
  };

  const rows: string[] = [];
  for (const task of ["noop", "credit"] as const) {
    for (const concurrency of CONCURRENCIES) {
      await client.pool.query(
        "TRUNCATE idemq.jobs, idemq.job_steps, idemq.keys, idemq.processed, idemq.counters, public.bench_ledger",
      );
      for (let i = 0; i < JOBS; i += 5000) {
        await client.enqueueMany(
          Array.from({ length: Math.min(5000, JOBS - i) }, (_, k) => ({ task, payload: { n: i + k } })),
        );
      }
      await client.pool.query("VACUUM ANALYZE idemq.jobs");

      const worker = createWorker({ connectionString: url, concurrency, tasks, handleSignals: false });
      let done = 0;
      let errors = 0;
      let finish!: () => void;
      const finished = new Promise<void>((resolve) => (finish = resolve));
      const count = () => {
        if (++done === JOBS) finish();
      };
      worker.on("job:success", count);
      worker.on("job:duplicate", count);
      worker.on("job:failed", count);
      worker.on("job:retry", () => errors++);
      worker.on("job:lease-lost", () => errors++);
      worker.on("worker:error", ({ error }) => {
        errors++;
        console.error(error.message);
      });
      const cpu = process.cpuUsage();
      const started = performance.now();
      await worker.start();
      await finished;
      const seconds = (performance.now() - started) / 1000;
      const used = process.cpuUsage(cpu);
      await worker.stop();
      const { rows: left } = await client.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM idemq.jobs WHERE state <> 'succeeded'",
      );
      rows.push(
        [
          task === "noop" ? "plain (no-op)" : "transactional",
          String(concurrency),
          String(JOBS),
          seconds.toFixed(2),
          String(Math.round(JOBS / seconds)),
          ((used.user + used.system) / 1e6 / seconds).toFixed(2),
          String(errors + left[0]!.n),
        ].join(" | "),
      );
      console.error(`done: ${rows.at(-1)}`);
    }
  }
  await client.close();
  console.log("| task | concurrency | jobs | seconds | jobs/s | worker CPU (cores) | retries, errors, left |");
  console.log("|---|---|---|---|---|---|---|");
  for (const row of rows) console.log(`| ${row} |`);
} finally {
  await admin.query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
  await admin.end();
}
