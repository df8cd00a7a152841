// The wake-up protocol: enqueues NOTIFY idemq_jobs only while a session waits
// for the queue (idemq.wait_for_jobs), and wait_for_jobs reports true only
// once every enqueue that skipped its NOTIFY has ended, so the claim after it
// sees their jobs. Observed with plain LISTEN sessions that do not wait (they
// hear only what waiting sessions caused) and with pg_locks. Any session may
// take advisory locks, so wait_for_jobs only tries its keys: a foreign holder
// gets a false back, never a blocked call, and enqueues notify meanwhile.
import type pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueue, enqueueMany, Listener, unique, waitForJobs } from "../helpers/jobs.ts";

const db = useTestDatabase();
/** Hears idemq_jobs without waiting for jobs itself. */
let observer: Listener;
let sender: pg.Client;

beforeAll(async () => {
  observer = await Listener.start(await db.newClient(), { waiting: false });
  sender = await db.newClient();
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
    const { rows: claimed } = await sender.query("SELECT job_id AS id, attempt FROM idemq.claim('w', $1::text[], 2) ORDER BY id", [
      [queue],
    ]);
    expect(claimed).toHaveLength(2);
    await sender.query("SELECT idemq.fail($1, $2, '{\"message\": \"again\"}', true, now(), lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [claimed[0].id, claimed[0].attempt]);
    await sender.query("SELECT idemq.fail($1, $2, '{\"message\": \"no\"}', false, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [claimed[1].id, claimed[1].attempt]);
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
    const claimed = await waiter.query("SELECT job_id AS id FROM idemq.claim('w', $1::text[], 10) ORDER BY id", [[queue]]);
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
      const { rows } = await claimer.query("SELECT job_id AS id FROM idemq.claim('w', $1::text[], $2)", [[queue], batch]);
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

describe("no session can block it, and its locks are bounded", () => {
  /** The key another session would compute for a queue (NULL: all queues; '': the barrier). */
  async function keyOf(queue: string | null): Promise<string> {
    const { rows } = await sender.query<{ key: string }>("SELECT idemq._wait_key($1)::text AS key", [queue]);
    return rows[0]!.key;
  }

  it("a marker held exclusively by another session: wait_for_jobs returns false at once, enqueues notify meanwhile, and true once it is let go", async () => {
    const queue = unique("q");
    const holder = await db.newClient();
    const waiter = await db.newClient();
    await holder.query("SELECT pg_advisory_lock($1::bigint)", [await keyOf(queue)]);
    // Answers (false) instead of waiting for the holder: a blocked call would hang this test.
    const first = await waiter.query("SELECT idemq.wait_for_jobs($1::text[]) AS ready", [[queue]]);
    expect(first.rows[0].ready).toBe(false);
    expect(await markersHeld(waiter)).toBe(0);
    // The enqueue cannot take the marker either, so it notifies.
    await enqueue(sender, { task: "t", queue });
    expect(await heard(queue)).toBe(1);
    await holder.query("SELECT pg_advisory_unlock_all()");
    const again = await waiter.query("SELECT idemq.wait_for_jobs($1::text[]) AS ready", [[queue]]);
    expect(again.rows[0].ready).toBe(true);
    expect(await markersHeld(waiter)).toBe(1);
    await holder.end();
    await waiter.end();
  });

  it("the all-queues marker and the barrier held exclusively: wait_for_jobs(NULL) returns false at once, and every enqueue notifies", async () => {
    const queue = unique("q");
    const holder = await db.newClient();
    const waiter = await db.newClient();
    await holder.query("SELECT pg_advisory_lock($1::bigint), pg_advisory_lock($2::bigint)", [await keyOf(null), await keyOf("")]);
    expect((await waiter.query("SELECT idemq.wait_for_jobs() AS ready")).rows[0].ready).toBe(false);
    await enqueue(sender, { task: "t", queue });
    await enqueueMany(sender, [{ task: "t", queue }]);
    expect(await heard(queue)).toBe(2);
    await holder.end();
    await waitForJobs(waiter, null);
    await waiter.end();
  });

  it("the barrier held shared by another session: wait_for_jobs keeps returning false, but holds its marker, so enqueues notify", async () => {
    const queue = unique("q");
    const holder = await db.newClient();
    const waiter = await db.newClient();
    await holder.query("SELECT pg_advisory_lock_shared($1::bigint)", [await keyOf("")]);
    expect((await waiter.query("SELECT idemq.wait_for_jobs($1::text[]) AS ready", [[queue]])).rows[0].ready).toBe(false);
    expect(await markersHeld(waiter)).toBe(1);
    await enqueue(sender, { task: "t", queue });
    expect(await heard(queue)).toBe(1);
    await holder.end();
    expect((await waiter.query("SELECT idemq.wait_for_jobs($1::text[]) AS ready", [[queue]])).rows[0].ready).toBe(true);
    await waiter.end();
  });

  it("5,000 queue names in one call hold one marker (all queues), which an enqueue into any queue notifies; stop_waiting with the same names releases it", async () => {
    const names = Array.from({ length: 5_000 }, (_, i) => unique(`many${i}_`));
    const other = unique("other");
    const waiter = await db.newClient();
    await waitForJobs(waiter, names);
    expect(await markersHeld(waiter)).toBe(1);
    const { rows } = await waiter.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'");
    expect(rows[0]!.n).toBe(1);
    await enqueue(sender, { task: "t", queue: names[4_321]! });
    await enqueue(sender, { task: "t", queue: other });
    expect(await heard(names[4_321]!)).toBe(1);
    expect(await heard(other)).toBe(1);
    await waiter.query("SELECT idemq.stop_waiting($1::text[])", [names]);
    expect(await markersHeld(waiter)).toBe(0);
    await waiter.end();
  });

  it("up to 16 queues hold one marker each; the 17th queue, and the thousands after it, add only the all-queues marker", async () => {
    const { rows: limit } = await sender.query<{ n: number }>("SELECT idemq._wait_marker_limit() AS n");
    expect(limit[0]!.n).toBe(16);
    const waiter = await db.newClient();
    const sixteen = Array.from({ length: 16 }, (_, i) => unique(`own${i}_`));
    await waitForJobs(waiter, sixteen);
    expect(await markersHeld(waiter)).toBe(16);
    // One name per call, 2,000 calls: the session's total stays bounded too.
    const late = Array.from({ length: 2_000 }, (_, i) => unique(`late${i}_`));
    for (const q of late) await waiter.query("SELECT idemq.wait_for_jobs($1::text[])", [[q]]);
    expect(await markersHeld(waiter)).toBe(17);
    // Still notified for the last of them (through the all-queues marker), and for its own 16.
    await enqueue(sender, { task: "t", queue: late.at(-1)! });
    await enqueue(sender, { task: "t", queue: sixteen[0]! });
    expect(await heard(late.at(-1)!)).toBe(1);
    expect(await heard(sixteen[0]!)).toBe(1);
    // A list of 16 releases exactly its markers; NULL releases the all-queues marker.
    await waiter.query("SELECT idemq.stop_waiting($1::text[])", [sixteen]);
    expect(await markersHeld(waiter)).toBe(1);
    await waiter.query("SELECT idemq.stop_waiting()");
    expect(await markersHeld(waiter)).toBe(0);
    await waiter.end();
  });
});
