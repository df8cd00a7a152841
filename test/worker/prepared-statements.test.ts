// The worker's hot calls as named prepared statements (src/worker/prepared-calls.ts).
// On a direct connection, claim, heartbeat, complete and complete_many are prepared
// on the pool's connection (read from pg_prepared_statements in that very
// session: the worker's pool is the test's, of one connection). A statement
// gone from its connection (DEALLOCATE ALL, 26000), one of the same name
// already on the server (42P05) and one whose result type a migration changed
// (0A000) are each sent again unprepared, said once, and the worker prepares
// no more. A claim function replaced under its
// statement (as a migration does) runs its new body. Across a server restart (a private
// cluster) pg prepares again on the new connection and the worker keeps
// claiming. Behind PgBouncer in transaction mode the worker does not prepare:
// pgbouncer.test.ts.
import pg from "pg";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { Client, createWorker, type Worker, type WorkerEvents } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { finishedJob, waitFor } from "../fixtures/worker/wait.ts";
import { type PrivateCluster, startMigratedCluster } from "../helpers/private-cluster.ts";

const db = useTestDatabase();
const running: { worker: Worker; pool: pg.Pool }[] = [];

afterEach(async () => {
  for (const { worker, pool } of running.splice(0)) {
    await worker.stop();
    await pool.end();
  }
});

interface Recorded {
  worker: Worker;
  pool: pg.Pool;
  events: { event: keyof WorkerEvents; payload: Record<string, unknown> }[];
}

/** A worker on a pool of one connection the test can query too, recording its errors and logs. */
async function startWorker(url: string, tasks: Parameters<typeof createWorker>[0]["tasks"], heartbeatInterval = "1 hour"): Promise<Recorded> {
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  pool.on("error", () => {});
  const worker = createWorker({ pool, tasks, handleSignals: false, pollInterval: "200ms", lease: "2 hours", heartbeatInterval });
  const events: Recorded["events"] = [];
  for (const event of ["worker:error", "log"] as const) {
    worker.on(event, (payload: object) => events.push({ event, payload: payload as Record<string, unknown> }));
  }
  await worker.start();
  running.push({ worker, pool });
  return { worker, pool, events };
}

/** The prepared statements of the pool's one connection: the worker's session. */
async function preparedOn(pool: pg.Pool): Promise<{ name: string; statement: string }[]> {
  const { rows } = await pool.query<{ name: string; statement: string }>("SELECT name, statement FROM pg_prepared_statements ORDER BY name");
  return rows;
}

async function backendPid(pool: pg.Pool): Promise<number> {
  return (await pool.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]!.pid;
}

const functionsOf = (statements: { statement: string }[]): string[] =>
  [...new Set(statements.map((s) => /idemq\.(\w+)\(/.exec(s.statement)?.[1] ?? s.statement))].sort();

/** Statements run in one transaction, as a migration runs them. */
async function inTransaction(statements: string[]): Promise<void> {
  const client = await db.pool.connect();
  try {
    await client.query("BEGIN");
    for (const statement of statements) await client.query(statement);
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK");
    throw error;
  } finally {
    client.release();
  }
}

const goneLogs = (r: Recorded) => r.events.filter((e) => e.event === "log" && String(e.payload.message).includes("prepared statement"));

describe("on a direct connection", () => {
  it("claim, heartbeat and complete_many (a job without a result or a key) run as named prepared statements on the pool's connection", async () => {
    const producer = new Client({ connectionString: db.url, onError: () => {} });
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    try {
      const r = await startWorker(db.url, { hold: async () => released }, "200ms");
      expect(r.worker.preparedStatements).toBe(true);
      const { jobId } = await producer.enqueue("hold", {});
      // Held while its heartbeats run: each is the prepared heartbeat.
      await waitFor(async () => functionsOf(await preparedOn(r.pool)).includes("heartbeat"), { what: "a prepared heartbeat" });
      release();
      expect((await finishedJob(producer, jobId)).state).toBe("succeeded");
      const statements = await preparedOn(r.pool);
      expect(functionsOf(statements)).toEqual(["claim", "complete_many", "heartbeat"]);
      for (const { name, statement } of statements) {
        expect(name).toMatch(/^idemq_(claim|complete_many|heartbeat)_[0-9a-f]{16}$/);
        expect(statement).toMatch(/^SELECT \* FROM idemq\.\w+\(/);
      }
      expect(r.events.filter((e) => e.event === "worker:error")).toEqual([]);
      expect(goneLogs(r)).toEqual([]);
    } finally {
      await producer.close();
    }
  }, 30_000);

  it("a statement gone from its connection (DEALLOCATE ALL): the call is sent again unprepared, said once, and the worker prepares no more", async () => {
    const producer = new Client({ connectionString: db.url, onError: () => {} });
    try {
      const r = await startWorker(db.url, { ping: async () => "pong" });
      const first = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, first.jobId)).state).toBe("succeeded");
      expect(functionsOf(await preparedOn(r.pool))).toEqual(["claim", "complete"]);
      // On the pool's one connection: pg still believes it holds them.
      await r.pool.query("DEALLOCATE ALL");
      const second = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, second.jobId)).state).toBe("succeeded");
      expect(r.worker.preparedStatements).toBe(false);
      const lines = goneLogs(r);
      expect(lines).toHaveLength(1);
      expect(lines[0]!.payload).toMatchObject({ level: "warn", workerId: r.worker.workerId });
      expect(String(lines[0]!.payload.message)).toMatch(/26000: prepared statement "idemq_claim_[0-9a-f]{16}" does not exist/);
      expect(await preparedOn(r.pool)).toEqual([]);
      const third = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, third.jobId)).state).toBe("succeeded");
      expect(await preparedOn(r.pool)).toEqual([]);
      expect(r.events.filter((e) => e.event === "worker:error")).toEqual([]);
    } finally {
      await producer.close();
    }
  }, 30_000);
});

describe("a statement of the same name already on the server (42P05: a session pooler that did not reset its connection)", () => {
  it("the call is sent again unprepared, said once, and the worker prepares no more", async () => {
    const producer = new Client({ connectionString: db.url, onError: () => {} });
    try {
      // The name another worker of the same settings gives its completion with a result.
      const first = await startWorker(db.url, { ping: async () => "pong" });
      const warmUp = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, warmUp.jobId)).state).toBe("succeeded");
      const complete = (await preparedOn(first.pool)).find((s) => functionsOf([s])[0] === "complete");
      expect(complete?.name).toMatch(/^idemq_complete_[0-9a-f]{16}$/);
      await first.worker.stop();

      // A second worker whose one connection already holds a statement of that name, which pg does not know of.
      const r = await startWorker(db.url, { ping: async () => "pong" });
      expect(r.worker.preparedStatements).toBe(true);
      await r.pool.query(`PREPARE ${complete!.name} AS SELECT 1`);
      const job = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, job.jobId)).state).toBe("succeeded");
      expect(r.worker.preparedStatements).toBe(false);
      const lines = goneLogs(r);
      expect(lines).toHaveLength(1);
      expect(lines[0]!.payload).toMatchObject({ level: "warn", workerId: r.worker.workerId });
      expect(String(lines[0]!.payload.message)).toContain(`42P05: prepared statement "${complete!.name}" already exists`);
      const next = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, next.jobId)).state).toBe("succeeded");
      expect(goneLogs(r)).toHaveLength(1);
      expect(r.events.filter((e) => e.event === "worker:error")).toEqual([]);
    } finally {
      await producer.close();
    }
  }, 30_000);
});

describe("across a migration", () => {
  it("claim replaced (CREATE OR REPLACE, as a migration does) under the prepared statement: the next claim runs the new body, still prepared", async () => {
    const producer = new Client({ connectionString: db.url, onError: () => {} });
    try {
      const r = await startWorker(db.url, { ping: async () => "pong" });
      const before = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, before.jobId)).state).toBe("succeeded");
      expect(functionsOf(await preparedOn(r.pool))).toContain("claim");
      // The same function counting its runs in a sequence, so the claims show which body ran.
      await db.pool.query("CREATE SEQUENCE public.replaced_claim_runs");
      const { rows: [definition] } = await db.pool.query<{ def: string }>("SELECT pg_get_functiondef('idemq.claim'::regproc) AS def");
      const replaced = definition!.def.replace(/\bBEGIN\b/, "BEGIN\n  PERFORM nextval('public.replaced_claim_runs');");
      expect(replaced).not.toBe(definition!.def);
      await db.pool.query(replaced);
      try {
        const after = await producer.enqueue("ping", {});
        expect((await finishedJob(producer, after.jobId)).state).toBe("succeeded");
        const runs = await db.pool.query<{ is_called: boolean }>("SELECT is_called FROM public.replaced_claim_runs");
        expect(runs.rows[0]!.is_called, "the replaced body ran").toBe(true);
        expect(functionsOf(await preparedOn(r.pool))).toEqual(["claim", "complete"]);
        expect(r.worker.preparedStatements).toBe(true);
        expect(goneLogs(r)).toEqual([]);
        expect(r.events.filter((e) => e.event === "worker:error")).toEqual([]);
      } finally {
        await db.pool.query(definition!.def);
        await db.pool.query("DROP SEQUENCE public.replaced_claim_runs");
      }
    } finally {
      await producer.close();
    }
  }, 30_000);
});

describe("a migration that changes the claim's result type (0A000: cached plan must not change result type)", () => {
  it("the claim is sent again unprepared and gets the new column, said once; the worker prepares no more", async () => {
    const producer = new Client({ connectionString: db.url, onError: () => {} });
    const { rows: [definition] } = await db.pool.query<{ def: string }>("SELECT pg_get_functiondef('idemq.claim'::regproc) AS def");
    try {
      const r = await startWorker(db.url, { ping: async () => "pong" });
      const before = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, before.jobId)).state).toBe("succeeded");
      expect(functionsOf(await preparedOn(r.pool))).toContain("claim");
      // As a later release might: a column added to claimed_job, and claim() returning it.
      const widened = definition!.def.replaceAll("c.concurrency_key\n", "c.concurrency_key, NULL::text\n");
      const count = (text: string): number => text.split("c.concurrency_key, NULL::text").length - 1;
      expect([count(definition!.def), count(widened)], "both of claim's answers widened").toEqual([0, 2]);
      await inTransaction(["ALTER TYPE idemq.claimed_job ADD ATTRIBUTE added_by_a_migration text", widened]);
      const after = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, after.jobId)).state).toBe("succeeded");
      expect(r.worker.preparedStatements).toBe(false);
      const lines = goneLogs(r);
      expect(lines).toHaveLength(1);
      expect(String(lines[0]!.payload.message)).toContain("0A000: cached plan must not change result type");
      expect(r.events.filter((e) => e.event === "worker:error")).toEqual([]);
    } finally {
      await producer.close();
      await inTransaction(["ALTER TYPE idemq.claimed_job DROP ATTRIBUTE IF EXISTS added_by_a_migration", definition!.def]);
    }
  }, 30_000);
});

describe("across a server restart", () => {
  let cluster: PrivateCluster | undefined;
  afterAll(async () => {
    await cluster?.destroy();
  });

  it("pg prepares the statements again on the new connection; the worker keeps claiming them prepared", async () => {
    const started = await startMigratedCluster();
    cluster = started.cluster;
    const producer = new Client({ connectionString: started.url, onError: () => {} });
    try {
      const r = await startWorker(started.url, { ping: async () => "pong" });
      const before = await producer.enqueue("ping", {});
      expect((await finishedJob(producer, before.jobId)).state).toBe("succeeded");
      const pidBefore = await backendPid(r.pool);
      expect(functionsOf(await preparedOn(r.pool))).toEqual(["claim", "complete"]);

      await cluster.stop("fast");
      await cluster.start();
      // Jobs enqueued after the restart are claimed (the poll finds them once the pool reconnects).
      const after = await Promise.all([1, 2, 3].map(() => waitFor(() => producer.enqueue("ping", {}).catch(() => undefined), { what: "an enqueue after the restart" })));
      for (const { jobId } of after) expect((await finishedJob(producer, jobId)).state).toBe("succeeded");

      const pidAfter = await backendPid(r.pool);
      expect(pidAfter).not.toBe(pidBefore);
      expect(functionsOf(await preparedOn(r.pool))).toEqual(["claim", "complete"]);
      expect(r.worker.preparedStatements).toBe(true);
      expect(goneLogs(r)).toEqual([]);
      // The restart's own connection errors, but none about a prepared statement.
      const errors = r.events.filter((e) => e.event === "worker:error").map((e) => (e.payload.error as { code?: string }).code);
      expect(errors.filter((code) => code === "26000" || code === "42P05" || code === "0A000")).toEqual([]);
    } finally {
      await producer.close();
    }
  }, 120_000);
});
