// Why a job is not running (issue 26, item 8): job()'s waiting_for for a
// runnable job ('paused', 'held', 'concurrency', 'rate', or NULL: a worker),
// decided per queue and task by idemq._scope_waits() from limits(), and
// stats()'s waiting_for on each (queue, task)'s runnable rows. Each case uses
// its own queue and task (unique()), since these commit.
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob, makeJobs, unique } from "../helpers/jobs.ts";
import { claimOne, complete, makeDue } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });

async function waitingFor(id: string): Promise<string | null> {
  const { rows } = await db.pool.query<{ waiting_for: string | null }>("SELECT waiting_for FROM idemq.job($1)", [id]);
  expect(rows).toHaveLength(1);
  return rows[0]!.waiting_for;
}

/** stats()'s rows of one (queue, task) that carry a waiting_for column: metric -> waiting_for. */
async function statsWaiting(queue: string, task: string): Promise<Record<string, string | null>> {
  const { rows } = await db.pool.query<{ metric: string; waiting_for: string | null }>(
    "SELECT metric, waiting_for FROM idemq.stats() WHERE queue = $1 AND task = $2",
    [queue, task],
  );
  return Object.fromEntries(rows.map((r) => [r.metric, r.waiting_for]));
}

/** Two runnable jobs of a queue and task of their own. */
async function twoJobs(): Promise<{ queue: string; task: string; ids: string[] }> {
  const queue = unique("wq");
  const task = unique("wt");
  return { queue, task, ids: await makeJobs(db.pool, 2, { queue, task }) };
}

describe("job(): waiting_for of a runnable job", () => {
  it("NULL without flow control (it waits for a worker), enqueued or scheduled and due; NULL for a job scheduled for later", async () => {
    const { queue, task, ids } = await twoJobs();
    expect(await waitingFor(ids[0]!)).toBeNull();
    const later = await makeJob(db.pool, { queue, task, run_at: new Date(Date.now() + 3_600_000) });
    expect(await waitingFor(later)).toBeNull();
    await makeDue(db.pool, later);
    expect(await waitingFor(later)).toBeNull();
    expect(await statsWaiting(queue, task)).toMatchObject({ enqueued: null, oldest_runnable_seconds: null });
  });

  it("'paused' while its queue or its task is paused, runnable jobs only (scheduled and due included); NULL again after resume", async () => {
    const { queue, task, ids } = await twoJobs();
    const due = await makeJob(db.pool, { queue, task, run_at: new Date(Date.now() + 3_600_000) });
    const later = await makeJob(db.pool, { queue, task, run_at: new Date(Date.now() + 3_600_000) });
    await makeDue(db.pool, due);
    const running = await claimOne(db.pool, { queues: [queue] });
    await db.pool.query("SELECT idemq.pause(queue => $1)", [queue]);
    const waiting = ids.find((id) => id !== running.job_id)!;
    expect(await waitingFor(waiting)).toBe("paused");
    expect(await waitingFor(due)).toBe("paused");
    expect(await waitingFor(later), "not runnable: waits for its run_at").toBeNull();
    expect(await waitingFor(running.job_id), "processing").toBeNull();
    expect(await statsWaiting(queue, task)).toMatchObject({ enqueued: "paused", oldest_runnable_seconds: "paused", processing: null, scheduled: null });
    await db.pool.query("SELECT idemq.resume(queue => $1)", [queue]);
    expect(await waitingFor(waiting)).toBeNull();

    await db.pool.query("SELECT idemq.pause(task => $1)", [task]);
    expect(await waitingFor(waiting)).toBe("paused");
    await db.pool.query("SELECT idemq.resume(task => $1)", [task]);
    expect(await waitingFor(waiting)).toBeNull();
  });

  it("'held' while a hold of its queue or task is to come (hold()); the held job itself waits for its run_at; NULL once the hold has passed", async () => {
    const { queue, task, ids } = await twoJobs();
    const first = await claimOne(db.pool, { queues: [queue], token: true });
    await db.pool.query(
      "SELECT idemq.hold(job_id => $1, attempt => $2, scope => 'task', until => now() + interval '10 minutes', lease_token => $3)",
      [first.job_id, first.attempt, first.lease_token],
    );
    const other = ids.find((id) => id !== first.job_id)!;
    expect(await waitingFor(other)).toBe("held");
    expect(await waitingFor(first.job_id), "scheduled at the hold's end").toBeNull();
    expect(await statsWaiting(queue, task)).toMatchObject({ enqueued: "held", oldest_runnable_seconds: "held" });
    await db.pool.query("UPDATE idemq.limits SET held_until = now() - interval '1 millisecond' WHERE kind = 'task' AND name = $1", [task]);
    expect(await waitingFor(other)).toBeNull();
  });

  it("'concurrency' while every slot of its queue's or task's concurrency limit is held; NULL once one is freed", async () => {
    const { queue, task, ids } = await twoJobs();
    await db.pool.query("SELECT idemq.set_limit(task => $1, concurrency => 1)", [task]);
    const first = await claimOne(db.pool, { queues: [queue] });
    const other = ids.find((id) => id !== first.job_id)!;
    expect(await waitingFor(other)).toBe("concurrency");
    expect(await statsWaiting(queue, task)).toMatchObject({ enqueued: "concurrency", oldest_runnable_seconds: "concurrency" });
    await complete(db.pool, first.job_id, first.attempt);
    expect(await waitingFor(other)).toBeNull();
  });

  it("'rate' while its queue's or task's rate has no start left in the period, though nothing runs", async () => {
    const { queue, task, ids } = await twoJobs();
    await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 1, per => '1 hour')", [queue]);
    expect(await waitingFor(ids[0]!), "a start is left").toBeNull();
    const first = await claimOne(db.pool, { queues: [queue] });
    await complete(db.pool, first.job_id, first.attempt);
    const other = ids.find((id) => id !== first.job_id)!;
    expect(await waitingFor(other)).toBe("rate");
    expect(await statsWaiting(queue, task)).toMatchObject({ enqueued: "rate", oldest_runnable_seconds: "rate", succeeded: null });
    // A start left again (decided from limits()' started and rate, not from how starts are stored).
    await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 2, per => '1 hour')", [queue]);
    expect(await waitingFor(other)).toBeNull();
  });

  it("the first reason that holds of its queue's and its task's: paused, held, concurrency, rate", async () => {
    const { queue, task, ids } = await twoJobs();
    await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 1, per => '1 hour')", [queue]);
    await db.pool.query("SELECT idemq.set_limit(task => $1, concurrency => 1)", [task]);
    const first = await claimOne(db.pool, { queues: [queue] });
    const other = ids.find((id) => id !== first.job_id)!;
    expect(await waitingFor(other), "task's slots and queue's rate both used up").toBe("concurrency");
    await db.pool.query("SELECT idemq.pause(queue => $1)", [queue]);
    expect(await waitingFor(other)).toBe("paused");
    expect(await statsWaiting(queue, task)).toMatchObject({ enqueued: "paused" });
  });

  it("a job past its expires_at is not runnable: NULL though its queue is paused", async () => {
    const queue = unique("wq");
    const id = await makeJob(db.pool, { queue, expires_at: "2000-01-01T00:00:00Z" });
    await db.pool.query("SELECT idemq.pause(queue => $1)", [queue]);
    expect(await waitingFor(id)).toBeNull();
  });
});

describe("_scope_waits()", () => {
  it("one row per row of limits(), NULL for a scope that holds nothing back (a per_key alone, a limit with room)", async () => {
    const queue = unique("wq");
    const task = unique("wt");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 2)", [queue]);
    await db.pool.query("SELECT idemq.set_limit(task => $1, concurrency => 3, rate => 10, per => '1 minute')", [task]);
    const { rows } = await db.pool.query(
      "SELECT queue, task, waiting_for FROM idemq._scope_waits() WHERE queue = $1 OR task = $2 ORDER BY queue NULLS LAST",
      [queue, task],
    );
    expect(rows).toEqual([
      { queue, task: null, waiting_for: null },
      { queue: null, task, waiting_for: null },
    ]);
    const { rows: counts } = await db.pool.query<{ limits: number; waits: number }>(
      "SELECT (SELECT count(*)::int FROM idemq.limits()) AS limits, (SELECT count(*)::int FROM idemq._scope_waits()) AS waits",
    );
    expect(counts[0]!.waits).toBe(counts[0]!.limits);
  });
});
