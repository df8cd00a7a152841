// No freeze (issue 11, item 4): a role that can only connect holds every
// advisory lock key idemq's wake-up protocol uses (computed the way anyone
// can compute them, from the queue names, plus every advisory key it sees
// held in pg_locks) for 10 s, while jobs are enqueued one at a time; a
// running worker still runs each within a bound far below 10 s. The fallback
// poll and rescue are set to a minute, so a job done that fast came through a
// NOTIFY or the claim after wait_for_jobs, not a poll.
import pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase, serverUrl } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { markerPid as markerPidOf, markersHeld as markersHeldOf } from "../fixtures/worker/wait-marker.ts";

/** How long the hostile role holds the keys. */
const HOLD_MS = 10_000;
/** The latency bound each job must meet while the keys are held: far below HOLD_MS and the minute-long poll. */
const LATENCY_BOUND_MS = 2_000;
const QUEUES = ["nf_a", "nf_b"];

const db = useTestDatabase({ poolSize: 6 });
let client: Client;
let role: string;
let attackerUrl: string;
const attackers: pg.Client[] = [];

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  role = `idemq_nofreeze_${process.pid}_${Math.floor(Math.random() * 1e6)}`;
  // A real login, no superuser, nothing granted but CONNECT on this database.
  await db.pool.query(`CREATE ROLE ${role} LOGIN PASSWORD 'x' NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  await db.pool.query(`REVOKE ALL ON DATABASE ${db.name} FROM PUBLIC`);
  await db.pool.query(`GRANT CONNECT ON DATABASE ${db.name} TO ${role}`);
  const url = new URL(db.url);
  url.username = role;
  url.password = "x";
  attackerUrl = url.toString();
});
afterEach(async () => {
  await Promise.allSettled(attackers.splice(0).map((a) => a.end()));
  await stopWorkers();
});
afterAll(async () => {
  await db.drop();
  if (role !== undefined) {
    const admin = new pg.Client({ connectionString: serverUrl() });
    await admin.connect();
    // The database is gone with its grants; the role is the server's.
    await admin.query(`DROP ROLE IF EXISTS ${role}`).finally(() => admin.end());
  }
});

/** A session of the hostile role, checked to have no idemq privileges at all. */
async function attacker(): Promise<pg.Client> {
  const a = new pg.Client({ connectionString: attackerUrl });
  await a.connect();
  a.on("error", () => {});
  attackers.push(a);
  const { rows } = await a.query<{ superuser: boolean; usage: boolean }>(
    "SELECT r.rolsuper AS superuser, has_schema_privilege('idemq', 'USAGE') AS usage FROM pg_roles r WHERE r.rolname = current_user",
  );
  expect(rows[0]).toEqual({ superuser: false, usage: false });
  await expect(a.query("SELECT idemq.stats()")).rejects.toMatchObject({ code: "42501" });
  return a;
}

/**
 * Every key the wake-up protocol can use for these queues, computed without
 * idemq (its helpers are not the attacker's to call): the hash of each queue's
 * name, of "all queues", and of '' (the barrier); plus every advisory key held
 * in this database (pg_locks is readable by anyone).
 */
async function guessedKeys(a: pg.Client): Promise<string[]> {
  const { rows } = await a.query<{ key: string }>(
    `SELECT DISTINCT key::text FROM (
       SELECT ('x' || left(md5(s), 16))::bit(64)::bigint AS key
       FROM unnest(ARRAY['idemq:all-queues', 'idemq:queue:'] || ARRAY(SELECT 'idemq:queue:' || q FROM unnest($1::text[]) q)) s
       UNION
       SELECT (l.classid::bigint << 32) | l.objid::bigint
       FROM pg_locks l JOIN pg_database d ON d.oid = l.database
       WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND d.datname = current_database()
     ) k`,
    [QUEUES],
  );
  return rows.map((r) => r.key);
}

/** Takes every key in `mode`: exclusive where it can (shared where a worker's marker already holds it), or shared. */
async function holdAll(a: pg.Client, keys: string[], mode: "exclusive" | "shared"): Promise<void> {
  for (const key of keys) {
    if (mode === "exclusive") {
      const { rows } = await a.query<{ ok: boolean }>("SELECT pg_try_advisory_lock($1::bigint) AS ok", [key]);
      if (rows[0]!.ok) continue;
    }
    const { rows } = await a.query<{ ok: boolean }>("SELECT pg_try_advisory_lock_shared($1::bigint) AS ok", [key]);
    expect(rows[0]!.ok, `the attacker takes key ${key}`).toBe(true);
  }
}

async function keysHeldBy(a: pg.Client): Promise<number> {
  const { rows } = await a.query<{ n: number }>(
    "SELECT count(DISTINCT (classid::bigint << 32) | objid::bigint)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted",
  );
  return rows[0]!.n;
}

const markerPid = () => markerPidOf(db.pool);
const markersHeld = () => markersHeldOf(db.pool);

async function succeeded(jobId: string): Promise<boolean> {
  const { rows } = await db.pool.query<{ state: string }>("SELECT state FROM idemq.jobs WHERE id = $1", [jobId]);
  return rows[0]?.state === "succeeded";
}

/** Until `until`, enqueues one job at a time (queues in turn) and waits for it to succeed; returns each latency in ms. */
async function enqueueWhileHeld(until: number): Promise<number[]> {
  const latencies: number[] = [];
  for (let i = 0; Date.now() < until; i++) {
    const started = performance.now();
    const { jobId } = await client.enqueue("ping", { i }, { queue: QUEUES[i % QUEUES.length]! });
    await waitFor(() => succeeded(jobId), { what: `job ${jobId} to succeed`, timeoutMs: HOLD_MS, intervalMs: 2 });
    latencies.push(performance.now() - started);
  }
  return latencies;
}

function startWorker(): Promise<TestWorker> {
  return startTestWorker(db.url, { ping: async () => "pong" }, {
    queues: QUEUES,
    pollInterval: "60s",
    rescueInterval: "60s",
    concurrency: 2,
  });
}

/**
 * Until HOLD_MS after `heldSince`, jobs enqueued one at a time each run within
 * the bound, and the attacker still holds every key at the end. Then it lets
 * go, and the worker waits on its markers again and is woken by NOTIFY.
 */
async function runsJobsWhileHeld(a: pg.Client, keys: string[], heldSince: number): Promise<void> {
  const latencies = await enqueueWhileHeld(heldSince + HOLD_MS);
  expect(await keysHeldBy(a)).toBe(keys.length);
  expect(latencies.length).toBeGreaterThan(10);
  expect(Math.max(...latencies)).toBeLessThan(LATENCY_BOUND_MS);
  await a.end();
  await waitFor(async () => (await markersHeld()) === QUEUES.length, { what: "the worker to wait on its markers again", timeoutMs: 10_000 });
  const { jobId } = await client.enqueue("ping", { after: true }, { queue: QUEUES[0]! });
  await waitFor(() => succeeded(jobId), { what: "a job after the attack", timeoutMs: LATENCY_BOUND_MS });
}

describe("a role with CONNECT only cannot stop or slow a worker", () => {
  it("every key held exclusively for 10 s before the worker starts: each job enqueued meanwhile runs within 2 s", async () => {
    const a = await attacker();
    const keys = await guessedKeys(a);
    expect(keys.length).toBeGreaterThanOrEqual(QUEUES.length + 2);
    await holdAll(a, keys, "exclusive");
    const heldSince = Date.now();
    const w = await startWorker();
    await runsJobsWhileHeld(a, keys, heldSince);
    expect(w.of("worker:error")).toEqual([]);
  }, 40_000);

  it("every key held shared for 10 s (the barrier too) while a waiting worker loses its marker: each job still runs within 2 s", async () => {
    const w = await startWorker();
    await waitFor(async () => (await markersHeld()) === QUEUES.length, { what: "the worker to wait for jobs", timeoutMs: 10_000 });
    const a = await attacker();
    const keys = await guessedKeys(a);
    await holdAll(a, keys, "shared");
    const heldSince = Date.now();
    // The worker must set its marker again with every key taken: wait_for_jobs cannot confirm now.
    const before = await markerPid();
    await db.pool.query("SELECT pg_terminate_backend($1)", [before]);
    await waitFor(async () => {
      const pid = await markerPid();
      return pid !== undefined && pid !== before;
    }, { what: "a new wait-marker session", timeoutMs: 10_000 });
    await runsJobsWhileHeld(a, keys, heldSince);
    expect(w.of("worker:error").filter((e) => !String(e.during).includes("wait-marker"))).toEqual([]);
  }, 40_000);
});
