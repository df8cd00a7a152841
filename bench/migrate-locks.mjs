#!/usr/bin/env node
// What `idemq migrate` from 0.1.0 to this checkout costs the workers of a busy
// installation: a database at 0.1.0 (its release migration) with N finished
// jobs (default 1,000,000) is upgraded while a probe enqueues, claims and
// completes one job after another on its own connection. Prints how long the
// upgrade took, the probe's slowest round trip before and during it, and every
// lock the migrating session held or waited for on idemq.jobs.
//
//   npm run build && DATABASE_URL=postgres://... node bench/migrate-locks.mjs [N]
//
// A measurement for docs/design.md ("Migrations and releases"), not a test:
// the numbers depend on the machine. It creates and drops a database of its own.
import pg from "pg";
import { migrate } from "../dist/migrate.js";

const N = Number(process.argv[2] ?? 1_000_000);
const server = process.env.DATABASE_URL;
if (!server) {
  console.error("set DATABASE_URL to a server where this role may create databases");
  process.exit(2);
}
const name = `idemq_migrate_locks_${Date.now().toString(36)}`;
const urlOf = (database, appName) => {
  const url = new URL(server);
  url.pathname = `/${database}`;
  if (appName) url.searchParams.set("application_name", appName);
  return url.toString();
};

const admin = new pg.Client({ connectionString: server });
await admin.connect();
await admin.query(`CREATE DATABASE ${name}`);
try {
  const url = urlOf(name);
  await migrate({ connectionString: url, count: 1 });
  const db = new pg.Pool({ connectionString: url, max: 3 });
  const t0 = Date.now();
  await db.query(
    `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, attempt, max_attempts, created_at, finished_at)
     SELECT 'bulk', 'default', jsonb_build_object('n', g), 'succeeded', 0, now(), 1, 10, now(), now() FROM generate_series(1, $1::int) g`,
    [N],
  );
  await db.query("VACUUM ANALYZE idemq.jobs");
  console.log(`${N} finished jobs at 0.1.0 in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

  // The probe: one job enqueued, claimed and completed per round, on one connection.
  const probe = new pg.Client({ connectionString: url });
  await probe.connect();
  let stop = false;
  const rounds = [];
  const probing = (async () => {
    while (!stop) {
      const start = performance.now();
      await probe.query("SELECT * FROM idemq.enqueue('probe', '{}', queue => 'probe')");
      const { rows } = await probe.query("SELECT id, attempt FROM idemq.claim(worker_id => 'probe', queues => ARRAY['probe'], batch_size => 1)");
      if (rows[0]) await probe.query("SELECT idemq.complete($1, $2)", [rows[0].id, rows[0].attempt]);
      rounds.push({ at: Date.now(), ms: performance.now() - start });
    }
  })();

  // Locks of the migrating session on idemq.jobs, sampled every 10 ms.
  const watcher = new pg.Client({ connectionString: url });
  await watcher.connect();
  const jobsOid = (await watcher.query("SELECT 'idemq.jobs'::regclass::oid AS oid")).rows[0].oid;
  const locks = new Map();
  let watching = true;
  const watching$ = (async () => {
    while (watching) {
      const { rows } = await watcher.query(
        `SELECT l.mode, l.granted FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE a.application_name = 'idemq_migrate_locks' AND l.relation = $1`,
        [jobsOid],
      );
      for (const row of rows) locks.set(`${row.mode}${row.granted ? "" : " (waiting)"}`, true);
      await new Promise((r) => setTimeout(r, 10));
    }
  })();

  await new Promise((r) => setTimeout(r, 2_000));
  const before = rounds.length;
  const started = Date.now();
  const ran = await migrate({ connectionString: urlOf(name, "idemq_migrate_locks") });
  const finished = Date.now();
  await new Promise((r) => setTimeout(r, 500));
  stop = true;
  watching = false;
  await Promise.all([probing, watching$]);
  await Promise.all([probe.end(), watcher.end(), db.end()]);

  const max = (list) => Math.max(...list.map((r) => r.ms));
  const during = rounds.filter((r) => r.at >= started && r.at <= finished + 50);
  console.log(`migrate ${ran.join(", ")}: ${finished - started} ms`);
  console.log(`probe round trip (enqueue + claim + complete): slowest before ${max(rounds.slice(0, before)).toFixed(1)} ms, during ${during.length ? max(during).toFixed(1) : "-"} ms (${during.length} rounds)`);
  console.log(`locks of the migrating session on idemq.jobs: ${locks.size ? [...locks.keys()].join(", ") : "none seen"}`);
} finally {
  await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin.end();
}
