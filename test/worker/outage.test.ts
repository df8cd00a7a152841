// Outages as the worker reports them (src/worker/outage.ts): the first
// connection failure of an outage is one worker:error, and the first call
// made after it that gets an answer ends it with one worker:reconnected. Any
// call counts, not only a claim: a worker whose claim loop sleeps its error
// backoff (or waits for a NOTIFY) while its other calls reach the database
// again is up, and a second outage is a second report. Before, only a claim
// ended an outage, so a worker that made no claim between two restarts that
// came within its backoff reported one outage for both (server-restart.test.ts).
// An answer to a call made before the outage began ends nothing: it may have
// been sent before the failure and read after it.
//
// Sessions here: the worker's pool (application_name idemq-worker) is cut with
// pg_terminate_backend; its LISTEN and wait-marker sessions are left alone, and
// its timers are an hour away, so only the calls the test makes reach the
// database.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Outage } from "../../src/worker/outage.ts";
import { useTestDatabase, waitUntilBlocked } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let w: TestWorker;
/** The worker's claims, outage reports and reconnections, in the order they came. */
const order: string[] = [];

beforeAll(async () => {
  const hour = "1 hour";
  w = await startTestWorker(
    db.url,
    { noop: async () => {} },
    { pollInterval: hour, rescueInterval: hour, tickInterval: hour, pruneInterval: hour, presenceInterval: hour, retentionInterval: hour },
  );
  for (const event of ["worker:claimed", "worker:error", "worker:reconnected"] as const) w.worker.on(event, () => order.push(event));
  // Idle from here on: the wait marker is set (its session holds the advisory lock) and the claim
  // wait_for_jobs asked for has returned; then only a NOTIFY, which nothing sends, wakes the claim loop.
  await waitFor(
    async () => {
      const { rows } = await db.pool.query(
        `SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
          WHERE a.application_name = 'idemq-wait-marker' AND l.locktype = 'advisory' AND l.granted`,
      );
      return rows.length > 0;
    },
    { what: "the wait marker set" },
  );
  await waitFor(() => order.filter((e) => e === "worker:claimed").length >= 2, { what: "the claim after the wait marker was set" });
});
afterEach(() => {
  // Every report was an outage's first failure, each ended by its own worker:reconnected.
  expect(w.of("worker:error").length).toBe(w.of("worker:reconnected").length);
});
afterAll(async () => {
  await stopWorkers();
});

/** Ends the worker's idle pool sessions (its pool reports an error for each); returns how many. */
async function cutIdlePoolSessions(): Promise<number> {
  const { rows } = await db.pool.query<{ ok: boolean }>(
    `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
      WHERE datname = current_database() AND application_name = 'idemq-worker' AND state = 'idle'`,
  );
  return rows.filter((r) => r.ok).length;
}

async function reports(event: "worker:error" | "worker:reconnected", count: number): Promise<Record<string, unknown>[]> {
  return waitFor(() => (w.of(event).length >= count ? w.of(event) : undefined), { what: `${count} ${event}` });
}

describe("an outage", () => {
  it("ends with any call that gets an answer, not only a claim; the next one is reported again", async () => {
    for (let outage = 1; outage <= 2; outage++) {
      // A call leaves a pool connection idle, to be cut.
      expect(await w.worker.presence.runOnce()).toBe(1);
      const from = order.length;
      expect(await cutIdlePoolSessions()).toBeGreaterThan(0);
      const errors = await reports("worker:error", outage);
      expect(errors).toHaveLength(outage);
      expect(errors[outage - 1]).toMatchObject({ during: "an idle pool connection" });
      // rescue() is answered: the database is back.
      expect(await w.worker.rescuer.runOnce()).toBe(0);
      const reconnected = await reports("worker:reconnected", outage);
      expect(reconnected).toHaveLength(outage);
      expect(reconnected[outage - 1]!.failedCalls).toBeGreaterThanOrEqual(1);
      // No claim came between: the claim loop waited for a NOTIFY all along.
      expect(order.slice(from)).toEqual(["worker:error", "worker:reconnected"]);
    }
  });

  it("does not end with the answer to a call made before it began", async () => {
    const before = { errors: w.of("worker:error").length, reconnected: w.of("worker:reconnected").length };
    // Two pool connections: one for the call held back below, one idle to be cut.
    await Promise.all([w.worker.rescuer.runOnce(), w.worker.keyPruner.runOnce()]);
    const locker = await db.pool.connect();
    try {
      await locker.query("BEGIN");
      await locker.query("SELECT 1 FROM idemq.workers WHERE worker_id = $1 FOR UPDATE", [w.worker.workerId]);
      // worker_seen waits for the worker's row, which the locker holds.
      const seen = w.worker.presence.runOnce();
      const [held] = await waitFor(
        async () => {
          const { rows } = await db.pool.query<{ pid: number }>(
            `SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'idemq-worker' AND wait_event_type = 'Lock'`,
          );
          return rows.length === 1 ? rows : undefined;
        },
        { what: "worker_seen waiting for the worker's row" },
      );
      await waitUntilBlocked(db.pool, held!.pid);
      expect(await cutIdlePoolSessions()).toBeGreaterThan(0);
      await reports("worker:error", before.errors + 1);
      await locker.query("ROLLBACK");
      // Answered after the outage began, but made before it.
      expect(await seen).toBe(1);
      expect(w.of("worker:reconnected")).toHaveLength(before.reconnected);
    } finally {
      locker.release();
    }
    // A call made now ends it.
    expect(await w.worker.rescuer.runOnce()).toBe(0);
    await reports("worker:reconnected", before.reconnected + 1);
  });
});

describe("Outage, on a clock of its own", () => {
  const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" });

  function outageAt(): { outage: Outage; ended: [number, number][]; clock: { now: number } } {
    const clock = { now: 1000 };
    const ended: [number, number][] = [];
    return { outage: new Outage((downMs, failedCalls) => ended.push([downMs, failedCalls]), () => clock.now), ended, clock };
  }

  it("reports the first connection failure of an outage, counts the others, and reports every other error", () => {
    const { outage, ended } = outageAt();
    expect(outage.failed(refused)).toBe(true);
    expect(outage.failed(refused)).toBe(false);
    expect(outage.failed(new Error("permission denied for function claim"))).toBe(true);
    expect(ended).toEqual([]);
  });

  it("ends with the answer to a call made when it began or later, not earlier", () => {
    const { outage, ended, clock } = outageAt();
    outage.failed(refused); // began at 1000
    clock.now = 1500;
    outage.failed(refused);
    outage.reached(999.9); // made just before it began
    expect(ended).toEqual([]);
    clock.now = 2000;
    outage.reached(1000); // made as it began
    expect(ended).toEqual([[1000, 2]]);
    // Over: a later answer ends nothing more, and the next failure begins the next outage.
    outage.reached(2000);
    expect(ended).toHaveLength(1);
    expect(outage.failed(refused)).toBe(true);
  });

  it("counts the outages that ended and their time down (what worker_seen reports); one in progress is not counted yet", () => {
    const { outage, clock } = outageAt();
    expect(outage.livedThrough()).toEqual({ outages: 0, downMs: 0 });
    outage.failed(refused);
    clock.now = 1250;
    outage.reached(1000);
    outage.failed(refused); // the next one begins at 1250
    expect(outage.livedThrough()).toEqual({ outages: 1, downMs: 250 });
    clock.now = 2000;
    outage.reached(1250);
    expect(outage.livedThrough()).toEqual({ outages: 2, downMs: 1000 });
  });
});
