// Retention that runs itself: apply_retention() deletes finished jobs past
// their state's retention (the settings rows retention_<state>_seconds, or an
// override of the job's queue or task set with set_retention()), in batches of
// at most batch_size, never an active job, never a key. Windows are tested at
// their boundaries by setting finished_at relative to the transaction's now().
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, inRollback, interleave, useTestDatabase } from "../helpers/db.ts";
import { ACTIVE_STATES, count, enqueue, keyRow, TERMINAL_STATES, unique, type Queryable } from "../helpers/jobs.ts";
import { jobIn } from "../helpers/work.ts";
import { MAX_DELETE_BATCH } from "../../src/worker/defaults.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase({ poolSize: 6 });

const DAY = 86_400;
const DEFAULTS: Record<string, number> = { succeeded: 7 * DAY, failed: 30 * DAY, cancelled: 30 * DAY, expired: 30 * DAY };

/** Sets a finished job's finished_at to now() + offset (an interval). */
async function finishedAgo(c: Queryable, id: string, offset: string): Promise<void> {
  const { rowCount } = await c.query("UPDATE idemq.jobs SET finished_at = now() + $2::interval WHERE id = $1 AND finished_at IS NOT NULL", [
    id,
    offset,
  ]);
  expect(rowCount).toBe(1);
}

async function applyRetention(c: Queryable, batchSize?: number): Promise<number> {
  const { rows } =
    batchSize === undefined
      ? await c.query<{ n: number }>("SELECT idemq.apply_retention() AS n")
      : await c.query<{ n: number }>("SELECT idemq.apply_retention(batch_size => $1) AS n", [batchSize]);
  return rows[0]!.n;
}

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

/** exists() of each id, one query at a time: c is one connection (concurrent queries on one pg.Client are deprecated). */
async function existing(c: Queryable, ids: readonly string[]): Promise<boolean[]> {
  const found: boolean[] = [];
  for (const id of ids) found.push(await exists(c, id));
  return found;
}

/** Every row of idemq.retention and the retention settings, to show nothing was written. */
async function retentionState(c: Queryable): Promise<unknown> {
  const overrides = await c.query("SELECT queue, task, state::text, keep::text FROM idemq.retention ORDER BY 1, 2, 3");
  const settings = await c.query("SELECT name, value FROM idemq.settings WHERE name LIKE 'retention\\_%' ORDER BY name");
  return { overrides: overrides.rows, settings: settings.rows };
}

describe("the default retention of each state", () => {
  it("is a settings row per terminal state: succeeded 7 days, failed/cancelled/expired 30 days, range 0..100 years", async () => {
    const { rows } = await db.pool.query<{ name: string; value: string; min_value: string; max_value: string }>(
      "SELECT name, value, min_value, max_value FROM idemq.settings WHERE name LIKE 'retention\\_%' ORDER BY name",
    );
    expect(Object.fromEntries(rows.map((r) => [r.name, Number(r.value)]))).toEqual(
      Object.fromEntries(TERMINAL_STATES.map((s) => [`retention_${s}_seconds`, DEFAULTS[s]])),
    );
    for (const r of rows) expect([Number(r.min_value), Number(r.max_value)]).toEqual([0, 36500 * DAY]);
  });

  it.each(TERMINAL_STATES)("%s: deletes the job finished just outside its retention, keeps the one at it and just inside", async (state) => {
    await inRollback(db.pool, async (c) => {
      const keep = `${DEFAULTS[state]} seconds`;
      const outside = await jobIn(c, state);
      const boundary = await jobIn(c, state);
      const inside = await jobIn(c, state);
      await finishedAgo(c, outside, `-${keep} -1 millisecond`);
      await finishedAgo(c, boundary, `-${keep}`);
      await finishedAgo(c, inside, `-${keep} +1 millisecond`);
      expect(await applyRetention(c)).toBe(1);
      expect([await exists(c, outside), await exists(c, boundary), await exists(c, inside)]).toEqual([false, true, true]);
    });
  });

  it("one state's retention does not apply to another: a failed job 8 days old stays, a succeeded one goes", async () => {
    await inRollback(db.pool, async (c) => {
      const failed = await jobIn(c, "failed");
      const succeeded = await jobIn(c, "succeeded");
      await finishedAgo(c, failed, "-8 days");
      await finishedAgo(c, succeeded, "-8 days");
      expect(await applyRetention(c)).toBe(1);
      expect([await exists(c, failed), await exists(c, succeeded)]).toEqual([true, false]);
    });
  });

  it("never deletes an active job, even with every retention 0", async () => {
    await inRollback(db.pool, async (c) => {
      for (const state of TERMINAL_STATES) await setRetention(c, { state, keep: "0" });
      const active: string[] = [];
      for (const state of ACTIVE_STATES) active.push(await jobIn(c, state)); // one client: one query at a time
      const finished = await jobIn(c, "cancelled");
      await finishedAgo(c, finished, "-1 second");
      expect(await applyRetention(c)).toBe(1);
      for (const id of active) expect(await exists(c, id), `active job ${id}`).toBe(true);
      expect(await exists(c, finished)).toBe(false);
    });
  });

  it("set_retention without queue or task writes the settings row, in whole seconds", async () => {
    await inRollback(db.pool, async (c) => {
      await setRetention(c, { state: "failed", keep: "1 hour 0.4 seconds" });
      const { rows } = await c.query("SELECT value FROM idemq.settings WHERE name = 'retention_failed_seconds'");
      expect(rows).toEqual([{ value: "3600" }]);
      const old = await jobIn(c, "failed");
      const young = await jobIn(c, "failed");
      await finishedAgo(c, old, "-1 hour -1 second");
      await finishedAgo(c, young, "-59 minutes");
      expect(await applyRetention(c)).toBe(1);
      expect([await exists(c, old), await exists(c, young)]).toEqual([false, true]);
    });
  });

  it("never releases a key: a deleted job's key still rejects per its policy", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("key");
      const { job_id } = await enqueue(c, { idempotency_key: key, duplicate_policy: "reject_always" });
      await c.query("SELECT idemq.cancel(job_id => $1)", [job_id]);
      await finishedAgo(c, job_id, "-31 days");
      expect(await applyRetention(c)).toBe(1);
      expect(await exists(c, job_id)).toBe(false);
      expect(await keyRow(c, key)).toMatchObject({ job_id, finished_state: "cancelled" });
      await underSavepoint(c, () =>
        expectSqlError(enqueue(c, { idempotency_key: key, duplicate_policy: "reject_always" }), {
          code: "IQ409",
          detail: { key, existing_job_id: Number(job_id), existing_state: "cancelled" },
        }),
      );
    });
  });
});

describe("overrides: task > queue > default", () => {
  it("a queue override shorter than the default deletes that queue's jobs sooner, and only them", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      await setRetention(c, { state: "succeeded", keep: "1 hour", queue });
      const inQueue = await jobIn(c, "succeeded", { queue });
      const youngInQueue = await jobIn(c, "succeeded", { queue });
      const elsewhere = await jobIn(c, "succeeded");
      const failedInQueue = await jobIn(c, "failed", { queue });
      await finishedAgo(c, inQueue, "-1 hour -1 millisecond");
      await finishedAgo(c, youngInQueue, "-1 hour");
      await finishedAgo(c, elsewhere, "-2 hours");
      await finishedAgo(c, failedInQueue, "-2 hours");
      expect(await applyRetention(c)).toBe(1);
      expect(await existing(c, [inQueue, youngInQueue, elsewhere, failedInQueue])).toEqual([
        false,
        true,
        true,
        true,
      ]);
    });
  });

  it("a queue override longer than the default keeps that queue's jobs past the default", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      await setRetention(c, { state: "succeeded", keep: "365 days", queue });
      const kept = await jobIn(c, "succeeded", { queue });
      const gone = await jobIn(c, "succeeded");
      const veryOld = await jobIn(c, "succeeded", { queue });
      await finishedAgo(c, kept, "-8 days");
      await finishedAgo(c, gone, "-8 days");
      await finishedAgo(c, veryOld, "-366 days");
      expect(await applyRetention(c)).toBe(2);
      expect(await existing(c, [kept, gone, veryOld])).toEqual([true, false, false]);
    });
  });

  it("a task override wins over its queue's override, in either direction", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      const task = unique("task");
      await setRetention(c, { state: "succeeded", keep: "1 hour", queue });
      await setRetention(c, { state: "succeeded", keep: "10 days", task });
      const taskInQueue = await jobIn(c, "succeeded", { queue, task }); // 10 days (task)
      const otherInQueue = await jobIn(c, "succeeded", { queue }); // 1 hour (queue)
      const taskElsewhere = await jobIn(c, "succeeded", { task }); // 10 days (task), not the default 7
      const taskOld = await jobIn(c, "succeeded", { task });
      await finishedAgo(c, taskInQueue, "-2 days");
      await finishedAgo(c, otherInQueue, "-2 hours");
      await finishedAgo(c, taskElsewhere, "-8 days");
      await finishedAgo(c, taskOld, "-10 days -1 second");
      expect(await applyRetention(c)).toBe(2);
      expect(await existing(c, [taskInQueue, otherInQueue, taskElsewhere, taskOld])).toEqual([
        true,
        false,
        true,
        false,
      ]);
    });
  });

  it("set_retention replaces an override, and keep => NULL removes it (the default applies again)", async () => {
    await inRollback(db.pool, async (c) => {
      const task = unique("task");
      await setRetention(c, { state: "failed", keep: "1 day", task });
      await setRetention(c, { state: "failed", keep: "2 days", task });
      const { rows } = await c.query("SELECT keep::text FROM idemq.retention WHERE task = $1", [task]);
      expect(rows).toEqual([{ keep: "2 days" }]);
      const job = await jobIn(c, "failed", { task });
      await finishedAgo(c, job, "-3 days");
      await setRetention(c, { state: "failed", keep: null, task });
      expect(await count(c, "SELECT 1 FROM idemq.retention WHERE task = $1", [task])).toBe(0);
      expect(await applyRetention(c)).toBe(0); // 30 days again
      expect(await exists(c, job)).toBe(true);
    });
  });
});

describe("batches", () => {
  it("each call deletes at most batch_size jobs, oldest first; a caller loops while a batch comes back full", async () => {
    await inRollback(db.pool, async (c) => {
      const ids: string[] = [];
      for (let i = 0; i < 25; i++) {
        const id = await jobIn(c, "succeeded", { queue: "batch-q" });
        await finishedAgo(c, id, `-8 days -${25 - i} minutes`);
        ids.push(id);
      }
      const calls: number[] = [];
      for (;;) {
        const n = await applyRetention(c, 10);
        calls.push(n);
        expect(n).toBeLessThanOrEqual(10);
        if (n < 10) break;
        // The oldest go first: after k full batches the 10k oldest are gone and no other.
        const left = await count(c, "SELECT 1 FROM idemq.jobs WHERE id = ANY ($1::bigint[])", [ids]);
        expect(left).toBe(25 - calls.reduce((a, b) => a + b, 0));
        expect(await exists(c, ids[calls.length * 10 - 1]!)).toBe(false);
        expect(await exists(c, ids[calls.length * 10]!)).toBe(true);
      }
      expect(calls).toEqual([10, 10, 5]);
      expect(await applyRetention(c, 10)).toBe(0);
    });
  });

  it("a batch spans rules: overrides first, then the defaults, never more than batch_size in all", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      await setRetention(c, { state: "failed", keep: "1 hour", queue });
      for (let i = 0; i < 3; i++) await finishedAgo(c, await jobIn(c, "failed", { queue }), "-2 hours");
      for (let i = 0; i < 3; i++) await finishedAgo(c, await jobIn(c, "succeeded"), "-8 days");
      expect(await applyRetention(c, 4)).toBe(4);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE queue = $1", [queue])).toBe(0);
      expect(await applyRetention(c, 4)).toBe(2);
    });
  });

  it("skips rows another transaction holds (SKIP LOCKED) instead of waiting", async () => {
    const queue = unique("locked-q");
    const ids = [await jobIn(db.pool, "succeeded", { queue }), await jobIn(db.pool, "succeeded", { queue })];
    await db.pool.query("UPDATE idemq.jobs SET finished_at = now() - interval '8 days' WHERE id = ANY ($1::bigint[])", [ids]);
    const holder = await db.pool.connect();
    try {
      await holder.query("BEGIN");
      await holder.query("SELECT 1 FROM idemq.jobs WHERE id = $1 FOR UPDATE", [ids[0]]);
      await inRollback(db.pool, async (c) => {
        await c.query("SET LOCAL lock_timeout = '5s'");
        expect(await applyRetention(c)).toBe(1);
        expect([await exists(c, ids[0]!), await exists(c, ids[1]!)]).toEqual([true, false]);
      });
    } finally {
      await holder.query("ROLLBACK");
      holder.release();
      await db.pool.query("DELETE FROM idemq.jobs WHERE id = ANY ($1::bigint[])", [ids]);
    }
  });
});

describe("concurrency, on real connections", () => {
  it("a retry waits for apply_retention's batch that holds its job, then finds it gone (IQ404): never a half-deleted job", async () => {
    const queue = unique("race-q");
    const id = await jobIn(db.pool, "failed", { queue });
    await db.pool.query("UPDATE idemq.jobs SET finished_at = now() - interval '31 days' WHERE id = $1", [id]);
    const a = await db.pool.connect();
    const b = await db.pool.connect();
    try {
      const run = await interleave(db.pool, {
        first: a,
        holds: async (c) => expect((await c.query("SELECT idemq.apply_retention() AS n")).rows[0].n).toBe(1),
        second: b,
        blocks: (c) =>
          c.query("SELECT idemq.retry(job_id => $1)", [id]).then(
            () => undefined,
            (error: Error) => error,
          ),
        end: "COMMIT",
      });
      expect(run.blockers).toContain(run.firstPid);
      expect(await run.second).toMatchObject({ code: "IQ404" });
      expect(await exists(db.pool, id)).toBe(false);
    } finally {
      await a.query("ROLLBACK").catch(() => {});
      a.release();
      b.release();
    }
  });

  it("four connections calling apply_retention at once delete every due job exactly once, in batches of at most 50", async () => {
    const queue = unique("stress-q");
    const n = 1000;
    await db.pool.query(
      `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, max_attempts, finished_at)
       SELECT 'stress', $1, '{}', 'succeeded', 0, now(), 1, now() - interval '8 days' FROM generate_series(1, $2)`,
      [queue, n],
    );
    const calls: number[] = [];
    await Promise.all(
      [1, 2, 3, 4].map(async () => {
        const client = await db.pool.connect();
        try {
          for (;;) {
            const got = (await client.query<{ n: number }>("SELECT idemq.apply_retention(batch_size => 50) AS n")).rows[0]!.n;
            calls.push(got);
            if (got === 0) return;
          }
        } finally {
          client.release();
        }
      }),
    );
    expect(calls.reduce((x, y) => x + y, 0)).toBe(n);
    expect(Math.max(...calls)).toBeLessThanOrEqual(50);
    expect(calls.filter((got) => got > 0).length).toBeGreaterThanOrEqual(n / 50);
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE queue = $1", [queue])).toBe(0);
  });
});

describe("bad input: 22004 / 22023 with a HINT, nothing written", () => {
  const cases: [string, { state: string | null; keep: string | null; queue?: string; task?: string }, string, RegExp][] = [
    ["a NULL state", { state: null, keep: "1 day" }, "22004", /terminal state/],
    ["NULL keep for a default", { state: "succeeded", keep: null }, "22004", /NULL only removes an override/],
    ["a negative keep", { state: "succeeded", keep: "-1 second" }, "22023", /0 deletes it at once/],
    ["a negative keep for an override", { state: "failed", keep: "-1 day", queue: "q" }, "22023", /0 deletes it at once/],
    ["an active state (override)", { state: "processing", keep: "1 day", queue: "q" }, "22023", /active jobs are never deleted/],
    ["an active state (default)", { state: "enqueued", keep: "1 day" }, "22023", /active jobs are never deleted/],
    ["both a queue and a task", { state: "failed", keep: "1 day", queue: "q", task: "t" }, "22023", /one queue or one task/],
    ["an empty queue name", { state: "failed", keep: "1 day", queue: "" }, "22023", /Leave both out/],
    ["an empty task name", { state: "failed", keep: "1 day", task: "" }, "22023", /Leave both out/],
    ["keep over duration_days", { state: "failed", keep: "36501 days", task: "t" }, "22023", /duration_days/],
  ];
  it.each(cases)("set_retention with %s", async (_name, args, code, hint) => {
    await inRollback(db.pool, async (c) => {
      const before = await retentionState(c);
      await underSavepoint(c, () =>
        expectSqlError(
          c.query("SELECT idemq.set_retention(state => $1::idemq.job_state, keep => $2::interval, queue => $3, task => $4)", [
            args.state,
            args.keep,
            args.queue ?? null,
            args.task ?? null,
          ]),
          { code, hint },
        ),
      );
      expect(await retentionState(c)).toEqual(before);
    });
  });

  it("set_retention with an unknown state: 22P02 (class 22) from the enum, nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const before = await retentionState(c);
      await underSavepoint(c, () =>
        expectSqlError(c.query("SELECT idemq.set_retention(state => 'finished', keep => '1 day')"), {
          code: "22P02",
          message: /job_state/,
        }),
      );
      expect(await retentionState(c)).toEqual(before);
    });
  });

  it("an admin's UPDATE of a retention setting outside 0..100 years is refused by the settings CHECK", async () => {
    await inRollback(db.pool, async (c) => {
      await underSavepoint(c, () =>
        expectSqlError(c.query("UPDATE idemq.settings SET value = -1 WHERE name = 'retention_succeeded_seconds'"), {
          code: "23514",
          constraint: "settings_value_in_range",
        }),
      );
    });
  });

  it.each([
    ["apply_retention", "SELECT idemq.apply_retention(batch_size => $1)"],
    ["purge", "SELECT idemq.purge(older_than => '1 day', batch_size => $1)"],
  ])("%s: batch_size NULL (apply_retention), 0 or 10001 is refused before anything is deleted", async (fn, text) => {
    await inRollback(db.pool, async (c: pg.PoolClient) => {
      const job = await jobIn(c, "succeeded");
      await finishedAgo(c, job, "-8 days");
      for (const [size, code] of [
        [0, "22023"],
        [10001, "22023"],
        ...(fn === "apply_retention" ? [[null, "22004"] as const] : []),
      ] as const) {
        await underSavepoint(c, () => expectSqlError(c.query(text, [size]), { code, hint: /batches of a few thousand/ }));
      }
      expect(await exists(c, job)).toBe(true);
    });
  });
});

describe("the largest batch", () => {
  it("is MAX_DELETE_BATCH (the worker's and the CLI's bound) in SQL too: accepted, and one more refused", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await applyRetention(c, MAX_DELETE_BATCH)).toBe(0);
      await underSavepoint(c, () => expectSqlError(applyRetention(c, MAX_DELETE_BATCH + 1), { code: "22023" }));
    });
  });
});

describe("purge in batches", () => {
  it("deletes at most batch_size per call, oldest first within a state, whatever the retention settings", async () => {
    await inRollback(db.pool, async (c) => {
      const ids: string[] = [];
      for (let i = 0; i < 7; i++) {
        const id = await jobIn(c, i % 2 === 0 ? "succeeded" : "failed");
        await finishedAgo(c, id, `-2 hours -${10 - i} minutes`);
        ids.push(id);
      }
      const batch = (n: number) =>
        c.query<{ n: number }>("SELECT idemq.purge(older_than => '1 hour', batch_size => $1) AS n", [n]).then((r) => r.rows[0]!.n);
      expect(await batch(3)).toBe(3);
      // succeeded comes first in terminal_states(): its three oldest (ids 0, 2, 4) went.
      expect(await existing(c, ids)).toEqual([false, true, false, true, false, true, true]);
      expect(await batch(3)).toBe(3);
      expect(await batch(3)).toBe(1);
      expect(await batch(3)).toBe(0);
    });
  });
});
