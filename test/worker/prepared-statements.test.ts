// The worker's hot calls as named prepared statements (src/worker/prepared-calls.ts).
// On a direct connection, claim, heartbeat, complete and complete_and_take_next are prepared
// on the pool's connection (read from pg_prepared_statements in that very
// session: the worker's pool is the test's, of one connection). A statement
// gone from its connection (DEALLOCATE ALL) is sent again unprepared, said
// once, and the worker prepares no more. A claim function replaced under its
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

const goneLogs = (r: Recorded) => r.events.filter((e) => e.event === "log" && String(e.payload.message).includes("prepared statement"));

describe("on a direct connection", () => {
  it("claim, heartbeat and complete_and_take_next (a job without a result) run as named prepared statements on the pool's connection", async () => {
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
      expect(functionsOf(statements)).toEqual(["claim", "complete_and_take_next", "heartbeat"]);
      for (const { name, statement } of statements) {
        expect(name).toMatch(/^idemq_(claim|complete_and_take_next|heartbeat)_[0-9a-f]{16}$/);
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
