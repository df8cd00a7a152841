// Flow control's repair (issue 26): apply_retention frees a concurrency slot
// whose holder is not processing at that attempt (a write made with the jobs
// trigger off), never a slot whose job still runs, and skips a slot another
// transaction holds instead of waiting for it.
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueue, unique } from "../helpers/jobs.ts";
import { claim } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });

/** The slots held in the queue's limit, as (job_id, attempt). */
async function held(queue: string): Promise<{ job_id: string; attempt: number }[]> {
  const { rows } = await db.pool.query<{ job_id: string; attempt: number }>(
    `SELECT s.job_id::text AS job_id, s.attempt FROM idemq.limit_slots s JOIN idemq.limits l ON l.id = s.limit_id
     WHERE l.kind = 'queue' AND l.name = $1 AND s.job_id IS NOT NULL ORDER BY s.job_id`,
    [queue],
  );
  return rows;
}

/** Moves the job out of processing with every trigger off, as a restore or a replica-role session would. */
async function finishUnseen(jobId: string, how: "succeed" | "delete"): Promise<void> {
  const client = await db.pool.connect();
  try {
    await client.query("BEGIN");
    await client.query("SET LOCAL session_replication_role = replica");
    if (how === "succeed") {
      await client.query("UPDATE idemq.jobs SET state = 'succeeded', finished_at = now(), locked_by = NULL, lease_expires_at = NULL WHERE id = $1", [jobId]);
    } else {
      await client.query("DELETE FROM idemq.jobs WHERE id = $1", [jobId]);
    }
    await client.query("COMMIT");
  } finally {
    client.release();
  }
}

async function applyRetention(): Promise<void> {
  await db.pool.query("SELECT idemq.apply_retention()");
}

describe("apply_retention repairs slots the jobs trigger missed", () => {
  it("frees the slot of a job finished or deleted unseen, keeps the slot of a job still processing", async () => {
    const queue = unique("repair");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 2)", [queue]);
    const a = (await enqueue(db.pool, { queue })).job_id;
    const b = (await enqueue(db.pool, { queue })).job_id;
    const c = (await enqueue(db.pool, { queue })).job_id;
    const d = (await enqueue(db.pool, { queue })).job_id;
    expect((await claim(db.pool, { queues: [queue], batch_size: 4 })).map((j) => j.job_id)).toEqual([a, b]);

    await finishUnseen(a, "succeed");
    expect(await held(queue)).toEqual([
      { job_id: a, attempt: 1 },
      { job_id: b, attempt: 1 },
    ]);
    // The slot is stuck: the scope runs one short.
    expect(await claim(db.pool, { queues: [queue] })).toEqual([]);

    await applyRetention();
    expect(await held(queue)).toEqual([{ job_id: b, attempt: 1 }]);
    expect((await claim(db.pool, { queues: [queue], batch_size: 4 })).map((j) => j.job_id)).toEqual([c]);

    await finishUnseen(c, "delete");
    await applyRetention();
    expect(await held(queue)).toEqual([{ job_id: b, attempt: 1 }]);
    expect((await claim(db.pool, { queues: [queue], batch_size: 4 })).map((j) => j.job_id)).toEqual([d]);
    // Nothing orphaned: a second run changes nothing.
    await applyRetention();
    expect(await held(queue)).toEqual([
      { job_id: b, attempt: 1 },
      { job_id: d, attempt: 1 },
    ]);
  });

  it("frees a slot named for an attempt the job has left behind (the job runs again at a later one)", async () => {
    const queue = unique("stale-attempt");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 2)", [queue]);
    const a = (await enqueue(db.pool, { queue })).job_id;
    await claim(db.pool, { queues: [queue] });
    // The slot still says attempt 1 while the job runs its attempt 2 in another slot.
    const client = await db.pool.connect();
    try {
      await client.query("BEGIN");
      await client.query("SET LOCAL session_replication_role = replica");
      await client.query("UPDATE idemq.jobs SET attempt = 2 WHERE id = $1", [a]);
      await client.query(
        `UPDATE idemq.limit_slots s SET job_id = $1, attempt = 2 FROM idemq.limits l
         WHERE l.id = s.limit_id AND l.kind = 'queue' AND l.name = $2 AND s.job_id IS NULL`,
        [a, queue],
      );
      await client.query("COMMIT");
    } finally {
      client.release();
    }
    expect(await held(queue)).toEqual([
      { job_id: a, attempt: 1 },
      { job_id: a, attempt: 2 },
    ]);
    await applyRetention();
    expect(await held(queue)).toEqual([{ job_id: a, attempt: 2 }]);
  });

  it("skips a slot another transaction holds, without waiting, and frees it on a later run", async () => {
    const queue = unique("locked");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 1)", [queue]);
    const a = (await enqueue(db.pool, { queue })).job_id;
    await claim(db.pool, { queues: [queue] });
    await finishUnseen(a, "succeed");

    const holder = await db.newClient();
    await holder.query("BEGIN");
    await holder.query(
      `SELECT FROM idemq.limit_slots s JOIN idemq.limits l ON l.id = s.limit_id
       WHERE l.kind = 'queue' AND l.name = $1 FOR UPDATE OF s`,
      [queue],
    );
    const caller = await db.pool.connect();
    try {
      // A wait would hit the lock timeout (55P03) instead of returning.
      await caller.query("SET lock_timeout = '2s'");
      await caller.query("SELECT idemq.apply_retention()");
      expect(await held(queue)).toEqual([{ job_id: a, attempt: 1 }]);
      await holder.query("COMMIT");
      await caller.query("SELECT idemq.apply_retention()");
      expect(await held(queue)).toEqual([]);
    } finally {
      await caller.query("RESET lock_timeout");
      caller.release();
    }
  });

  it("while a lowered limit drains, the repaired slot is deleted, not freed", async () => {
    const queue = unique("drain");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 2)", [queue]);
    const a = (await enqueue(db.pool, { queue })).job_id;
    await enqueue(db.pool, { queue });
    await enqueue(db.pool, { queue });
    await claim(db.pool, { queues: [queue], batch_size: 2 });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 1)", [queue]);
    await finishUnseen(a, "succeed");
    await applyRetention();
    const { rows } = await db.pool.query<{ slots: number; slot_rows: number }>(
      `SELECT (SELECT count(*) FROM idemq.limit_slots s WHERE s.limit_id = l.id)::int AS slots, l.slot_rows
       FROM idemq.limits l WHERE l.kind = 'queue' AND l.name = $1`,
      [queue],
    );
    expect(rows).toEqual([{ slots: 1, slot_rows: 1 }]);
    // The one slot left is the running job's: nothing more starts.
    expect(await claim(db.pool, { queues: [queue] })).toEqual([]);
  });
});
