// The upgrade path (issue 9): a database at 0001 holding jobs in every state,
// keys, guard rows and effect records is migrated to the latest version, and
// a worker of the new version finishes every job correctly; the job counts
// start exact, writes that waited for the migration included; down to 0001
// and up again, and `migrate sql` applied with psql, build the same catalog as a
// straight `migrate`; a migration can use an enum value the one before it
// added in the same run; released migrations keep their recorded sha256.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { migrate, migrationStatus, pendingSql, RELEASE_0_1_0 } from "../../src/migrate.ts";
import type { TransactionalJobContext } from "../../src/index.ts";
import { catalogSnapshot } from "../helpers/catalog.ts";
import { committedCatalog } from "../helpers/catalog-snapshot.ts";
import { backendPid, type TestDatabase, useTestDatabases, waitUntilBlocked, waitUntilBlocking } from "../helpers/db.ts";
import { expectCountsExact } from "../helpers/job-counts.ts";
import { enqueue, makeJob, makeJobs, POLICIES, TERMINAL_STATES } from "../helpers/jobs.ts";
import { jobIn } from "../helpers/work.ts";
import { MIGRATION_NAMES, migrationPath } from "../helpers/migrations.ts";
import { psqlFile } from "../helpers/psql.ts";
import { buildZoo, changed, snapshot, type ZooName, type ZooSnapshot } from "../helpers/zoo.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const FIRST = RELEASE_0_1_0;

const makeDatabase = useTestDatabases();
afterAll(async () => {
  await stopWorkers();
});

async function emptyDatabase(): Promise<TestDatabase> {
  const db = await makeDatabase({ empty: true, poolSize: 4 });
  return db;
}

/** A database with only 0001 applied. */
async function databaseAtFirst(): Promise<TestDatabase> {
  const db = await emptyDatabase();
  expect(await migrate({ connectionString: db.url, count: 1 })).toEqual([FIRST]);
  return db;
}

/** Everything two databases built by different paths must share: the catalog (with function sources) and each function's definition. */
async function catalogOf(db: TestDatabase): Promise<unknown> {
  const { rows } = await db.pool.query<{ def: string }>(
    "SELECT pg_get_functiondef(p.oid) AS def FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace ORDER BY p.proname, p.oid",
  );
  expect(rows.length).toBeGreaterThan(30);
  return { catalog: await catalogSnapshot(db.pool), committed: await committedCatalog(db.pool), functions: rows.map((r) => r.def) };
}

async function applied(db: TestDatabase): Promise<string[]> {
  return (await migrationStatus({ connectionString: db.url })).applied;
}

it("the migrations are 0.1.0's 0001_release_0_1_0 and at least one more (this test is about upgrading)", () => {
  expect(MIGRATION_NAMES[0]).toBe(FIRST);
  expect(MIGRATION_NAMES.length).toBeGreaterThan(1);
});

describe("a database at 0001 with jobs in every state, upgraded to the latest version", () => {
  it("every non-terminal job finishes correctly with a worker of the new version; keys dedupe as before; terminal rows stay as they were", async () => {
    const db = await databaseAtFirst();
    const pool = db.pool;

    // ---- At 0001: the zoo (one job in each state, plus a processing job with
    // an expired lease and one on its last attempt), a key per terminal state
    // for the policy matrix, guard rows and effect records.
    // The policy keys first: driving a job to expired calls rescue(), which
    // would take the zoo's expired lease away before the upgrade.
    const policyKeys: Record<string, string> = {};
    for (const state of TERMINAL_STATES) {
      const key = `upgrade:policy:${state}`;
      policyKeys[key] = await jobIn(pool, state, { task: "charge", payload: { order: 7 }, idempotency_key: key });
    }
    const zoo = await buildZoo(pool);
    // A transactional job whose effect already committed (its guard row), then
    // redelivered: its worker lost the lease.
    expect((await pool.query("SELECT idemq.guard(key => 'upgrade:tx', task => 'tx_task') AS ok")).rows[0].ok).toBe(true);
    const tx = await enqueue(pool, { task: "tx_task", queue: "upgrade.tx", idempotency_key: "upgrade:tx", payload: { ref: "tx" } });
    const { rows: txClaim } = await pool.query(
      "SELECT id, attempt FROM idemq.claim(worker_id => 'old-worker', queues => ARRAY['upgrade.tx'])",
    );
    expect(txClaim).toMatchObject([{ id: tx.job_id, attempt: 1 }]);
    // Effects: one done (its result recorded), one claimed by a worker that
    // died (the zoo's lease-expired job), its claim older than stale_after.
    await pool.query("SELECT * FROM idemq.effect_claim(key => 'upgrade:done', owner => 'old-worker')");
    await pool.query(`SELECT idemq.effect_done(key => 'upgrade:done', owner => 'old-worker', result => '{"sent": "before"}')`);
    await pool.query("SELECT * FROM idemq.effect_claim(key => 'upgrade:claimed', owner => 'old-worker')");
    // Clock hands only: leases and claims that ran out.
    await pool.query(
      `UPDATE idemq.jobs SET locked_at = now() - interval '31 seconds', lease_expires_at = now() - interval '1 second' WHERE id = $1`,
      [tx.job_id],
    );
    await pool.query("UPDATE idemq.effects SET claimed_at = now() - interval '1 hour' WHERE key = 'upgrade:claimed'");

    const probes = [
      { key: zoo.enqueued.key, task: "zoo_task", payload: { zoo: "enqueued" }, holder: zoo.enqueued.id },
      ...Object.entries(policyKeys).map(([key, holder]) => ({ key, task: "charge", payload: { order: 7 }, holder })),
    ];
    const before = {
      outcomes: await dedupeOutcomes(pool, probes),
      zoo: await snapshot(pool, zoo),
      terminal: await terminalRows(pool),
    };
    for (const job of [before.zoo.jobs.leaseExpired, before.zoo.jobs.processing, before.zoo.jobs.lastAttempt]) {
      expect(job).toMatchObject({ state: "processing", locked_by: "zoo-worker" });
    }
    expect((await pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE state = 'processing' AND lease_expires_at < now()")).rows[0].n).toBe(2);
    // The probe covers all three outcomes: dedupe to the active job, a new job, a refusal.
    expect(new Set(Object.values(before.outcomes))).toEqual(new Set(["deduplicated", "new job", "IQ409"]));
    expect(Object.keys(before.outcomes)).toHaveLength(POLICIES.length * probes.length);

    // ---- Upgrade.
    expect(await migrate({ connectionString: db.url })).toEqual(MIGRATION_NAMES.slice(1));
    expect(await applied(db)).toEqual(MIGRATION_NAMES);
    // The changes: 0011 gives every key the retention prune_keys' default gave it (key_retention),
    // the traces migration adds each job's traceparent, NULL for jobs enqueued before it, and
    // 0002 each job's lease_token, NULL for jobs claimed before it (their holders present none), and
    // its timeout and concurrency_key, NULL for jobs enqueued before it, and the flow-control
    // slots of its attempt (queue_slot, task_slot) and its progress, NULL for attempts claimed before it,
    // and result_watched, false: nobody waits for their results yet.
    const withNull = (rows: Record<string, Record<string, unknown>>): Record<string, Record<string, unknown>> =>
      Object.fromEntries(
        Object.entries(rows).map(([name, row]) => [
          name,
          { ...row, traceparent: null, lease_token: null, timeout: null, concurrency_key: null, queue_slot: null, task_slot: null, progress: null, result_watched: false },
        ]),
      );
    const withRetention = {
      ...before.zoo,
      jobs: withNull(before.zoo.jobs) as typeof before.zoo.jobs,
      others: withNull(before.zoo.others),
      keys: Object.fromEntries(
        Object.entries(before.zoo.keys).map(([name, row]) => [name, row === undefined ? row : { ...row, retention: "14 days" }]),
      ) as typeof before.zoo.keys,
    };
    expect(await snapshot(pool, zoo), "the migration changed no job, key or dependency").toEqual(withRetention);
    // The live lease is still its holder's: an old worker keeps its attempt across the upgrade.
    const { rows: held } = await pool.query<{ id: string }>(
      "SELECT id::text FROM idemq.heartbeat(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int]) AS id",
      [zoo.processing.id, zoo.processing.attempt],
    );
    expect(held.map((r) => r.id)).toEqual([zoo.processing.id]);
    expect(await dedupeOutcomes(pool, probes), "keys dedupe per policy exactly as before the upgrade").toEqual(before.outcomes);

    // ---- Finish every job. The old holders end their live attempts.
    await pool.query("SELECT idemq.complete(job_id => $1, attempt => $2, result => '{\"by\": \"old worker\"}')", [
      zoo.processing.id,
      zoo.processing.attempt,
    ]);
    expect(
      (
        await pool.query(`SELECT f.state AS s FROM idemq.fail(job_id => $1, attempt => $2, error => '{"class": "OldError", "message": "last"}') f`, [
          zoo.lastAttempt.id,
          zoo.lastAttempt.attempt,
        ])
      ).rows[0].s,
    ).toBe("failed");
    // Rescue makes the expired leases runnable; the waiting jobs become due.
    expect((await pool.query("SELECT idemq.rescue() AS n")).rows[0].n).toBe(2);
    for (const id of [zoo.leaseExpired.id, tx.job_id]) {
      expect((await pool.query("SELECT state, lease_lost FROM idemq.jobs WHERE id = $1", [id])).rows[0]).toEqual({
        state: "enqueued",
        lease_lost: true,
      });
    }
    for (const job of [zoo.scheduled, zoo.parent]) {
      await pool.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", [job.id]);
    }

    const runs: Array<{ zoo: string; reclaimed: boolean }> = [];
    const effectCalls: string[] = [];
    let doneResult: unknown;
    let txRuns = 0;
    const worker = await startTestWorker(db.url, {
      zoo_task: {
        run: async (p: { zoo: ZooName }, ctx) => {
          runs.push({ zoo: p.zoo, reclaimed: ctx.job.reclaimed });
          const effect = (key: string) =>
            ctx.effect(key, async () => {
              effectCalls.push(key);
              return { sent: "after" };
            });
          if (p.zoo === "enqueued") doneResult = await effect("upgrade:done");
          if (p.zoo === "leaseExpired") await effect("upgrade:claimed");
        },
      },
      tx_task: {
        transactional: true,
        run: async (_p: unknown, _ctx: TransactionalJobContext) => {
          txRuns++;
        },
      },
    });

    const finishing: ZooName[] = ["scheduled", "enqueued", "awaiting", "leaseExpired", "parent"];
    const ids = [...finishing.map((n) => zoo[n].id), tx.job_id];
    await waitFor(
      async () => {
        const { rows } = await pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE id = ANY($1::bigint[]) AND finished_at IS NOT NULL", [ids]);
        return rows[0].n === ids.length;
      },
      { what: "the upgraded database's jobs to finish" },
    );
    await stopWorkers();
    expect(worker.of("worker:error")).toEqual([]);

    // lease_token left out, as 0001 has no such column: the other columns keep their order, which changed() compares.
    const after = withoutLeaseTokens(await snapshot(pool, zoo));
    const states = Object.fromEntries(Object.entries(after.jobs).map(([n, row]) => [n, row.state]));
    expect(states).toEqual({
      scheduled: "succeeded",
      enqueued: "succeeded",
      processing: "succeeded",
      awaiting: "succeeded",
      succeeded: "succeeded",
      failed: "failed",
      expired: "expired",
      cancelled: "cancelled",
      leaseExpired: "succeeded",
      lastAttempt: "failed",
      parent: "succeeded",
    });
    // Each job the new worker ran, ran once; the rescued one knew it was reclaimed.
    expect([...runs].sort((a, b) => a.zoo.localeCompare(b.zoo))).toEqual([
      { zoo: "awaiting", reclaimed: false },
      { zoo: "enqueued", reclaimed: false },
      { zoo: "leaseExpired", reclaimed: true },
      { zoo: "parent", reclaimed: false },
      { zoo: "scheduled", reclaimed: false },
    ]);
    // The done effect is not re-run (its stored result comes back); the stale claim is taken over and run once.
    expect(doneResult).toEqual({ sent: "before" });
    expect(effectCalls).toEqual(["upgrade:claimed"]);
    const { rows: effects } = await pool.query("SELECT key, status, reclaims, result FROM idemq.effects ORDER BY key");
    expect(effects).toEqual([
      { key: "upgrade:claimed", status: "done", reclaims: 1, result: { sent: "after" } },
      { key: "upgrade:done", status: "done", reclaims: 0, result: { sent: "before" } },
    ]);
    // The guard row makes the redelivered transactional job a duplicate: its handler never ran.
    expect(txRuns).toBe(0);
    expect(worker.of("job:duplicate")).toMatchObject([{ jobId: tx.job_id, guardKey: "upgrade:tx" }]);
    expect((await pool.query("SELECT state FROM idemq.jobs WHERE id = $1", [tx.job_id])).rows[0].state).toBe("succeeded");

    // Terminal rows from before the upgrade are unchanged; only the active zoo jobs and their keys moved.
    expect(await terminalRows(pool, before.terminal.ids)).toEqual(before.terminal);
    // Every column compared: the release's tables have them all (changed() compares JSON text, key order included).
    const diff = changed(before.zoo, after);
    const active: ZooName[] = ["scheduled", "enqueued", "processing", "awaiting", "leaseExpired", "lastAttempt", "parent"];
    expect(diff.jobs.sort()).toEqual([...active].sort());
    expect(diff.keys.sort()).toEqual([...active].sort());
    // The parent's completion released the job waiting on it.
    expect(diff.dependencies).toEqual({ removed: [`${zoo.parent.id}->${zoo.awaiting.id}`], added: [] });
  });
});

describe("the job counts of stats() across the upgrade", () => {
  it("start from every job at 0001, and count the writes that waited for the migration's lock, a 0.1.0 enqueue still running among them", async () => {
    const db = await databaseAtFirst();
    await buildZoo(db.pool);
    await makeJobs(db.pool, 20, { task: "bulk", queue: "upgrade.counts" });
    // A: a transaction of a 0.1.0 client, open when the migration starts: the migration's lock waits for it.
    const a = await db.newClient();
    await a.query("BEGIN");
    await makeJob(a, { task: "in_flight_a", queue: "upgrade.counts" });
    const aPid = await backendPid(a);
    const migrating = migrate({ connectionString: db.url });
    const [migrationPid] = await waitUntilBlocking(db.pool, aPid, { timeoutMs: 30_000 });
    // B: a 0.1.0 enqueue() that starts now runs the old function and waits behind the migration's lock.
    const b = await db.newClient();
    const bPid = await backendPid(b);
    const enqueuedB = makeJob(b, { task: "in_flight_b", queue: "upgrade.counts" });
    expect(await waitUntilBlocked(db.pool, bPid)).toContain(migrationPid);
    await a.query("COMMIT");
    expect(await migrating).toEqual(MIGRATION_NAMES.slice(1));
    await enqueuedB;

    const kept = await expectCountsExact(db.pool, "after the upgrade");
    expect(kept.filter(([queue]) => queue === "upgrade.counts")).toEqual([
      ["upgrade.counts", "bulk", "enqueued", 20],
      ["upgrade.counts", "in_flight_a", "enqueued", 1],
      ["upgrade.counts", "in_flight_b", "enqueued", 1],
    ]);
    expect(kept.length).toBeGreaterThan(5);
  });
});

describe("forward-only: no way down from the latest, and up again from 0001", () => {
  // The upgrade files carry no Down section (docs/design.md, "Migrations and
  // releases"): node-pg-migrate refuses to revert one. The way back from an
  // upgrade is the database as it was at 0001 (the backup taken before it),
  // which is what databaseAtFirst() builds.
  it("migrate down is refused, naming the migration, and changes nothing; a database at 0001 migrates up to the catalog of a straight migrate", async () => {
    const [straight, atFirst, roundTrip] = await Promise.all([emptyDatabase(), databaseAtFirst(), emptyDatabase()]);
    expect(await migrate({ connectionString: straight.url })).toEqual(MIGRATION_NAMES);
    expect(await migrate({ connectionString: roundTrip.url })).toEqual(MIGRATION_NAMES);
    const before = await catalogOf(roundTrip);

    const down = MIGRATION_NAMES.length - 1;
    await expect(migrate({ connectionString: roundTrip.url, direction: "down", count: down })).rejects.toThrow(
      `User has disabled down migration on file: ${MIGRATION_NAMES.at(-1)}`,
    );
    expect(await applied(roundTrip)).toEqual(MIGRATION_NAMES);
    expect(await catalogOf(roundTrip), "a refused down changes nothing").toEqual(before);

    expect(await migrate({ connectionString: atFirst.url })).toEqual(MIGRATION_NAMES.slice(1));
    expect(await catalogOf(atFirst)).toEqual(await catalogOf(straight));
  });
});

describe("migrate sql from 0001 to the latest", () => {
  it("applied with psql -v ON_ERROR_STOP=1 -f, gives the catalog of migrate; a later migrate finds nothing pending", async () => {
    const [straight, viaPsql] = await Promise.all([emptyDatabase(), databaseAtFirst()]);
    await migrate({ connectionString: straight.url });
    const script = await pendingSql({ connectionString: viaPsql.url });
    expect(script).not.toContain(`==== ${FIRST}.sql ====`);
    await psqlFile(viaPsql.url, script);
    expect(await catalogOf(viaPsql)).toEqual(await catalogOf(straight));
    expect(await migrationStatus({ connectionString: viaPsql.url })).toEqual({ applied: MIGRATION_NAMES, pending: [] });
    expect(await migrate({ connectionString: viaPsql.url })).toEqual([]);
  });
});

describe("an enum value added by one migration, used by the next, in one run", () => {
  // Fixture migrations: 0002 adds a value, 0003 uses it in a SQL-language
  // function body, a CHECK, a partial index and a row.
  const FIXTURE: Record<string, string> = {
    "0001_enum_type.sql": `-- Up Migration
CREATE SCHEMA enumfix;
CREATE TYPE enumfix.state AS ENUM ('open', 'closed');
CREATE FUNCTION enumfix.open_states() RETURNS enumfix.state[] LANGUAGE sql IMMUTABLE RETURN ARRAY['open']::enumfix.state[];
CREATE TABLE enumfix.items (id int PRIMARY KEY, state enumfix.state NOT NULL);
-- Down Migration
DROP SCHEMA enumfix CASCADE;
`,
    "0002_enum_value.sql": `-- Up Migration
ALTER TYPE enumfix.state ADD VALUE 'paused' BEFORE 'closed';
-- Down Migration
SELECT 'an enum value cannot be dropped';
`,
    "0003_enum_use.sql": `-- Up Migration
CREATE OR REPLACE FUNCTION enumfix.open_states() RETURNS enumfix.state[] LANGUAGE sql IMMUTABLE
RETURN ARRAY['open', 'paused']::enumfix.state[];
ALTER TABLE enumfix.items ADD CONSTRAINT items_known CHECK (state IN ('open', 'paused', 'closed'));
CREATE INDEX items_paused ON enumfix.items (id) WHERE state = 'paused';
INSERT INTO enumfix.items VALUES (1, 'paused');
-- Down Migration
DROP INDEX enumfix.items_paused;
ALTER TABLE enumfix.items DROP CONSTRAINT items_known;
DELETE FROM enumfix.items;
`,
  };
  let dir: string;

  async function fixtureDir(): Promise<string> {
    dir ??= await mkdtemp(join(tmpdir(), "idemq-enum-migrations-"));
    await Promise.all(Object.entries(FIXTURE).map(([name, text]) => writeFile(join(dir, name), text)));
    return dir;
  }
  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  async function expectUsed(db: TestDatabase): Promise<void> {
    const { rows } = await db.pool.query("SELECT enumfix.open_states()::text[] AS open, (SELECT state::text FROM enumfix.items) AS item");
    expect(rows[0]).toEqual({ open: ["open", "paused"], item: "paused" });
  }

  it("in one transaction PostgreSQL refuses it (55P04 unsafe use of new value): why each migration commits on its own", async () => {
    const db = await emptyDatabase();
    // The type exists already, as it does in a released schema. (A type
    // created in the same transaction is exempt, on PostgreSQL 18 at least.)
    expect(await migrate({ connectionString: db.url, migrationsDir: await fixtureDir(), count: 1 })).toEqual(["0001_enum_type"]);
    const client = await db.newClient();
    await client.query("BEGIN");
    const failure = await (async () => {
      for (const text of Object.values(FIXTURE).slice(1)) await client.query(text.split("-- Down Migration")[0]!);
    })().then(
      () => undefined,
      (error: { code?: string; message?: string }) => error,
    );
    await client.query("ROLLBACK");
    expect(failure).toMatchObject({ code: "55P04", message: 'unsafe use of new value "paused" of enum type enumfix.state' });
  });

  it("migrate runs all three", async () => {
    const db = await emptyDatabase();
    expect(await migrate({ connectionString: db.url, migrationsDir: await fixtureDir() })).toEqual([
      "0001_enum_type",
      "0002_enum_value",
      "0003_enum_use",
    ]);
    await expectUsed(db);
  });

  it("the script of migrate sql runs all three with psql", async () => {
    const db = await emptyDatabase();
    const migrationsDir = await fixtureDir();
    await psqlFile(db.url, await pendingSql({ connectionString: db.url, migrationsDir }));
    await expectUsed(db);
    expect(await migrationStatus({ connectionString: db.url, migrationsDir })).toEqual({
      applied: ["0001_enum_type", "0002_enum_value", "0003_enum_use"],
      pending: [],
    });
  });
});

describe("released migrations never change", () => {
  const released = readFileSync(join(ROOT, "sql", "released.sha256"), "utf8")
    .trimEnd()
    .split("\n")
    .map((line) => {
      const [sha256, file] = line.split(/\s+/);
      return { sha256: sha256!, file: file! };
    });

  it("0001_release_0_1_0 is released, with its sha256 recorded in sql/released.sha256", async () => {
    expect(released[0]).toEqual({ sha256: expect.stringMatching(/^[0-9a-f]{64}$/), file: `migrations/${FIRST}.sql` });
    const text = await readFile(migrationPath(FIRST));
    expect(createHash("sha256").update(text).digest("hex"), `${FIRST}.sql is released and must never change; put the change in a new migration: npm run migration:new -- NAME`).toBe(
      released[0]!.sha256,
    );
  });

  it("every released migration has its recorded sha256, and they are the first migrations, in order", async () => {
    expect(released.map((r) => r.file)).toEqual(MIGRATION_NAMES.slice(0, released.length).map((n) => `migrations/${n}.sql`));
    for (const r of released) {
      const text = await readFile(join(ROOT, "sql", r.file));
      expect(createHash("sha256").update(text).digest("hex"), `${r.file} is released and must never change`).toBe(r.sha256);
    }
  });
});

/** For each probe key and each policy: what enqueue answers (rolled back), by "policy key". */
async function dedupeOutcomes(
  pool: pg.Pool,
  probes: Array<{ key: string; task: string; payload: unknown; holder: string }>,
): Promise<Record<string, string>> {
  const outcomes: Record<string, string> = {};
  const client = await pool.connect();
  try {
    for (const policy of POLICIES) {
      for (const probe of probes) {
        await client.query("BEGIN");
        try {
          const r = await enqueue(client, { task: probe.task, payload: probe.payload, idempotency_key: probe.key, duplicate_policy: policy });
          outcomes[`${policy} ${probe.key}`] = r.deduplicated ? (r.job_id === probe.holder ? "deduplicated" : `deduplicated to ${r.job_id}`) : "new job";
        } catch (error) {
          outcomes[`${policy} ${probe.key}`] = (error as { code?: string }).code ?? String(error);
        } finally {
          await client.query("ROLLBACK");
        }
      }
    }
  } finally {
    client.release();
  }
  return outcomes;
}

/** Terminal jobs (all, or those with the given ids), with their key rows, the guard rows and the done effects, as stored. */
async function terminalRows(pool: pg.Pool, onlyIds?: string[]): Promise<{ ids: string[]; jobs: unknown[]; keys: unknown[]; processed: unknown[]; effects: unknown[] }> {
  const { rows: jobs } = await pool.query<{ id: string; row: Record<string, unknown> }>(
    // All columns but traceparent and the columns 0002 adds (lease_token, timeout, concurrency_key, queue_slot,
    // task_slot, progress, result_watched), which the zoo snapshot checks.
    `SELECT j.id::text, to_jsonb(j) - 'traceparent' - 'lease_token' - 'timeout' - 'concurrency_key' - 'queue_slot' - 'task_slot' - 'progress' - 'result_watched' AS row FROM idemq.jobs j
      WHERE ${onlyIds ? "j.id = ANY($1::bigint[])" : "j.state = ANY(idemq.terminal_states())"} ORDER BY j.id`,
    onlyIds ? [onlyIds] : [],
  );
  const ids = jobs.map((r) => r.id);
  // All columns but retention, which the zoo snapshot checks.
  const keys = await pool.query(
    "SELECT to_jsonb(k) - 'retention' AS row FROM idemq.keys k WHERE k.job_id = ANY($1::bigint[]) ORDER BY k.key",
    [ids],
  );
  const processed = await pool.query("SELECT to_jsonb(p) AS row FROM idemq.processed p ORDER BY p.key");
  // The columns every release has had (job_id and attempt are NULL for these rows).
  const effects = await pool.query(
    `SELECT jsonb_build_object('key', e.key, 'owner', e.owner, 'status', e.status, 'claimed_at', e.claimed_at,
                               'reclaims', e.reclaims, 'done_at', e.done_at, 'result', e.result) AS row
       FROM idemq.effects e WHERE e.status = 'done' AND e.key = 'upgrade:done'`,
  );
  return { ids, jobs: jobs.map((r) => r.row), keys: keys.rows, processed: processed.rows, effects: effects.rows };
}


/** A snapshot without the jobs' columns that 0002 adds (lease_token, timeout, concurrency_key, queue_slot, task_slot, progress, result_watched), which 0001 has not: comparable, key order included, with one taken at 0001. */
function withoutLeaseTokens(snap: ZooSnapshot): ZooSnapshot {
  const strip = (rows: Record<string, Record<string, unknown>>) =>
    Object.fromEntries(Object.entries(rows).map(([name, { lease_token: _token, timeout: _timeout, concurrency_key: _key, queue_slot: _queueSlot, task_slot: _taskSlot, progress: _progress, result_watched: _watched, ...row }]) => [name, row]));
  return { ...snap, jobs: strip(snap.jobs) as ZooSnapshot["jobs"], others: strip(snap.others) };
}
