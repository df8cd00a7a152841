// Flow control's repair (issue 26): apply_retention corrects a concurrency
// limit's slot count that disagrees with the jobs processing (a write made
// with the jobs trigger off), never frees the slot of a job that still runs,
// and skips a limit whose stripe another transaction holds instead of
// waiting for it.
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueue, unique } from "../helpers/jobs.ts";
import { claim } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });

/** The slots held in the queue's limit: limits().running (the stripes' held less the releases not yet folded). */
async function held(queue: string): Promise<number> {
  const { rows } = await db.pool.query<{ running: number }>("SELECT running FROM idemq.limits() WHERE queue = $1", [queue]);
  return rows[0]!.running;
}

/** The same count from the stripes alone, releases folded or not: what a repair writes. */
async function stripesHeld(queue: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    `SELECT coalesce(sum(s.held), 0)::int AS n FROM idemq.limit_slots s JOIN idemq.limits l ON l.id = s.limit_id
     WHERE l.kind = 'queue' AND l.name = $1`,
    [queue],
  );
  return rows[0]!.n;
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

describe("apply_retention repairs slot counts the jobs trigger missed", () => {
  it("frees the slot of a job finished or deleted unseen, keeps the slot of a job still processing", async () => {
    const queue = unique("repair");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 2)", [queue]);
    const a = (await enqueue(db.pool, { queue })).job_id;
    const b = (await enqueue(db.pool, { queue })).job_id;
    const c = (await enqueue(db.pool, { queue })).job_id;
    const d = (await enqueue(db.pool, { queue })).job_id;
    expect((await claim(db.pool, { queues: [queue], batch_size: 4 })).map((j) => j.job_id)).toEqual([a, b]);

    await finishUnseen(a, "succeed");
    expect(await held(queue)).toBe(2);
    // The slot is stuck: the scope runs one short.
    expect(await claim(db.pool, { queues: [queue] })).toEqual([]);

    await applyRetention();
    expect(await held(queue)).toBe(1);
    expect((await claim(db.pool, { queues: [queue], batch_size: 4 })).map((j) => j.job_id)).toEqual([c]);

    await finishUnseen(c, "delete");
    await applyRetention();
    expect(await held(queue)).toBe(1);
    expect((await claim(db.pool, { queues: [queue], batch_size: 4 })).map((j) => j.job_id)).toEqual([d]);
    // Nothing off: a second run changes nothing (b and d still hold theirs).
    await applyRetention();
    expect(await held(queue)).toBe(2);
    expect(await stripesHeld(queue)).toBe(2);
  });

  it("lowers a count above the jobs processing, and raises one below them (a job claimed unseen), so the limit holds", async () => {
    const queue = unique("count-off");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 2)", [queue]);
    await enqueue(db.pool, { queue });
    const b = (await enqueue(db.pool, { queue })).job_id;
    await enqueue(db.pool, { queue });
    await claim(db.pool, { queues: [queue] });
    // A stripe says one more than runs (a slot taken for a job whose claim was lost).
    await db.pool.query(
      `UPDATE idemq.limit_slots s SET held = s.held + 1 FROM idemq.limits l
       WHERE l.id = s.limit_id AND l.kind = 'queue' AND l.name = $1 AND s.held < s.size`,
      [queue],
    );
    expect(await held(queue)).toBe(2);
    expect(await claim(db.pool, { queues: [queue] })).toEqual([]);
    await applyRetention();
    expect(await held(queue)).toBe(1);
    // Now a job moved into processing with the trigger off and no slot taken: the count says 1, 2 run.
    const client = await db.pool.connect();
    try {
      await client.query("BEGIN");
      await client.query("SET LOCAL session_replication_role = replica");
      await client.query(
        `UPDATE idemq.jobs SET state = 'processing', attempt = attempt + 1, locked_by = 'unseen',
           locked_at = now(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`,
        [b],
      );
      await client.query("COMMIT");
    } finally {
      client.release();
    }
    expect(await held(queue)).toBe(1);
    await applyRetention();
    expect(await held(queue)).toBe(2);
    // Two run under a limit of two: the third job waits.
    expect(await claim(db.pool, { queues: [queue] })).toEqual([]);
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
      expect(await held(queue)).toBe(1);
      await holder.query("COMMIT");
      await caller.query("SELECT idemq.apply_retention()");
      expect(await held(queue)).toBe(0);
    } finally {
      await caller.query("RESET lock_timeout");
      caller.release();
    }
  });

  it("while a lowered limit drains, the repaired slot is given up, not freed", async () => {
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
      `SELECT (SELECT sum(s.size) FROM idemq.limit_slots s WHERE s.limit_id = l.id)::int AS slots, l.slot_rows
       FROM idemq.limits l WHERE l.kind = 'queue' AND l.name = $1`,
      [queue],
    );
    expect(rows).toEqual([{ slots: 1, slot_rows: 1 }]);
    expect(await held(queue)).toBe(1);
    // The one slot left is the running job's: nothing more starts.
    expect(await claim(db.pool, { queues: [queue] })).toEqual([]);
  });
});
