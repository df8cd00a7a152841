// The wake-up protocol: enqueues NOTIFY idemq_jobs only while a session waits
// for the queue (idemq.wait_for_jobs), and wait_for_jobs reports true only
// once every enqueue that skipped its NOTIFY has ended, so the claim after it
// sees their jobs. Observed with plain LISTEN sessions that do not wait (they
// hear only what waiting sessions caused) and with pg_locks.
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase, type TestDatabase } from "../helpers/db.ts";
import { enqueue, enqueueMany, Listener, unique, waitForJobs } from "../helpers/jobs.ts";

let db: TestDatabase;
/** Hears idemq_jobs without waiting for jobs itself. */
let observer: Listener;
let sender: pg.Client;

beforeAll(async () => {
  db = await freshDatabase();
  observer = await Listener.start(await db.newClient(), { waiting: false });
  sender = await db.newClient();
});
afterAll(async () => {
  await db?.drop();
});

/** Notifications of idemq_jobs heard by a session that LISTENs and does not wait. */
async function heard(queue: string): Promise<number> {
  await observer.sync(sender);
  return observer.payloads().filter((p) => p === queue).length;
}

async function markersHeld(client: pg.ClientBase): Promise<number> {
  const { rows } = await client.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND mode = 'ShareLock'",
  );
  return rows[0]!.n;
}

describe("NOTIFY only while a session waits", () => {
  it("nobody waiting: enqueue, enqueue_many, a due retry (fail) and retry() make jobs runnable and send nothing", async () => {
    const queue = unique("q");
    await enqueue(sender, { task: "t", queue });
    await enqueueMany(sender, [{ task: "t", queue }]);
    const { rows: claimed } = await sender.query("SELECT id, attempt FROM idemq.claim('w', $1::text[], 2) ORDER BY id", [
      [queue],
    ]);
    expect(claimed).toHaveLength(2);
    await sender.query("SELECT idemq.fail($1, $2, '{\"message\": \"again\"}', true, now())", [claimed[0].id, claimed[0].attempt]);
    await sender.query("SELECT idemq.fail($1, $2, '{\"message\": \"no\"}', false)", [claimed[1].id, claimed[1].attempt]);
    await sender.query("SELECT idemq.retry($1)", [claimed[1].id]);
    expect(await heard(queue)).toBe(0);
    const { rows } = await sender.query(
      "SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state IN ('enqueued', 'scheduled') AND run_at <= now()",
      [queue],
    );
    expect(rows[0].n).toBe(2);
  });

  it("a session waiting for queue A makes enqueues into A notify, not those into B", async () => {
    const [a, b] = [unique("a"), unique("b")];
    const waiter = await db.newClient();
    await waitForJobs(waiter, [a]);
    await enqueue(sender, { task: "t", queue: a });
    await enqueue(sender, { task: "t", queue: b });
    expect(await heard(a)).toBe(1);
    expect(await heard(b)).toBe(0);
    await waiter.end();
  });

  it("a session waiting for every queue (NULL) makes every enqueue notify, once per queue per call", async () => {
    const [a, b] = [unique("a"), unique("b")];
    const waiter = await db.newClient();
    await waitForJobs(waiter, null);
    await enqueueMany(sender, [{ task: "t", queue: a }, { task: "t", queue: a }, { task: "t", queue: b }]);
    expect(await heard(a)).toBe(1);
    expect(await heard(b)).toBe(1);
    await waiter.end();
  });

  it("stop_waiting ends it; so does the end of the session, not of a transaction", async () => {
    const queue = unique("q");
    const waiter = await db.newClient();
    await waiter.query("BEGIN");
    await waitForJobs(waiter, [queue]);
    await waiter.query("ROLLBACK");
    await enqueue(sender, { task: "t", queue });
    expect(await heard(queue)).toBe(1);

    await waiter.query("SELECT idemq.stop_waiting($1::text[])", [[queue]]);
    expect(await markersHeld(waiter)).toBe(0);
    await enqueue(sender, { task: "t", queue });
    expect(await heard(queue)).toBe(1);

    await waitForJobs(waiter, [queue]);
    await enqueue(sender, { task: "t", queue });
    expect(await heard(queue)).toBe(2);
    await waiter.end();
    await enqueue(sender, { task: "t", queue });
    expect(await heard(queue)).toBe(2);
  });

  it("calling wait_for_jobs again holds one marker per queue; stop_waiting of other queues releases nothing", async () => {
    const [a, b] = [unique("a"), unique("b")];
    const waiter = await db.newClient();
    await waitForJobs(waiter, [a, b, a]);
    await waitForJobs(waiter, [a, b]);
    expect(await markersHeld(waiter)).toBe(2);
    await waiter.query("SELECT idemq.stop_waiting($1::text[])", [[unique("other")]]);
    expect(await markersHeld(waiter)).toBe(2);
    await waiter.query("SELECT idemq.stop_waiting($1::text[])", [[a]]);
    expect(await markersHeld(waiter)).toBe(1);
    await waiter.query("SELECT idemq.stop_waiting($1::text[])", [[b]]);
    expect(await markersHeld(waiter)).toBe(0);
    await waiter.end();
  });
});

describe("the barrier: no wake-up is lost", () => {
  it("wait_for_jobs is false while an enqueue that skipped NOTIFY is open, true once it committed, and the claim then sees its job", async () => {
    const queue = unique("q");
    const waiter = await db.newClient();
    await sender.query("BEGIN");
    const { job_id } = await enqueue(sender, { task: "t", queue }); // nobody waits: no NOTIFY
    const first = await waiter.query("SELECT idemq.wait_for_jobs($1::text[]) AS ready", [[queue]]);
    expect(first.rows[0].ready).toBe(false);
    // Waiting now: a second enqueue in the same open transaction does notify.
    await enqueue(sender, { task: "t", queue });
    await sender.query("COMMIT");
    expect(await heard(queue)).toBe(1);
    const again = await waiter.query("SELECT idemq.wait_for_jobs($1::text[]) AS ready", [[queue]]);
    expect(again.rows[0].ready).toBe(true);
    const claimed = await waiter.query("SELECT id FROM idemq.claim('w', $1::text[], 10) ORDER BY id", [[queue]]);
    expect(claimed.rows.map((r) => r.id)).toContain(job_id);
    await waiter.end();
  });

  it("an enqueue rolled back also lets wait_for_jobs return true", async () => {
    const queue = unique("q");
    const waiter = await db.newClient();
    await sender.query("BEGIN");
    await enqueue(sender, { task: "t", queue });
    expect((await waiter.query("SELECT idemq.wait_for_jobs($1::text[]) AS r", [[queue]])).rows[0].r).toBe(false);
    await sender.query("ROLLBACK");
    expect((await waiter.query("SELECT idemq.wait_for_jobs($1::text[]) AS r", [[queue]])).rows[0].r).toBe(true);
    await waiter.end();
  });

  it("4 enqueuing connections against a session that claims, waits and claims again: no wake-up is lost", async () => {
    const queue = unique("q");
    const total = 400;
    const batch = 3;
    const waiter = await db.newClient();
    await waiter.query("LISTEN idemq_jobs");
    const claimer = await db.newClient();
    const claimed = new Set<string>();
    let notified: (() => void) | undefined;
    let notifications = 0;
    waiter.on("notification", (n) => {
      if (n.channel !== "idemq_jobs" || n.payload !== queue) return;
      notifications++;
      notified?.();
    });
    const claimSome = async (): Promise<number> => {
      const { rows } = await claimer.query("SELECT id FROM idemq.claim('w', $1::text[], $2)", [[queue], batch]);
      for (const r of rows) claimed.add(r.id as string);
      return rows.length;
    };
    const runnable = async (): Promise<number> => {
      const { rows } = await claimer.query(
        "SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state = 'enqueued'",
        [queue],
      );
      return rows[0].n as number;
    };
    // What a worker does: claim while claims come back full (not waiting then);
    // when one comes back short, wait_for_jobs until true and claim once more;
    // then sleep until a NOTIFY. A sleep that ends without one while jobs are
    // runnable is a lost wake-up.
    let enqueuersDone = false;
    let lostWakeUps = 0;
    const consumer = (async () => {
      for (;;) {
        while ((await claimSome()) === batch) {
          await waiter.query("SELECT idemq.stop_waiting($1::text[])", [[queue]]);
        }
        await waitForJobs(waiter, [queue]);
        if ((await claimSome()) > 0) continue;
        if (enqueuersDone && claimed.size === total) return;
        const byNotify = await new Promise<boolean>((resolve) => {
          const timer = setTimeout(() => resolve(false), 1_000);
          notified = () => (clearTimeout(timer), resolve(true));
        });
        notified = undefined;
        if (!byNotify && (await runnable()) > 0) lostWakeUps++;
      }
    })();
    const enqueuers = await Promise.all([0, 1, 2, 3].map(() => db.newClient()));
    await Promise.all(
      enqueuers.map(async (c, k) => {
        for (let i = 0; i < total / enqueuers.length; i++) {
          // Pauses now and then, so the consumer keeps running dry and waiting again.
          if (i % 5 === k) await new Promise((r) => setTimeout(r, 3));
          await enqueue(c, { task: "t", queue, payload: { i, k } });
        }
      }),
    );
    enqueuersDone = true;
    await consumer;
    expect(claimed.size).toBe(total);
    expect(lostWakeUps).toBe(0);
    expect(notifications).toBeGreaterThan(0);
  });
});
