// Worker presence (src/worker/maintenance/presence.ts): a worker registers its row in idemq.workers
// at start (its queues and task names), refreshes it on its presence timer,
// and marks it stopped at a clean stop. On a private cluster behind a
// transaction-pooling PgBouncer (poll mode: no session state), the refreshes
// go through the pooler and resume after the server restarts; a row deleted
// while the server was down (as apply_retention would delete a stale one) is
// registered again.
import { hostname } from "node:os";
import pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { type PgBouncer, startPgBouncer } from "../helpers/pgbouncer.ts";
import { type PrivateCluster, startMigratedCluster } from "../helpers/private-cluster.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const tasks = { bill: async () => {}, send: async () => {} };

interface Row {
  worker_id: string;
  queues: string[] | null;
  tasks: string[] | null;
  last_seen_at: Date;
}

async function workerRows(db: pg.Pool): Promise<Row[]> {
  return (await db.query<Row>("SELECT worker_id, queues, tasks, last_seen_at FROM idemq.workers() ORDER BY worker_id")).rows;
}

/** A clean stop keeps the row, stopped (worker_stopped), for the dashboard's recently stopped workers. */
async function stoppedRows(db: pg.Pool): Promise<{ worker_id: string; stopped: boolean }[]> {
  return (await db.query("SELECT worker_id, stopped_at IS NOT NULL AS stopped FROM idemq.workers() ORDER BY worker_id")).rows;
}

describe("presence on a direct connection", () => {
  const db = useTestDatabase({ poolSize: 2 });
  afterEach(async () => {
    await stopWorkers();
  });

  it("registered at start with its queues and tasks, refreshed by runOnce(), marked stopped at stop", async () => {
    const { worker } = await startTestWorker(db.url, tasks, { workerId: "presence-1", queues: ["emails", "bills"], presenceInterval: "1 hour" });
    const [row] = await workerRows(db.pool);
    expect(row).toMatchObject({ worker_id: "presence-1", queues: ["bills", "emails"], tasks: ["bill", "send"] });

    await db.pool.query("UPDATE idemq.workers SET last_seen_at = now() - interval '10 minutes' WHERE worker_id = 'presence-1'");
    expect(await worker.presence.runOnce()).toBe(1);
    const { rows } = await db.pool.query("SELECT extract(epoch FROM now() - last_seen_at) < 5 AS fresh FROM idemq.workers");
    expect(rows).toEqual([{ fresh: true }]);

    await worker.stop();
    expect(await stoppedRows(db.pool)).toEqual([{ worker_id: "presence-1", stopped: true }]);
  });

  it("a worker of every queue registers queues NULL; its timer refreshes the row on its own", async () => {
    await startTestWorker(db.url, tasks, { workerId: "presence-2", presenceInterval: "100ms" });
    // The earlier test's worker stays listed, stopped: this one's row only.
    const row = async () => (await workerRows(db.pool)).find((r) => r.worker_id === "presence-2")!;
    const first = await row();
    expect(first).toMatchObject({ queues: null, tasks: ["bill", "send"] });
    await waitFor(async () => (await row()).last_seen_at > first.last_seen_at, { what: "a refresh by the timer" });
  });

  it("refuses a presenceInterval of 0: a worker that never says it is there looks gone", async () => {
    await expect(startTestWorker(db.url, tasks, { presenceInterval: 0 })).rejects.toThrow(/presenceInterval must be more than 0/);
  });
});

describe("presence through a transaction pooler, across a server restart", () => {
  let cluster: PrivateCluster;
  let bouncer: PgBouncer;
  let direct: pg.Pool;

  beforeAll(async () => {
    ({ cluster } = await startMigratedCluster());
    direct = new pg.Pool({ connectionString: cluster.url("idemq"), max: 2 });
    direct.on("error", () => {});
    bouncer = await startPgBouncer({ serverPort: cluster.port, poolMode: "transaction", poolSize: 10, ignoreStartupParameters: [] });
  }, 120_000);

  afterAll(async () => {
    await stopWorkers();
    await direct?.end().catch(() => {});
    await bouncer?.stop();
    await cluster?.destroy();
  });

  it("refreshes through PgBouncer, registers again after a restart that lost its row, and leaves at stop", async () => {
    const { worker } = await startTestWorker(bouncer.url("idemq"), tasks, {
      workerId: "pooled-1",
      wakeUp: "poll",
      presenceInterval: "200ms",
    });
    expect(await workerRows(direct)).toMatchObject([{ worker_id: "pooled-1", tasks: ["bill", "send"] }]);

    await cluster.stop("fast");
    await cluster.start();
    // The row a long outage would have let apply_retention delete.
    const { rowCount } = await waitFor(
      async () => {
        try {
          return await direct.query("DELETE FROM idemq.workers WHERE worker_id = 'pooled-1'");
        } catch {
          return undefined; // the pool's connection died with the server; the next one reaches it
        }
      },
      { what: "the restarted server answering" },
    );
    expect(rowCount).toBe(1); // the row outlived the restart (it is a table row); deleted here, it must come back
    const [back] = await waitFor(async () => {
      const rows = await workerRows(direct);
      return rows.length === 1 ? rows : undefined;
    }, { what: "the worker registering again after the restart" });
    expect(back).toMatchObject({ worker_id: "pooled-1", queues: null, tasks: ["bill", "send"] });
    // It says it lived through the outage (the dashboard's workers page shows it), and where it runs.
    const lived = await waitFor(async () => {
      const { rows } = await direct.query(
        "SELECT outages, outage_ms::float8 AS outage_ms, last_outage_at, host, pid, concurrency, refresh_every = interval '200 ms' AS every FROM idemq.workers() WHERE worker_id = 'pooled-1'",
      );
      return rows[0]?.outages >= 1 ? rows[0] : undefined;
    }, { what: "the worker reporting the outage it lived through" });
    expect(lived).toMatchObject({ host: hostname(), pid: process.pid, every: true });
    expect(lived.outages).toBeGreaterThanOrEqual(1);
    expect(lived.outage_ms).toBeGreaterThan(0);
    expect(lived.last_outage_at).toBeInstanceOf(Date);

    await worker.stop();
    expect(await stoppedRows(direct)).toEqual([{ worker_id: "pooled-1", stopped: true }]);
  });
});
