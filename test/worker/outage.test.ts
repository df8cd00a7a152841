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

describe("a single cut connection", () => {
  it("ends at the next answered call though the pool's other connections are older than the outage (a fresh connection is accepted)", async () => {
    const before = { errors: w.of("worker:error").length, reconnected: w.of("worker:reconnected").length };
    // Three calls at once leave several pool connections idle.
    await Promise.all([w.worker.rescuer.runOnce(), w.worker.keyPruner.runOnce(), w.worker.presence.runOnce()]);
    const { rows: cut } = await db.pool.query<{ ok: boolean }>(
      `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
        WHERE pid = (SELECT pid FROM pg_stat_activity
                      WHERE datname = current_database() AND application_name = 'idemq-worker' AND state = 'idle'
                      ORDER BY backend_start LIMIT 1)`,
    );
    expect(cut).toEqual([{ ok: true }]);
    await reports("worker:error", before.errors + 1);
    // Older connections are left idle in the pool: the next call is answered on one of them.
    const { rows: older } = await db.pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE datname = current_database() AND application_name = 'idemq-worker' AND state = 'idle'`,
    );
    expect(older[0]!.n).toBeGreaterThanOrEqual(1);
    expect(await w.worker.rescuer.runOnce()).toBe(0);
    const reconnected = await reports("worker:reconnected", before.reconnected + 1);
    expect(reconnected).toHaveLength(before.reconnected + 1);
    expect(reconnected.at(-1)!.failedCalls).toBe(1);
    expect(w.of("worker:error")).toHaveLength(before.errors + 1);
  });
});

describe("Outage, on a clock of its own", () => {
  const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" });

  const shuttingDown = Object.assign(new Error("the database system is shutting down"), { code: "57P03" });
  const terminated = Object.assign(new Error("terminating connection due to administrator command"), { code: "57P01" });

  /** An Outage whose probes reach a server that accepts new connections while `server.up` (a refusal says why not). */
  function outageAt(): { outage: Outage; ended: [number, number][]; clock: { now: number }; server: { up: boolean; probes: number } } {
    const clock = { now: 1000 };
    const ended: [number, number][] = [];
    const server = { up: true, probes: 0 };
    const open = async () => {
      server.probes++;
      if (!server.up) throw shuttingDown;
    };
    return { outage: new Outage((downMs, failedCalls) => ended.push([downMs, failedCalls]), open, () => clock.now), ended, clock, server };
  }

  it("reports the first connection failure of an outage, counts the others, and reports every other error", () => {
    const { outage, ended } = outageAt();
    expect(outage.failed(refused)).toBe(true);
    expect(outage.failed(refused)).toBe(false);
    expect(outage.failed(new Error("permission denied for function claim"))).toBe(true);
    expect(ended).toEqual([]);
  });

  it("ends with the answer to a call made when it began or later, not earlier", async () => {
    const { outage, ended, clock } = outageAt();
    outage.failed(refused); // began at 1000
    clock.now = 1500;
    outage.failed(refused);
    await outage.reached(999.9); // made just before it began
    expect(ended).toEqual([]);
    clock.now = 2000;
    await outage.reached(1000); // made as it began
    expect(ended).toEqual([[1000, 2]]);
    // Over: a later answer ends nothing more, and the next failure begins the next outage.
    await outage.reached(2000);
    expect(ended).toHaveLength(1);
    expect(outage.failed(refused)).toBe(true);
  });

  it("counts the outages that ended and their time down (what worker_seen reports); one in progress is not counted yet", async () => {
    const { outage, clock } = outageAt();
    expect(outage.livedThrough()).toEqual({ outages: 0, downMs: 0 });
    outage.failed(refused);
    clock.now = 1250;
    await outage.reached(1000);
    outage.failed(refused); // the next one begins at 1250
    expect(outage.livedThrough()).toEqual({ outages: 1, downMs: 250 });
    clock.now = 2000;
    await outage.reached(1250);
    expect(outage.livedThrough()).toEqual({ outages: 2, downMs: 1000 });
  });

  // The restart race (CI: 5 outages for 4 restarts): a fast or immediate shutdown signals the backends
  // one by one, so the first cut is read (the outage begins) while another pooled connection's backend
  // is not signalled yet, and answers the worker's next call; its own cut comes a moment later. The
  // order below is the one a script against a private cluster saw under load (-m immediate: a call
  // made after the first cut answered 82 ms later, and a connection opened then refused with 57P03).
  it("a call answered on a connection the shutdown has not cut yet ends nothing: that connection's cut is the same outage", async () => {
    const { outage, ended, clock, server } = outageAt();
    server.up = false; // shutting down: new connections are refused
    expect(outage.failed(terminated)).toBe(true); // connection A cut: the outage begins at 1000
    clock.now = 1001;
    await outage.reached(1000.5); // made after it began, answered on connection B, not signalled yet
    expect(ended).toEqual([]);
    expect(server.probes).toBe(1); // refused: the server is shutting down
    clock.now = 1002;
    expect(outage.failed(terminated)).toBe(false); // B cut: the same outage, not a second report
    expect(outage.failed(refused)).toBe(false); // the server is down
    clock.now = 4000;
    server.up = true; // restarted
    await outage.reached(3900); // the first call on a new connection
    expect(ended).toEqual([[3000, 3]]);
    expect(outage.livedThrough()).toEqual({ outages: 1, downMs: 3000 });
  });

  it("a single cut connection ends at the next answered call, whichever connection answered: the probe is accepted", async () => {
    const { outage, ended, clock, server } = outageAt();
    expect(outage.failed(terminated)).toBe(true); // pg_terminate_backend on one pooled connection
    clock.now = 1020;
    await outage.reached(1010); // answered on an older idle connection the server did not cut
    expect(server.probes).toBe(1);
    expect(ended).toEqual([[20, 1]]);
  });

  it("probes once at a time, and an answer from a server that accepts connections but refuses this one (too many clients) ends it", async () => {
    const clock = { now: 1000 };
    const ended: [number, number][] = [];
    let release!: (error?: Error) => void;
    let probes = 0;
    const slow = new Outage(
      (downMs, failedCalls) => ended.push([downMs, failedCalls]),
      () => {
        probes++;
        return new Promise<void>((resolve, reject) => (release = (error) => (error === undefined ? resolve() : reject(error))));
      },
      () => clock.now,
    );
    slow.failed(refused);
    const first = slow.reached(1000);
    const second = slow.reached(1001);
    expect(probes).toBe(1);
    release(Object.assign(new Error("sorry, too many clients already"), { code: "53300" }));
    await Promise.all([first, second]);
    expect(ended).toEqual([[0, 1]]);
    expect(slow.livedThrough()).toEqual({ outages: 1, downMs: 0 });
  });
});
