// Retention 0 for succeeded jobs: complete() and complete_many() delete the
// row in the completing statement, the key ledger still records the success
// (so the duplicate policies act on the key), and everything else (fencing,
// children, other retentions, other states) is as with a retention kept.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { count, enqueue, jobRow, keyRow, unique, type Queryable } from "../helpers/jobs.ts";
import { claimJob, complete, failRow, HOLDER_TOKENS } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

async function setRetention(c: Queryable, args: { state: string; keep: string | null; queue?: string; task?: string }): Promise<void> {
  await c.query("SELECT idemq.set_retention(state => $1, keep => $2::interval, queue => $3, task => $4)", [
    args.state,
    args.keep,
    args.queue ?? null,
    args.task ?? null,
  ]);
}

async function exists(c: Queryable, id: string): Promise<boolean> {
  return (await count(c, "SELECT 1 FROM idemq.jobs WHERE id = $1", [id])) === 1;
}

async function completeMany(c: Queryable, ids: string[], attempts: number[]): Promise<string[]> {
  const { rows } = await c.query<{ id: string }>(
    `SELECT id::text FROM idemq.complete_many(job_ids => $1::bigint[], attempts => $2::int[], lease_tokens => ${HOLDER_TOKENS("$1")}) AS id ORDER BY 1`,
    [ids, attempts],
  );
  return rows.map((r) => r.id);
}

/** A claimed job (enqueued with `args`) and its attempt. */
async function running(c: Queryable, args: Parameters<typeof enqueue>[1] = {}): Promise<{ id: string; attempt: number }> {
  const { job_id } = await enqueue(c, { queue: unique("q"), ...args });
  return { id: job_id, attempt: await claimJob(c, job_id) };
}

describe("retention 0 (the default for succeeded)", () => {
  it("complete() deletes the job; its key records the success and reject_if_succeeded rejects a new job", async () => {
    await inRollback(db.pool, async (c) => {
      await setRetention(c, { state: "succeeded", keep: "0" });
      const key = unique("key");
      const job = await running(c, { idempotency_key: key, duplicate_policy: "reject_if_succeeded", task: "t" });
      await complete(c, job.id, job.attempt, { sent: true });
      expect(await exists(c, job.id)).toBe(false);
      expect(await keyRow(c, key)).toMatchObject({ job_id: job.id, finished_state: "succeeded" });
      expect((await keyRow(c, key))?.finished_at).toBeInstanceOf(Date);
      await underSavepoint(c, () =>
        expectSqlError(enqueue(c, { idempotency_key: key, duplicate_policy: "reject_if_succeeded", task: "t" }), {
          code: "IQ409",
          detail: { key, existing_job_id: Number(job.id), existing_state: "succeeded", policy: "reject_if_succeeded" },
        }),
      );
      // allow_after_failed (the default) takes the key over with a new job.
      const again = await enqueue(c, { idempotency_key: key, task: "t" });
      expect(again.deduplicated).toBe(false);
      expect(again.job_id).not.toBe(job.id);
    });
  });

  it("complete_many() deletes every job it completes, returns their ids, records their keys, skips a lost one", async () => {
    await inRollback(db.pool, async (c) => {
      await setRetention(c, { state: "succeeded", keep: "0" });
      const keys = [unique("key"), unique("key")];
      const a = await running(c, { idempotency_key: keys[0]!, duplicate_policy: "reject_if_succeeded" });
      const b = await running(c, { idempotency_key: keys[1]!, duplicate_policy: "reject_if_succeeded" });
      const plain = await running(c);
      const lost = await running(c);
      const done = await completeMany(c, [a.id, b.id, plain.id, lost.id], [a.attempt, b.attempt, plain.attempt, lost.attempt + 1]);
      expect(done).toEqual([a.id, b.id, plain.id].sort((x, y) => Number(x) - Number(y)));
      for (const id of [a.id, b.id, plain.id]) expect(await exists(c, id)).toBe(false);
      expect((await jobRow(c, lost.id)).state).toBe("processing");
      for (const [i, key] of keys.entries()) {
        expect(await keyRow(c, key)).toMatchObject({ job_id: [a.id, b.id][i], finished_state: "succeeded" });
        await underSavepoint(c, () =>
          expectSqlError(enqueue(c, { idempotency_key: key, duplicate_policy: "reject_if_succeeded" }), { code: "IQ409" }),
        );
      }
    });
  });

  it("complete() of a lost attempt still raises IQ410 and deletes nothing", async () => {
    await inRollback(db.pool, async (c) => {
      await setRetention(c, { state: "succeeded", keep: "0" });
      const job = await running(c);
      await underSavepoint(c, () =>
        expectSqlError(complete(c, job.id, job.attempt + 1), { code: "IQ410", detail: { job_id: Number(job.id) } }),
      );
      expect((await jobRow(c, job.id)).state).toBe("processing");
    });
  });

  it("a job with children is kept succeeded (its children are released) and apply_retention deletes it next", async () => {
    await inRollback(db.pool, async (c) => {
      await setRetention(c, { state: "succeeded", keep: "0" });
      const parent = await running(c);
      const child = await enqueue(c, { after: [parent.id] });
      expect((await jobRow(c, child.job_id)).state).toBe("awaiting");
      await complete(c, parent.id, parent.attempt);
      expect((await jobRow(c, parent.id)).state).toBe("succeeded");
      expect((await jobRow(c, child.job_id)).state).toBe("enqueued");
      await c.query("UPDATE idemq.jobs SET finished_at = now() - interval '1 millisecond' WHERE id = $1", [parent.id]);
      expect((await c.query("SELECT idemq.apply_retention() AS n")).rows[0].n).toBe(1);
      expect(await exists(c, parent.id)).toBe(false);
      expect(await exists(c, child.job_id)).toBe(true);
    });
  });

  it("a job with children in complete_many() is kept; the others in the batch are deleted", async () => {
    await inRollback(db.pool, async (c) => {
      await setRetention(c, { state: "succeeded", keep: "0" });
      const parent = await running(c);
      const other = await running(c);
      const child = await enqueue(c, { after: [parent.id] });
      const done = await completeMany(c, [parent.id, other.id], [parent.attempt, other.attempt]);
      expect(done.sort()).toEqual([parent.id, other.id].sort());
      expect((await jobRow(c, parent.id)).state).toBe("succeeded");
      expect(await exists(c, other.id)).toBe(false);
      expect((await jobRow(c, child.job_id)).state).toBe("enqueued");
    });
  });

  it("a failed job is not deleted by fail() (retention 0 of failed is for apply_retention)", async () => {
    await inRollback(db.pool, async (c) => {
      await setRetention(c, { state: "failed", keep: "0" });
      await setRetention(c, { state: "succeeded", keep: "0" });
      const job = await running(c, { max_attempts: 1 });
      await failRow(c, job.id, job.attempt, { class: "Boom", message: "x" }, { retryable: false });
      expect((await jobRow(c, job.id)).state).toBe("failed");
    });
  });
});

describe("retention 0 by override", () => {
  it("a task's override 0 deletes that task's jobs at completion; others stay (default 7 days)", async () => {
    await inRollback(db.pool, async (c) => {
      const task = unique("task");
      await setRetention(c, { state: "succeeded", keep: "0", task });
      const zero = await running(c, { task });
      const kept = await running(c);
      expect(await completeMany(c, [zero.id, kept.id], [zero.attempt, kept.attempt])).toHaveLength(2);
      expect(await exists(c, zero.id)).toBe(false);
      expect((await jobRow(c, kept.id)).state).toBe("succeeded");
    });
  });

  it("a queue's override 0 yields to its task's override: task > queue > default", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      const task = unique("task");
      await setRetention(c, { state: "succeeded", keep: "0", queue });
      await setRetention(c, { state: "succeeded", keep: "1 day", task });
      const taskInQueue = await running(c, { queue, task });
      const otherInQueue = await running(c, { queue });
      await complete(c, taskInQueue.id, taskInQueue.attempt);
      await complete(c, otherInQueue.id, otherInQueue.attempt);
      expect((await jobRow(c, taskInQueue.id)).state).toBe("succeeded");
      expect(await exists(c, otherInQueue.id)).toBe(false);
    });
  });

  it("a default of 0 yields to a queue's override: that queue's jobs are kept with their result", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      await setRetention(c, { state: "succeeded", keep: "0" });
      await setRetention(c, { state: "succeeded", keep: "1 hour", queue });
      const kept = await running(c, { queue });
      await complete(c, kept.id, kept.attempt, { ok: 1 });
      expect(await jobRow(c, kept.id)).toMatchObject({ state: "succeeded", result: { ok: 1 } });
    });
  });

  it("with no retention 0 anywhere, complete() keeps the row and its result (the usual path)", async () => {
    await inRollback(db.pool, async (c) => {
      const job = await running(c);
      await complete(c, job.id, job.attempt, { ok: 2 });
      expect(await jobRow(c, job.id)).toMatchObject({ state: "succeeded", result: { ok: 2 } });
    });
  });
});

describe("idemq.success_retention: the row completions read, kept from idemq.settings and idemq.retention (0025)", () => {
  type Kept = { default_zero: boolean; zero_tasks: string[]; kept_tasks: string[]; zero_queues: string[]; kept_queues: string[] };

  async function kept(c: Queryable): Promise<Kept[]> {
    return (await c.query<Kept>("SELECT * FROM idemq.success_retention")).rows;
  }

  it("holds exactly one row that follows each change of the default and of the overrides, in the writer's transaction", async () => {
    const before = await kept(db.pool);
    expect(before).toHaveLength(1);
    await inRollback(db.pool, async (c) => {
      const [t1, t2, q1] = [unique("t"), unique("t"), unique("q")];
      await c.query("UPDATE idemq.settings SET value = 3600 WHERE name = 'retention_succeeded_seconds'");
      expect(await kept(c)).toEqual([{ default_zero: false, zero_tasks: [], kept_tasks: [], zero_queues: [], kept_queues: [] }]);
      await setRetention(c, { state: "succeeded", keep: "0", task: t2 });
      await setRetention(c, { state: "succeeded", keep: "0", task: t1 });
      await setRetention(c, { state: "succeeded", keep: "1 day", queue: q1 });
      await setRetention(c, { state: "failed", keep: "0", task: unique("t") });
      expect(await kept(c)).toEqual([
        { default_zero: false, zero_tasks: [t1, t2].sort(), kept_tasks: [], zero_queues: [], kept_queues: [q1] },
      ]);
      expect((await c.query("SELECT any_zero FROM idemq._success_retention()")).rows).toEqual([{ any_zero: true }]);
      await setRetention(c, { state: "succeeded", keep: null, task: t1 });
      await setRetention(c, { state: "succeeded", keep: null, task: t2 });
      await c.query("UPDATE idemq.settings SET value = 0 WHERE name = 'retention_succeeded_seconds'");
      expect(await kept(c)).toEqual([{ default_zero: true, zero_tasks: [], kept_tasks: [], zero_queues: [], kept_queues: [q1] }]);
      // A TRUNCATE of the overrides is followed as well.
      await c.query("TRUNCATE idemq.retention");
      expect(await kept(c)).toEqual([{ default_zero: true, zero_tasks: [], kept_tasks: [], zero_queues: [], kept_queues: [] }]);
    });
    // Rolled back: the row is as it was.
    expect(await kept(db.pool)).toEqual(before);
  });

  it("a completion follows a change made earlier in its own transaction: an override of 1 day keeps the job", async () => {
    await inRollback(db.pool, async (c) => {
      const task = unique("t");
      const job = await running(c, { task });
      await setRetention(c, { state: "succeeded", keep: "1 day", task });
      await complete(c, job.id, job.attempt, { ok: 3 });
      expect(await jobRow(c, job.id)).toMatchObject({ state: "succeeded", result: { ok: 3 } });
    });
  });
});
