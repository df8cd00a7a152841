// idemq.hold(..., scope => 'key') (issue 26, item 5): a 429 for one
// concurrency key (one customer's API key) holds back that key only. No job
// of the key runs before the hold's end, however it becomes runnable: the
// key's runnable jobs are moved to it, and so is a job admitted later (a new
// enqueue, a promotion), retried or snoozed while the hold lasts (the jobs
// trigger _count_jobs). Other keys run on, K (per_key) is kept. Each case
// uses its own queue and key (unique()), since these commit. As in
// hold.test.ts, the clock hand a test moves is the hold's end (and the run_at
// of the jobs it moved, as makeDue does); the interleavings order a hold
// against a promotion and a retry by pg_blocking_pids.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, interleave, useTestDatabase } from "../helpers/db.ts";
import { enqueueMany, jobRow, makeJob, states, unique } from "../helpers/jobs.ts";
import { claim, claimOne, complete, expireLease, fail, rescue, snooze, type ClaimedJob } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 6 });
const claimToken = { token: true } as const;

async function holdKey(c: pg.ClientBase | pg.Pool, job: ClaimedJob, until: string, token: string | null = job.lease_token): Promise<Date> {
  const { rows } = await c.query<{ held: Date }>(
    "SELECT idemq.hold(job_id => $1, attempt => $2, scope => 'key', until => $3::timestamptz, lease_token => $4) AS held",
    [job.job_id, job.attempt, until, token],
  );
  return rows[0]!.held;
}

async function dbNowPlus(interval: string): Promise<string> {
  const { rows } = await db.pool.query<{ t: string }>("SELECT (now() + $1::interval)::text AS t", [interval]);
  return rows[0]!.t;
}

/** The key's hold still to come; undefined when none. */
async function keyHeldUntil(key: string): Promise<Date | undefined> {
  const { rows } = await db.pool.query<{ t: Date }>(
    "SELECT held_until AS t FROM idemq.key_holds WHERE concurrency_key = $1 AND held_until > now()",
    [key],
  );
  return rows[0]?.t;
}

/** Each job's state and whether its run_at is exactly its key's hold's end. */
async function atHoldEnd(ids: readonly string[]): Promise<Record<string, string>> {
  const { rows } = await db.pool.query<{ id: string; state: string; at_end: boolean }>(
    `SELECT j.id::text AS id, j.state::text AS state, j.run_at = h.held_until AS at_end
     FROM idemq.jobs j LEFT JOIN idemq.key_holds h ON h.concurrency_key = j.concurrency_key
     WHERE j.id = ANY ($1::bigint[])`,
    [ids],
  );
  return Object.fromEntries(rows.map((r) => [r.id, `${r.state}${r.at_end ? " at hold end" : ""}`]));
}

/** The hold's end moved into the past, and the jobs it moved made due (the clock hand). */
async function endKeyHold(key: string): Promise<void> {
  const { rowCount } = await db.pool.query(
    "UPDATE idemq.key_holds SET held_until = now() - interval '1 millisecond' WHERE concurrency_key = $1",
    [key],
  );
  expect(rowCount).toBe(1);
  await db.pool.query(
    "UPDATE idemq.jobs SET run_at = now() WHERE concurrency_key = $1 AND state IN ('enqueued', 'scheduled')",
    [key],
  );
}

const keyed = (queue: string, key: string, extra: Record<string, unknown> = {}): Promise<string> =>
  makeJob(db.pool, { queue, concurrency_key: key, ...extra });

const claimedIds = (rows: ClaimedJob[]): string[] => rows.map((r) => r.job_id).sort();

describe("hold(scope 'key')", () => {
  it("holds the key's runnable jobs back from every session until its end; other keys run on; K (2) holds after it", async () => {
    const queue = unique("hk");
    const key = unique("k");
    const other = unique("k");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 2)", [queue]);
    const first = await keyed(queue, key, { priority: 10 });
    const second = await keyed(queue, key);
    const third = await keyed(queue, key); // waits: 2 admitted
    const free = await keyed(queue, other);
    expect(await states(db.pool, [first, second, third, free])).toEqual({
      [first]: "enqueued", [second]: "enqueued", [third]: "awaiting", [free]: "enqueued",
    });
    const job = await claimOne(db.pool, { queues: [queue], ...claimToken });
    expect(job.job_id).toBe(first);

    const until = await dbNowPlus("1 hour");
    const held = await holdKey(db.pool, job, until);
    expect(held.toISOString()).toBe(new Date(until).toISOString());
    expect(await keyHeldUntil(key)).toBeDefined();
    const { rows: listed } = await db.pool.query<{ held_until: Date }>("SELECT held_until FROM idemq.held_keys() WHERE concurrency_key = $1", [key]);
    expect(listed).toEqual([{ held_until: held }]);
    // The held job and the key's other admitted job wait for the hold's end; the waiting one still waits.
    expect(await atHoldEnd([first, second, third])).toEqual({
      [first]: "scheduled at hold end", [second]: "scheduled at hold end", [third]: "awaiting",
    });
    expect(await jobRow(db.pool, first)).toMatchObject({ attempt: 1, uncounted: 1, errors: [] });
    // Not a queue hold: the queue's other key runs, from either session.
    const [a, b] = [await db.pool.connect(), await db.pool.connect()];
    try {
      expect(claimedIds(await claim(a, { queues: [queue], batch_size: 10, ...claimToken }))).toEqual([free]);
      expect(await claim(b, { queues: [queue], batch_size: 10, ...claimToken })).toEqual([]);
    } finally {
      a.release();
      b.release();
    }
    const { rows: limits } = await db.pool.query("SELECT 1 FROM idemq.limits WHERE kind = 'queue' AND name = $1 AND held_until IS NOT NULL", [queue]);
    expect(limits).toEqual([]);

    await endKeyHold(key);
    // Two of the key at once, as before the hold: the third still waits.
    expect(claimedIds(await claim(db.pool, { queues: [queue], batch_size: 10, ...claimToken }))).toEqual([first, second].sort());
    expect((await jobRow(db.pool, third)).state).toBe("awaiting");
  });

  it("a job promoted while the key is held (another of the key finished) runs at the hold's end", async () => {
    const queue = unique("hp");
    const key = unique("k");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 2)", [queue]);
    const [x, y, waiting] = [await keyed(queue, key), await keyed(queue, key), await keyed(queue, key)];
    const [jx, jy] = await claim(db.pool, { queues: [queue], batch_size: 2, ...claimToken });
    expect(claimedIds([jx!, jy!])).toEqual([x, y].sort());
    await holdKey(db.pool, jx!, await dbNowPlus("1 hour"));
    await complete(db.pool, jy!.job_id, jy!); // frees a place: the waiting job is admitted
    expect(await atHoldEnd([waiting])).toEqual({ [waiting]: "scheduled at hold end" });
    expect(await claim(db.pool, { queues: [queue], batch_size: 10, ...claimToken })).toEqual([]);
  });

  it("a new job admitted at once while the key is held (enqueue, enqueue_many) runs at the hold's end; another key's does not", async () => {
    const queue = unique("hn");
    const key = unique("k");
    const other = unique("k");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 3)", [queue]);
    await keyed(queue, key);
    const job = await claimOne(db.pool, { queues: [queue], ...claimToken });
    await holdKey(db.pool, job, await dbNowPlus("1 hour"));
    const single = await keyed(queue, key, { run_at: new Date(0).toISOString() });
    const [many, elsewhere] = (await enqueueMany(db.pool, [
      { task: "test_task", queue, concurrency_key: key },
      { task: "test_task", queue, concurrency_key: other },
    ])).map((r) => r.job_id!);
    expect(await atHoldEnd([single, many!, elsewhere!])).toEqual({
      [single]: "scheduled at hold end", [many!]: "scheduled at hold end", [elsewhere!]: "enqueued",
    });
    expect(claimedIds(await claim(db.pool, { queues: [queue], batch_size: 10, ...claimToken }))).toEqual([elsewhere]);
  });

  it("a job of the key that was processing runs on; its retry, snooze or rescue waits for the hold's end", async () => {
    const queue = unique("hr");
    const key = unique("k");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 4)", [queue]);
    const ids = [await keyed(queue, key), await keyed(queue, key), await keyed(queue, key), await keyed(queue, key)];
    const jobs = await claim(db.pool, { queues: [queue], batch_size: 4, ...claimToken });
    expect(jobs).toHaveLength(4);
    const [held, retried, snoozed, crashed] = jobs as [ClaimedJob, ClaimedJob, ClaimedJob, ClaimedJob];
    await holdKey(db.pool, held, await dbNowPlus("1 hour"));
    expect((await jobRow(db.pool, retried.job_id)).state).toBe("processing"); // runs on
    await fail(db.pool, retried.job_id, retried, { class: "Boom", message: "boom" }, { retry_at: new Date(0).toISOString() });
    await snooze(db.pool, snoozed.job_id, snoozed, new Date(0).toISOString());
    await expireLease(db.pool, crashed.job_id);
    expect(await rescue(db.pool)).toBeGreaterThanOrEqual(1);
    expect(await atHoldEnd(ids)).toEqual(Object.fromEntries(ids.map((id) => [id, "scheduled at hold end"])));
    expect(await claim(db.pool, { queues: [queue], batch_size: 10, ...claimToken })).toEqual([]);
  });

  it("keeps the later of two holds; until not in the future snoozes only; a passed hold is deleted by the next hold", async () => {
    const queue = unique("ht");
    const nextQueue = unique("ht-next");
    const key = unique("k");
    const next = unique("k");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 3)", [queue]);
    for (let i = 0; i < 3; i++) await keyed(queue, key);
    await keyed(nextQueue, next);
    const [one, two, three] = await claim(db.pool, { queues: [queue], batch_size: 3, ...claimToken });
    const later = await dbNowPlus("20 minutes");
    await holdKey(db.pool, one!, later);
    const kept = await holdKey(db.pool, two!, await dbNowPlus("5 minutes"));
    expect(kept.toISOString()).toBe(new Date(later).toISOString());
    expect(await atHoldEnd([two!.job_id])).toEqual({ [two!.job_id]: "scheduled at hold end" });
    await db.pool.query("UPDATE idemq.key_holds SET held_until = now() - interval '1 millisecond' WHERE concurrency_key = $1", [key]);
    const past = await dbNowPlus("-1 second");
    expect((await holdKey(db.pool, three!, past)).toISOString()).toBe(new Date(past).toISOString());
    expect((await jobRow(db.pool, three!.job_id)).state).toBe("scheduled"); // as snooze() to a past time
    const { rows: passed } = await db.pool.query("SELECT 1 FROM idemq.key_holds WHERE concurrency_key = $1", [key]);
    expect(passed).toHaveLength(1); // a snooze only deletes nothing
    const nextJob = await claimOne(db.pool, { queues: [nextQueue], ...claimToken });
    await holdKey(db.pool, nextJob, await dbNowPlus("1 minute"));
    const { rows: gone } = await db.pool.query("SELECT 1 FROM idemq.key_holds WHERE concurrency_key = $1", [key]);
    expect(gone).toEqual([]);
    // held_keys() lists the holds still to come only.
    const { rows: listed } = await db.pool.query<{ concurrency_key: string }>("SELECT concurrency_key FROM idemq.held_keys()");
    expect(listed.map((r) => r.concurrency_key)).toContain(next);
    expect(listed.map((r) => r.concurrency_key)).not.toContain(key);
    expect(await keyHeldUntil(next)).toBeDefined();
  });

  it("is fenced: a stale attempt or a wrong token gets IQ410 and holds nothing", async () => {
    const queue = unique("hf");
    const key = unique("k");
    const id = await keyed(queue, key);
    const stale = await claimOne(db.pool, { queues: [queue], ...claimToken });
    await expireLease(db.pool, id);
    expect(await rescue(db.pool)).toBeGreaterThanOrEqual(1);
    await db.pool.query("UPDATE idemq.jobs SET run_at = now() WHERE id = $1", [id]);
    const current = await claimOne(db.pool, { queues: [queue], ...claimToken });
    const until = await dbNowPlus("1 hour");
    await expectSqlError(holdKey(db.pool, stale, until), { code: "IQ410" });
    await expectSqlError(holdKey(db.pool, current, until, "00000000-0000-4000-8000-000000000000"), { code: "IQ410" });
    expect(await keyHeldUntil(key)).toBeUndefined();
    expect(await jobRow(db.pool, id)).toMatchObject({ state: "processing", attempt: current.attempt });
  });

  it("a job without a concurrency_key: 22023 naming the job, with a HINT; nothing written", async () => {
    const queue = unique("hb");
    const id = await makeJob(db.pool, { queue });
    const job = await claimOne(db.pool, { queues: [queue], ...claimToken });
    const error = await expectSqlError(holdKey(db.pool, job, await dbNowPlus("1 minute")), {
      code: "22023",
      message: new RegExp(`job ${id} has no concurrency_key`),
      hint: /concurrency_key/,
    });
    expect(error.hint).toMatch(/'queue' or 'task'/);
    expect(await jobRow(db.pool, id)).toMatchObject({ state: "processing", uncounted: 0 });
    const { rows } = await db.pool.query("SELECT 1 FROM idemq.limits WHERE name = $1", [queue]);
    expect(rows).toEqual([]);
  });
});

describe("hold(scope 'key') under interleavings", () => {
  /** K = 2: x and y processing, a third waiting for the key. */
  async function twoRunningOneWaiting(tag: string): Promise<{ queue: string; key: string; x: ClaimedJob; y: ClaimedJob; waiting: string }> {
    const queue = unique(tag);
    const key = unique("k");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 2)", [queue]);
    await keyed(queue, key, { priority: 1 });
    await keyed(queue, key, { priority: 1 });
    const waiting = await keyed(queue, key);
    const [x, y] = await claim(db.pool, { queues: [queue], batch_size: 2, ...claimToken });
    return { queue, key, x: x!, y: y!, waiting };
  }

  it("a promotion in flight (a completion holding the key's lock): the hold waits for it, then moves the promoted job", async () => {
    const { key, x, y, waiting } = await twoRunningOneWaiting("ip1");
    const until = await dbNowPlus("1 hour");
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => complete(c, y.job_id, y),
      second: b,
      blocks: (c) => holdKey(c, x, until),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    await run.second;
    expect(await keyHeldUntil(key)).toBeDefined();
    expect(await atHoldEnd([x.job_id, waiting])).toEqual({ [x.job_id]: "scheduled at hold end", [waiting]: "scheduled at hold end" });
  });

  it("a hold in flight: a completion's promotion waits for the key's lock, then sees the hold", async () => {
    const { x, y, waiting } = await twoRunningOneWaiting("ip2");
    const until = await dbNowPlus("1 hour");
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => holdKey(c, x, until),
      second: b,
      blocks: (c) => complete(c, y.job_id, y),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    await run.second;
    expect(await atHoldEnd([waiting])).toEqual({ [waiting]: "scheduled at hold end" });
  });

  it("a retry in flight: the hold waits for it (the key's lock), then moves the retried job", async () => {
    const { x, y } = await twoRunningOneWaiting("ir1");
    const until = await dbNowPlus("1 hour");
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => fail(c, y.job_id, y, { class: "Boom", message: "boom" }, { retry_at: new Date(0).toISOString() }),
      second: b,
      blocks: (c) => holdKey(c, x, until),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    await run.second;
    expect(await atHoldEnd([y.job_id])).toEqual({ [y.job_id]: "scheduled at hold end" });
  });

  it("a hold in flight: a retry of a job that was processing then waits for the key's lock, then sees the hold", async () => {
    const { x, y } = await twoRunningOneWaiting("ir2");
    const until = await dbNowPlus("1 hour");
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => holdKey(c, x, until),
      second: b,
      blocks: (c) => fail(c, y.job_id, y, { class: "Boom", message: "boom" }, { retry_at: new Date(0).toISOString() }),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    await run.second;
    expect(await atHoldEnd([y.job_id])).toEqual({ [y.job_id]: "scheduled at hold end" });
  });

  it("two holds of one key at once (K = 2, two 429s): the second waits, then keeps the later end; no deadlock", async () => {
    const { key, x, y } = await twoRunningOneWaiting("ih");
    const early = await dbNowPlus("10 minutes");
    const late = await dbNowPlus("30 minutes");
    const [a, b] = [await db.newClient(), await db.newClient()];
    const run = await interleave(db.pool, {
      first: a,
      holds: (c) => holdKey(c, x, late),
      second: b,
      blocks: (c) => holdKey(c, y, early),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    expect((await run.second).toISOString()).toBe(new Date(late).toISOString());
    expect((await keyHeldUntil(key))?.toISOString()).toBe(new Date(late).toISOString());
    expect(await atHoldEnd([x.job_id, y.job_id])).toEqual({ [x.job_id]: "scheduled at hold end", [y.job_id]: "scheduled at hold end" });
  });
});
