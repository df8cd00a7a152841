// Diagnostic (not committed): per-function time of idemq's SQL during a processing run.
import { spawnWorker } from "../child.ts";
import { adminClient, createDatabase, databaseUrl, dropDatabase, withClient } from "../db.ts";
import { SYSTEMS } from "../systems/index.ts";
const conc = Number(process.argv[2] ?? 10), n = Number(process.argv[3] ?? 20000), task = process.argv[4] ?? "noop";
const server = "postgres://postgres@127.0.0.1:5432";
const admin = await adminClient(server);
await createDatabase(admin, "bench_diag");
const url = databaseUrl(server, "bench_diag");
await SYSTEMS.idemq.setup(url);
const p = await SYSTEMS.idemq.producer(url, { connections: 1 });
await p.enqueueBulk(Array.from({ length: n }, (_, i) => ({ task, payload: { i } }))); await p.close();
await withClient(url, (c) => c.query("ANALYZE"));
process.env.PGOPTIONS = "-c track_functions=all";
const child = spawnWorker({ system: "idemq", mode: task === "noop" ? "batched" : "transactional", concurrency: conc, url, expect: n, kind: "throughput", notify: false }, 300000);
const r = await child.done; child.kill(); await child.exited;
delete process.env.PGOPTIONS;
console.log({ jobsPerS: n / r.seconds, workerCpuUs: r.workerCpuSeconds * 1e6 / n, backendCpuUs: (r.backendCpuSeconds ?? 0) * 1e6 / n, statementsPerJob: r.statements / n });
await new Promise((res) => setTimeout(res, 1500));
await withClient(url, async (c) => {
  const { rows } = await c.query("SELECT funcname, calls, round(total_time::numeric,1) total_ms, round(self_time::numeric,1) self_ms, round((total_time*1000/$1)::numeric,1) us_per_job FROM pg_stat_user_functions ORDER BY total_time DESC", [n]);
  console.table(rows);
  const t = await c.query("SELECT relname, n_tup_upd, n_tup_hot_upd, n_tup_ins, n_tup_del FROM pg_stat_user_tables WHERE schemaname IN ('idemq','public') ORDER BY relname");
  console.table(t.rows);
});
await dropDatabase(admin, "bench_diag"); await admin.end();
