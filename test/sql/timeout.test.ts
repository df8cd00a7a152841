// A time limit per job (issue 26, item 6), as a SQL consumer sees it:
// enqueue(..., timeout) and enqueue_many's "timeout" store it, claim()
// returns it and never leases past it, heartbeat() never extends a lease past
// locked_at + timeout and stops answering for the job once it has passed, so
// rescue() takes the job back. The clock hand a test moves is locked_at.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase } from "../helpers/db.ts";
import { count, enqueueMany, unique } from "../helpers/jobs.ts";
import { claimOne, expireLease, heartbeat, rescue } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 3 });

async function enqueueWithTimeout(queue: string, timeout: string | null, key: string | null = null): Promise<string> {
  const { rows } = await db.pool.query<{ job_id: string }>(
    "SELECT job_id FROM idemq.enqueue(task => 'test_task', queue => $1, idempotency_key => $2, timeout => $3::interval)",
    [queue, key, timeout],
  );
  return rows[0]!.job_id;
}

async function timing(id: string): Promise<{ timeout: string | null; lease_after_lock: string | null; state: string }> {
  const { rows } = await db.pool.query(
    "SELECT timeout::text AS timeout, (lease_expires_at - locked_at)::text AS lease_after_lock, state::text AS state FROM idemq.jobs WHERE id = $1",
    [id],
  );
  return rows[0];
}

describe("timeout: stored by enqueue and enqueue_many", () => {
  it("enqueue stores it on a new job; a duplicate keeps the existing job's", async () => {
    const queue = unique("t");
    const key = unique("key");
    const id = await enqueueWithTimeout(queue, "45 seconds", key);
    expect((await timing(id)).timeout).toBe("00:00:45");
    expect(await enqueueWithTimeout(queue, "10 seconds", key)).toBe(id);
    expect((await timing(id)).timeout).toBe("00:00:45");
    // With parents (the pipeline's path) too.
    const { rows } = await db.pool.query<{ job_id: string }>(
      "SELECT job_id FROM idemq.enqueue(task => 'test_task', queue => $1, after => ARRAY[$2::bigint], timeout => '2 minutes')",
      [queue, id],
    );
    expect((await timing(rows[0]!.job_id)).timeout).toBe("00:02:00");
    expect((await timing(await enqueueWithTimeout(queue, null))).timeout).toBeNull();
  });

  it("enqueue_many stores each element's", async () => {
    const queue = unique("many");
    const rows = await enqueueMany(db.pool, [
      { task: "test_task", queue, timeout: "30 seconds" },
      { task: "test_task", queue },
      { task: "test_task", queue, timeout: "00:05:00", idempotency_key: unique("k") },
    ]);
    expect(await Promise.all(rows.map(async (r) => (await timing(r.job_id!)).timeout))).toEqual(["00:00:30", null, "00:05:00"]);
  });

  const bad: [string, string][] = [
    ["zero", "0 seconds"],
    ["negative", "-5 seconds"],
    ["over duration_days", "36501 days"],
  ];
  it.each(bad)("enqueue refuses a timeout %s: 22023 with a HINT, nothing written", async (_name, value) => {
    const queue = unique("bad");
    const error = await expectSqlError(enqueueWithTimeout(queue, value), { code: "22023", message: /timeout/ });
    expect(error.hint ?? "").not.toBe("");
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE queue = $1", [queue])).toBe(0);
  });

  const badElements: [string, unknown][] = [
    ["zero", "0 seconds"],
    ["not an interval", "soon"],
    ["a number", 30],
    ["over duration_days", "36501 days"],
  ];
  it.each(badElements)("enqueue_many refuses an element's timeout %s: 22023 naming jobs[2], nothing written", async (_name, value) => {
    const queue = unique("badmany");
    const error = await expectSqlError(
      enqueueMany(db.pool, [
        { task: "test_task", queue },
        { task: "test_task", queue, timeout: value },
      ]),
      { code: "22023", message: /^jobs\[2\] .*timeout/ },
    );
    expect(error.hint ?? "").not.toBe("");
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE queue = $1", [queue])).toBe(0);
  });
});

describe("timeout: a lease that cannot be extended past the limit", () => {
  it("claim returns the timeout and leases no further than it", async () => {
    const queue = unique("claim");
    const id = await enqueueWithTimeout(queue, "5 seconds");
    const job = await claimOne(db.pool, { queues: [queue], lease: "30 seconds", token: true });
    expect(job.job_id).toBe(id);
    expect((job as unknown as { timeout: { toPostgres(): string } }).timeout.toPostgres()).toBe("5 seconds");
    expect((await timing(id)).lease_after_lock).toBe("00:00:05");
    const other = await enqueueWithTimeout(queue, "10 minutes");
    await claimOne(db.pool, { queues: [queue], lease: "30 seconds", token: true });
    expect((await timing(other)).lease_after_lock).toBe("00:00:30");
  });

  it("heartbeat extends up to locked_at + timeout, then not at all and leaves the job out; rescue takes it back", async () => {
    const queue = unique("hb");
    const id = await enqueueWithTimeout(queue, "1 minute");
    const job = await claimOne(db.pool, { queues: [queue], lease: "20 seconds", token: true });
    expect(await heartbeat(db.pool, [{ id, attempt: job.attempt, lease_token: job.lease_token }], "10 minutes")).toEqual([id]);
    expect((await timing(id)).lease_after_lock).toBe("00:01:00");

    // The limit passes (the clock hand: the attempt started 61 seconds ago, its lease still running).
    await db.pool.query(
      "UPDATE idemq.jobs SET locked_at = now() - interval '61 seconds', lease_expires_at = now() + interval '5 seconds' WHERE id = $1",
      [id],
    );
    expect(await heartbeat(db.pool, [{ id, attempt: job.attempt, lease_token: job.lease_token }], "10 minutes")).toEqual([]);
    expect((await timing(id)).lease_after_lock).toBe("00:01:06");
    await expireLease(db.pool, id);
    expect(await rescue(db.pool)).toBeGreaterThanOrEqual(1);
    expect((await timing(id)).state).not.toBe("processing");
  });

  it("a job without a timeout is extended as before", async () => {
    const queue = unique("none");
    const id = await enqueueWithTimeout(queue, null);
    const job = await claimOne(db.pool, { queues: [queue], token: true });
    await db.pool.query("UPDATE idemq.jobs SET locked_at = now() - interval '1 day' WHERE id = $1", [id]);
    expect(await heartbeat(db.pool, [{ id, attempt: job.attempt, lease_token: job.lease_token }], "10 minutes")).toEqual([id]);
  });
});
