// The bulk actions (retry_jobs, cancel_jobs, delete_jobs, run_jobs_now) on
// the job zoo: exactly the jobs in the action's states change, each as its
// single-job function changes it; batches walk down to the end; jobs that
// moved on, or that another session holds, are skipped and counted; a
// worker's claim and a bulk action never wait for each other, and a bulk
// cancel racing three workers ends each job once, its slot freed.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { runBulkAction } from "../../src/bulk-actions.ts";
import { expectSqlError, inRollback, interleave, sqlState, useTestDatabase } from "../helpers/db.ts";
import { expectCountsExact } from "../helpers/job-counts.ts";
import { enqueue, makeJobs, stateOf, states, unique, type Queryable } from "../helpers/jobs.ts";
import { claim, claimJobRow, jobIn } from "../helpers/work.ts";
import { buildZoo, expectOnlyChanged, snapshot, type Zoo, type ZooName } from "../helpers/zoo.ts";

const db = useTestDatabase({ poolSize: 4 });

type Action = "retry_jobs" | "cancel_jobs" | "delete_jobs" | "run_jobs_now";

interface Batch {
  touched: number;
  skipped: number;
  more: boolean;
  next_before_id: string | null;
}

async function bulk(c: Queryable, action: Action, filter: unknown, beforeId?: string | null, maxJobs?: number): Promise<Batch> {
  const { rows } = await c.query<Batch>(
    `SELECT * FROM idemq.${action}(filter => $1::jsonb, before_id => $2::bigint, max_jobs => coalesce($3::int, 1000))`,
    [JSON.stringify(filter), beforeId ?? null, maxJobs ?? null],
  );
  expect(rows).toHaveLength(1);
  return rows[0]!;
}

function withZoo(work: (c: pg.PoolClient, zoo: Zoo) => Promise<void>): Promise<void> {
  return inRollback(db.pool, async (c) => work(c, await buildZoo(c)));
}

const ZOO = { task: "zoo_task" };

describe("on the job zoo: only the jobs in the action's states change", () => {
  it("retry_jobs: failed, expired, cancelled -> enqueued, each as retry() leaves it (its key taken again)", async () => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      expect(await bulk(c, "retry_jobs", ZOO)).toEqual({ touched: 3, skipped: 0, more: false, next_before_id: null });
      const after = await snapshot(c, zoo);
      const retried: ZooName[] = ["failed", "expired", "cancelled"];
      expectOnlyChanged(before, after, { jobs: retried, keys: retried });
      for (const name of retried) {
        expect(after.jobs[name]).toMatchObject({ state: "enqueued", finished_at: null, uncounted: before.jobs[name]!.attempt });
        expect((after.jobs[name]!.errors as { class: string }[]).at(-1)).toMatchObject({ class: "Retried", previous_state: name });
        expect(after.keys[name]).toMatchObject({ job_id: Number(zoo[name].id), finished_state: null });
      }
    });
  });

  it("cancel_jobs: every active job -> cancelled as cancel() does (running attempts fenced out and recorded, keys finished)", async () => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      const active: ZooName[] = ["scheduled", "enqueued", "processing", "awaiting", "leaseExpired", "lastAttempt", "parent"];
      expect(await bulk(c, "cancel_jobs", ZOO)).toEqual({ touched: active.length, skipped: 0, more: false, next_before_id: null });
      const after = await snapshot(c, zoo);
      expectOnlyChanged(before, after, { jobs: active, keys: active, dependenciesRemoved: [`${zoo.parent.id}->${zoo.awaiting.id}`] });
      for (const name of active) expect(after.jobs[name]).toMatchObject({ state: "cancelled", locked_by: null, lease_expires_at: null });
      expect((after.jobs.processing!.errors as { class: string }[]).at(-1)).toMatchObject({ class: "Cancelled" });
      expect(after.keys.enqueued).toMatchObject({ finished_state: "cancelled" });
    });
  });

  it("delete_jobs: the finished jobs go, their keys stay (as after purge)", async () => {
    await withZoo(async (c, zoo) => {
      const finished: ZooName[] = ["succeeded", "failed", "expired", "cancelled"];
      expect(await bulk(c, "delete_jobs", ZOO)).toEqual({ touched: 4, skipped: 0, more: false, next_before_id: null });
      const left = await states(c, Object.values(zoo).map((j) => j.id));
      for (const name of finished) expect(left[zoo[name].id], name).toBeUndefined();
      expect(Object.keys(left)).toHaveLength(7);
      const { rows } = await c.query("SELECT count(*)::int AS n FROM idemq.keys WHERE key = ANY ($1)", [finished.map((n) => zoo[n].key)]);
      expect(rows[0].n).toBe(4);
    });
  });

  it("run_jobs_now: the scheduled jobs -> enqueued now (the awaiting child still waits for its parent)", async () => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      expect(await bulk(c, "run_jobs_now", ZOO)).toEqual({ touched: 2, skipped: 0, more: false, next_before_id: null });
      const after = await snapshot(c, zoo);
      expectOnlyChanged(before, after, { jobs: ["scheduled", "parent"] });
      const { rows } = await c.query<{ state: string; now: boolean }>(
        "SELECT state::text, run_at = now() AS now FROM idemq.jobs WHERE id = ANY ($1) ORDER BY id",
        [[zoo.scheduled.id, zoo.parent.id]],
      );
      expect(rows).toEqual([{ state: "enqueued", now: true }, { state: "enqueued", now: true }]);
    });
  });

  it("count_jobs(action) beforehand equals what the action touches", async () => {
    for (const [action, name] of [["retry", "retry_jobs"], ["cancel", "cancel_jobs"], ["delete", "delete_jobs"], ["run_now", "run_jobs_now"]] as const) {
      await withZoo(async (c) => {
        const { rows } = await c.query("SELECT jobs FROM idemq.count_jobs(filter => $1::jsonb, action => $2)", [JSON.stringify(ZOO), action]);
        expect((await bulk(c, name, ZOO)).touched, action).toBe(rows[0].jobs);
      });
    }
  });
});

describe("batches", () => {
  it("max_jobs at a time, newest first, until more is false; every match touched once", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("batches");
      const ids = await makeJobs(c, 25, { queue });
      const batches: Batch[] = [];
      let before: string | null = null;
      do {
        const batch = await bulk(c, "cancel_jobs", { queue }, before, 10);
        batches.push(batch);
        before = batch.next_before_id;
      } while (batches.at(-1)!.more);
      const newest = [...ids].reverse();
      expect(batches).toEqual([
        { touched: 10, skipped: 0, more: true, next_before_id: newest[9] },
        { touched: 10, skipped: 0, more: true, next_before_id: newest[19] },
        { touched: 5, skipped: 0, more: false, next_before_id: null },
      ]);
      expect(new Set(Object.values(await states(c, ids)))).toEqual(new Set(["cancelled"]));
    });
  });

  it("a full last batch says more: false when nothing is below it", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("exact");
      await makeJobs(c, 4, { queue });
      expect(await bulk(c, "cancel_jobs", { queue }, null, 4)).toEqual({ touched: 4, skipped: 0, more: false, next_before_id: null });
    });
  });

  it("max_jobs outside 1..10000 or NULL, a bad filter: refused, nothing changed", async () => {
    {
      const queue = unique("refused");
      for (const maxJobs of [0, 10001]) {
        await expectSqlError(db.pool.query("SELECT * FROM idemq.cancel_jobs(filter => $1::jsonb, max_jobs => $2)", [JSON.stringify({ queue }), maxJobs]), {
          code: "22023",
          message: new RegExp(`cancel_jobs: max_jobs must be between 1 and 10000, not ${maxJobs}`),
          hint: /next_before_id/,
        });
      }
    }
    await expectSqlError(db.pool.query("SELECT * FROM idemq.retry_jobs(filter => '{}', max_jobs => NULL)"), { code: "22004" });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.delete_jobs(filter => NULL)"), { code: "22004" });
    await expectSqlError(db.pool.query(`SELECT * FROM idemq.run_jobs_now(filter => '{"queue": "q", "state": "scheduled"}')`), {
      code: "22023",
      message: /run_jobs_now: filter field "state"/,
    });
    const queue = unique("unchanged");
    const id = await jobIn(db.pool, "enqueued", { queue });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.cancel_jobs(filter => $1::jsonb)", [JSON.stringify({ queue, nope: 1 })]), { code: "22023" });
    expect(await stateOf(db.pool, id)).toBe("enqueued");
  });
});

describe("runBulkAction (the client's loop over batches)", () => {
  it("reports each batch's totals, stop() ends it after the batch in flight, and beforeId goes on from there", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("loop");
      const ids = await makeJobs(c, 5, { queue });
      const seen: unknown[] = [];
      const stopped = await runBulkAction(c, "cancel", { queue }, { maxJobs: 2, onBatch: (p) => seen.push(p), stop: () => seen.length === 2 });
      expect(stopped).toEqual({ touched: 4, skipped: 0, batches: 2, interrupted: true, nextBeforeId: ids[1] });
      expect(seen).toEqual([{ touched: 2, skipped: 0, batches: 1 }, { touched: 4, skipped: 0, batches: 2 }]);
      expect(Object.values(await states(c, ids)).filter((s) => s === "cancelled")).toHaveLength(4);
      // beforeId goes on below a job: below the oldest, nothing is left; from where it stopped, the rest.
      expect(await runBulkAction(c, "cancel", { queue }, { maxJobs: 2, beforeId: ids[0] })).toEqual({ touched: 0, skipped: 0, batches: 1, interrupted: false, nextBeforeId: null });
      expect(await runBulkAction(c, "cancel", { queue }, { maxJobs: 2, beforeId: stopped.nextBeforeId! })).toEqual({
        touched: 1,
        skipped: 0,
        batches: 1,
        interrupted: false,
        nextBeforeId: null,
      });
      expect(Object.values(await states(c, ids)).filter((s) => s === "cancelled")).toHaveLength(5);
    });
  });
});

describe("jobs that moved on", () => {
  it("retry_jobs: a job whose key another active job holds is skipped and left failed (retry()'s IQ409)", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("keyed");
      const older = await jobIn(c, "failed", { queue, idempotency_key: `${queue}:k` });
      const newer = await jobIn(c, "failed", { queue, idempotency_key: `${queue}:k` });
      // Newest first: the newer takes the key, the older then finds it held.
      expect(await bulk(c, "retry_jobs", { queue })).toEqual({ touched: 1, skipped: 1, more: false, next_before_id: null });
      expect(await states(c, [older, newer])).toEqual({ [older]: "failed", [newer]: "enqueued" });
      const { rows } = await c.query("SELECT jsonb_array_length(errors) AS n FROM idemq.jobs WHERE id = $1", [older]);
      expect(rows[0].n).toBe(1);
    });
  });

  it("cancel_jobs: an awaiting child cancelled with its parent earlier in the batch counts as touched, cancelled once", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("family");
      const { job_id: parent } = await enqueue(c, { queue, run_at: new Date(Date.now() + 86_400_000) });
      const { job_id: child } = await enqueue(c, { queue, after: [parent] });
      // Newest first: the child comes first; cancel both.
      expect(await bulk(c, "cancel_jobs", { queue })).toEqual({ touched: 2, skipped: 0, more: false, next_before_id: null });
      expect(await states(c, [parent, child])).toEqual({ [parent]: "cancelled", [child]: "cancelled" });
    });
  });

  it("a job another session holds (a worker completing it) is skipped, not waited for; the result says so", async () => {
    const queue = unique("held");
    const [a, b] = await makeJobs(db.pool, 2, { queue });
    const claimed = await claimJobRow(db.pool, a!);
    const worker = await db.pool.connect();
    const operator = await db.pool.connect();
    try {
      await worker.query("BEGIN");
      await worker.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", [a, claimed.attempt, claimed.lease_token]);
      // The worker's transaction holds job a; the operator's batch does not wait for it.
      expect(await bulk(operator, "cancel_jobs", { queue })).toEqual({ touched: 1, skipped: 1, more: false, next_before_id: null });
      await worker.query("COMMIT");
      expect(await states(db.pool, [a!, b!])).toEqual({ [a!]: "succeeded", [b!]: "cancelled" });
    } finally {
      await worker.query("ROLLBACK").catch(() => {});
      worker.release();
      operator.release();
    }
  });

  it("a job that left the action's states between count and action is not touched", async () => {
    const queue = unique("moved");
    const id = await jobIn(db.pool, "failed", { queue });
    expect((await db.pool.query("SELECT * FROM idemq.count_jobs(filter => $1::jsonb, action => 'retry')", [JSON.stringify({ queue })])).rows).toEqual([
      { jobs: 1, exact: true },
    ]);
    await db.pool.query("SELECT idemq.retry(job_id => $1)", [id]);
    expect(await bulk(db.pool, "retry_jobs", { queue })).toEqual({ touched: 0, skipped: 0, more: false, next_before_id: null });
    const { rows } = await db.pool.query("SELECT jsonb_array_length(errors) AS n FROM idemq.jobs WHERE id = $1", [id]);
    expect(rows[0].n).toBe(2); // the failure and the one retry
  });
});

describe("with workers", () => {
  it("a claim does not wait for a bulk action's locked batch, and does not get its jobs", async () => {
    const queue = unique("claiming");
    const ids = await makeJobs(db.pool, 3, { queue });
    const operator = await db.pool.connect();
    try {
      await operator.query("BEGIN");
      expect(await bulk(operator, "cancel_jobs", { queue })).toMatchObject({ touched: 3 });
      // Uncommitted: the worker's claim skips the locked rows at once.
      expect(await claim(db.pool, { queues: [queue] })).toEqual([]);
      await operator.query("COMMIT");
      expect(await claim(db.pool, { queues: [queue] })).toEqual([]);
      expect(new Set(Object.values(await states(db.pool, ids)))).toEqual(new Set(["cancelled"]));
    } finally {
      await operator.query("ROLLBACK").catch(() => {});
      operator.release();
    }
  });

  it("retry_jobs waits for a concurrent retry() of the same concurrency key, then takes the job (keys locked before rows)", async () => {
    const queue = unique("ck");
    const id = await jobIn(db.pool, "failed", { queue, concurrency_key: `${queue}:c` });
    const other = await jobIn(db.pool, "failed", { queue: unique("ck-other"), concurrency_key: `${queue}:c` });
    const first = await db.pool.connect();
    const second = await db.pool.connect();
    try {
      const run = await interleave(db.pool, {
        first,
        holds: (c) => c.query("SELECT idemq.retry(job_id => $1)", [other]),
        second,
        blocks: (c) => bulk(c, "retry_jobs", { queue }),
        end: "COMMIT",
      });
      expect(run.blockers).toEqual([run.firstPid]);
      expect(await run.second).toEqual({ touched: 1, skipped: 0, more: false, next_before_id: null });
      expect(await stateOf(db.pool, id)).toMatch(/^(enqueued|awaiting)$/);
    } finally {
      first.release();
      second.release();
    }
  });

  it("cancel_jobs frees the flow-control slot of a running job, as cancel() does: the next job is claimed", async () => {
    const queue = unique("slots");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 1)", [queue]);
    const [first, second] = await makeJobs(db.pool, 2, { queue });
    expect((await claim(db.pool, { queues: [queue] })).map((r) => r.job_id)).toEqual([first]);
    expect(await claim(db.pool, { queues: [queue] })).toEqual([]);
    expect(await bulk(db.pool, "cancel_jobs", { ids: [first] })).toMatchObject({ touched: 1 });
    expect((await claim(db.pool, { queues: [queue] })).map((r) => r.job_id)).toEqual([second]);
    await db.pool.query("SELECT idemq.clear_limit(queue => $1)", [queue]);
  });

  it("stress: cancel_jobs in batches of 20 while 3 workers claim and complete 300 jobs of a limited queue: each job ends once, the counts and slots add up", async () => {
    const queue = unique("stress");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 4)", [queue]);
    const ids = await makeJobs(db.pool, 300, { queue });
    let operatorDone = false;
    let completed = 0;
    let fencedOut = 0;
    const worker = async (name: string): Promise<void> => {
      for (;;) {
        const claimed = await claim(db.pool, { worker_id: name, queues: [queue], batch_size: 2, token: true });
        if (claimed.length === 0) {
          if (operatorDone) return;
          continue; // the queue's 4 slots may all be held by the other workers: claim again

        }
        for (const job of claimed) {
          const done = db.pool.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", [job.job_id, job.attempt, job.lease_token]);
          try {
            await done;
            completed++;
          } catch {
            expect(await sqlState(done)).toBe("IQ410"); // cancelled while it ran: fenced out
            fencedOut++;
          }
        }
      }
    };
    const operator = async (): Promise<{ touched: number; skipped: number }> => {
      let before: string | null = null;
      let touched = 0;
      let skipped = 0;
      for (;;) {
        const batch: Batch = await bulk(db.pool, "cancel_jobs", { queue }, before, 20);
        touched += batch.touched;
        skipped += batch.skipped;
        if (!batch.more) return { touched, skipped };
        before = batch.next_before_id;
      }
    };
    const workers = ["w1", "w2", "w3"].map(worker);
    const result = await operator();
    operatorDone = true;
    await Promise.all(workers);
    const final = await states(db.pool, ids);
    const cancelled = Object.values(final).filter((s) => s === "cancelled").length;
    const succeeded = Object.values(final).filter((s) => s === "succeeded").length;
    expect(cancelled + succeeded, JSON.stringify(final)).toBe(300);
    expect(result.touched).toBe(cancelled);
    expect(succeeded).toBe(completed);
    expect(fencedOut).toBeLessThanOrEqual(cancelled);
    const { rows } = await db.pool.query(
      "SELECT running AS held FROM idemq.limits() WHERE queue = $1",
      [queue],
    );
    expect(rows[0].held).toBe(0);
    await expectCountsExact(db.pool, "after the bulk cancel");
    await db.pool.query("SELECT idemq.clear_limit(queue => $1)", [queue]);
  });
});
