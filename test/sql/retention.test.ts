// Retention: purge deletes finished jobs past older_than and never releases a
// key; prune_keys is the only thing that releases keys (after their retention,
// never while the key's job is active) and also prunes old guard rows and done
// effect records. Time windows are tested at their boundaries by setting
// finished_at / created_at / done_at relative to the transaction's now().
import type pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  expectSqlError,
  useTestDatabase,
  inRollback,
  interleave,
} from "../helpers/db.ts";
import {
  ACTIVE_STATES,
  count,
  enqueue,
  jobRow,
  keyRow,
  sql,
  TERMINAL_STATES,
  unique,
  type Queryable,
} from "../helpers/jobs.ts";
import { claimJob, jobIn } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

/** Sets a finished job's finished_at (and its key's, when it holds one) to now() + offset. */
async function finishedAgo(c: Queryable, id: string, offset: string): Promise<void> {
  await c.query("UPDATE idemq.jobs SET finished_at = now() + $2::interval WHERE id = $1", [id, offset]);
  await c.query(
    "UPDATE idemq.keys k SET finished_at = now() + $2::interval FROM idemq.jobs j WHERE j.id = $1 AND k.key = j.idempotency_key AND k.job_id = j.id",
    [id, offset],
  );
}

async function exists(c: Queryable, id: string): Promise<boolean> {
  return (await count(c, "SELECT 1 FROM idemq.jobs WHERE id = $1", [id])) === 1;
}

async function purge(c: Queryable, olderThan: string, states?: string[]): Promise<number> {
  const { rows } = states
    ? await c.query<{ n: number }>("SELECT idemq.purge(older_than => $1, states => $2::idemq.job_state[]) AS n", [
        olderThan,
        states,
      ])
    : await c.query<{ n: number }>("SELECT idemq.purge(older_than => $1) AS n", [olderThan]);
  return rows[0]!.n;
}

async function pruneKeys(c: Queryable, olderThan?: string): Promise<number> {
  const { rows } =
    olderThan === undefined
      ? await c.query<{ n: number }>("SELECT idemq.prune_keys() AS n")
      : await c.query<{ n: number }>("SELECT idemq.prune_keys(older_than => $1) AS n", [olderThan]);
  return rows[0]!.n;
}

describe("purge", () => {
  it.each(TERMINAL_STATES)(
    "%s jobs: deletes those finished just outside older_than, keeps those at or just inside it",
    async (state) => {
      await inRollback(db.pool, async (c) => {
        const outside = await jobIn(c, state, { task: "t" });
        const boundary = await jobIn(c, state, { task: "t" });
        const inside = await jobIn(c, state, { task: "t" });
        await finishedAgo(c, outside, "-1 hour -1 millisecond");
        await finishedAgo(c, boundary, "-1 hour");
        await finishedAgo(c, inside, "-1 hour +1 millisecond");
        expect(await purge(c, "1 hour")).toBe(1);
        expect(await exists(c, outside)).toBe(false);
        expect(await exists(c, boundary)).toBe(true);
        expect(await exists(c, inside)).toBe(true);
      });
    },
  );

  it("never deletes active jobs, however old", async () => {
    await inRollback(db.pool, async (c) => {
      const active: string[] = [];
      for (const state of ACTIVE_STATES) active.push(await jobIn(c, state, { task: "t" }));
      await c.query("UPDATE idemq.jobs SET created_at = now() - interval '10 years' WHERE id = ANY($1::bigint[])", [
        active,
      ]);
      const done = await jobIn(c, "succeeded", { task: "t" });
      await finishedAgo(c, done, "-1 second");
      expect(await purge(c, "0 seconds")).toBe(1);
      for (const id of active) expect(await exists(c, id)).toBe(true);
      expect(await exists(c, done)).toBe(false);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE finished_at IS NOT NULL")).toBe(0);
    });
  });

  it("deletes only the states given", async () => {
    await inRollback(db.pool, async (c) => {
      const ids = new Map<string, string>();
      for (const state of TERMINAL_STATES) {
        const id = await jobIn(c, state, { task: "t" });
        await finishedAgo(c, id, "-1 day");
        ids.set(state, id);
      }
      expect(await purge(c, "1 hour", ["failed", "expired"])).toBe(2);
      expect(await exists(c, ids.get("failed")!)).toBe(false);
      expect(await exists(c, ids.get("expired")!)).toBe(false);
      expect(await exists(c, ids.get("succeeded")!)).toBe(true);
      expect(await exists(c, ids.get("cancelled")!)).toBe(true);
    });
  });

  it.each(ACTIVE_STATES)("rejects the active state %s in states with 22023, deleting nothing", async (state) => {
    await inRollback(db.pool, async (c) => {
      const done = await jobIn(c, "succeeded", { task: "t" });
      await finishedAgo(c, done, "-1 day");
      await expectSqlError(underSavepoint(c, () => purge(c, "1 hour", ["succeeded", state])), {
        code: "22023",
        message: /states must be terminal/,
      });
      expect(await exists(c, done)).toBe(true);
    });
  });

  it("rejects NULL arguments (22004) and a negative older_than (22023)", async () => {
    await inRollback(db.pool, async (c) => {
      await expectSqlError(underSavepoint(c, () => c.query("SELECT idemq.purge(older_than => NULL)")), { code: "22004" });
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.purge(older_than => '1 day', states => NULL)")),
        { code: "22004" },
      );
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.purge(older_than => '1 day', states => ARRAY[NULL]::idemq.job_state[])")),
        { code: "22023" },
      );
      await expectSqlError(underSavepoint(c, () => purge(c, "-1 second")), { code: "22023" });
    });
  });

  it("a purged job's key still applies its policy: reject_always rejects, allow_after_failed makes a new job that then deduplicates", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const old = await jobIn(c, "succeeded", { task: "t", idempotency_key: key });
      await finishedAgo(c, old, "-30 days");
      expect(await purge(c, "1 day")).toBe(1);
      expect(await exists(c, old)).toBe(false);
      expect(await keyRow(c, key)).toMatchObject({ job_id: old, finished_state: "succeeded" });

      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_always" })),
        { code: "IQ409", detail: { key, existing_job_id: Number(old), existing_state: "succeeded", policy: "reject_always" } },
      );
      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_if_succeeded" })),
        { code: "IQ409", detail: { existing_job_id: Number(old), existing_state: "succeeded" } },
      );
      const fresh = await enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "allow_after_failed" });
      expect(fresh.deduplicated).toBe(false);
      const again = await enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_always" });
      expect(again).toEqual({ job_id: fresh.job_id, deduplicated: true });
    });
  });

  it("a purged child with a dependency row left on an active parent does not break the parent's completion", async () => {
    await inRollback(db.pool, async (c) => {
      const a = await jobIn(c, "enqueued", { task: "p" });
      const b = await jobIn(c, "enqueued", { task: "p" });
      const child = await enqueue(c, { task: "child", after: [a, b] });
      await c.query("SELECT idemq.cancel($1)", [a]);
      expect((await jobRow(c, child.job_id)).state).toBe("cancelled");
      await finishedAgo(c, child.job_id, "-1 day");
      await finishedAgo(c, a, "-1 day");
      expect(await purge(c, "1 hour")).toBe(2);
      expect(await exists(c, child.job_id)).toBe(false);
      await c.query("SELECT idemq.complete($1, $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [b, await claimJob(c, b)]);
      expect((await jobRow(c, b)).state).toBe("succeeded");
      expect(await count(c, "SELECT 1 FROM idemq.job_dependencies WHERE child_id = $1", [child.job_id])).toBe(0);
    });
  });

  it("skips a job another transaction holds (SKIP LOCKED) instead of waiting for it", async () => {
    const holder = await db.newClient();
    const done = await jobIn(db.pool, "succeeded", { task: "t" });
    const other = await jobIn(db.pool, "failed", { task: "t" });
    await finishedAgo(db.pool, done, "-1 day");
    await finishedAgo(db.pool, other, "-1 day");
    await holder.query("BEGIN");
    await holder.query("SELECT 1 FROM idemq.jobs WHERE id = $1 FOR UPDATE", [done]);
    try {
      expect(await purge(db.pool, "1 hour")).toBe(1);
      expect(await exists(db.pool, other)).toBe(false);
      expect(await exists(db.pool, done)).toBe(true);
    } finally {
      await holder.query("ROLLBACK");
    }
    expect(await purge(db.pool, "1 hour")).toBe(1);
    expect(await exists(db.pool, done)).toBe(false);
  });
});

describe("prune_keys", () => {
  it("releases a key only after its retention: default 14 days, just outside released, at or just inside kept", async () => {
    await inRollback(db.pool, async (c) => {
      const [outside, boundary, inside] = [unique("k"), unique("k"), unique("k")];
      const jobs = new Map<string, string>();
      for (const key of [outside, boundary, inside]) jobs.set(key, await jobIn(c, "succeeded", { task: "t", idempotency_key: key }));
      await finishedAgo(c, jobs.get(outside)!, "-14 days -1 millisecond");
      await finishedAgo(c, jobs.get(boundary)!, "-14 days");
      await finishedAgo(c, jobs.get(inside)!, "-14 days +1 millisecond");
      expect(await pruneKeys(c)).toBe(1);
      expect(await keyRow(c, outside)).toBeUndefined();
      expect(await keyRow(c, boundary)).toBeDefined();
      expect(await keyRow(c, inside)).toBeDefined();
      // prune_keys releases keys; the jobs themselves stay until purge.
      expect(await exists(c, jobs.get(outside)!)).toBe(true);
    });
  });

  // ⚑ For keys older_than is a floor over each key's own retention: these keys
  // were enqueued with key_retention 1 hour, so older_than decides.
  it("uses the given older_than, at its boundary, for keys whose own retention is shorter", async () => {
    await inRollback(db.pool, async (c) => {
      const [old, young, ownRetention] = [unique("k"), unique("k"), unique("k")];
      const oldJob = await jobIn(c, "failed", { task: "t", idempotency_key: old, key_retention: "1 hour" });
      const youngJob = await jobIn(c, "cancelled", { task: "t", idempotency_key: young, key_retention: "1 hour" });
      const defaultJob = await jobIn(c, "failed", { task: "t", idempotency_key: ownRetention });
      await finishedAgo(c, oldJob, "-1 hour -1 millisecond");
      await finishedAgo(c, youngJob, "-1 hour +1 millisecond");
      await finishedAgo(c, defaultJob, "-1 hour -1 millisecond");
      expect(await pruneKeys(c, "1 hour")).toBe(1);
      expect(await keyRow(c, old)).toBeUndefined();
      expect(await keyRow(c, young)).toBeDefined();
      // Its own retention (the default, 14 days) has not passed: kept, whatever older_than says.
      expect(await keyRow(c, ownRetention)).toBeDefined();
    });
  });

  it.each(ACTIVE_STATES)("never releases the key of a %s job, even with older_than 0 and an old key", async (state) => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const id = await jobIn(c, state, { task: "t", idempotency_key: key });
      await c.query("UPDATE idemq.keys SET created_at = now() - interval '10 years' WHERE key = $1", [key]);
      await c.query("UPDATE idemq.jobs SET created_at = now() - interval '10 years' WHERE id = $1", [id]);
      expect(await pruneKeys(c, "0 seconds")).toBe(0);
      expect(await keyRow(c, key)).toMatchObject({ job_id: id, finished_state: null });
      expect(await enqueue(c, { task: "t", idempotency_key: key })).toEqual({ job_id: id, deduplicated: true });
    });
  });

  it("after a key is released, the same key makes a new job whatever the policy", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const old = await jobIn(c, "succeeded", { task: "t", idempotency_key: key });
      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_always" })),
        { code: "IQ409" },
      );
      await finishedAgo(c, old, "-15 days");
      expect(await pruneKeys(c)).toBe(1);
      const fresh = await enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_always" });
      expect(fresh.deduplicated).toBe(false);
      expect(fresh.job_id).not.toBe(old);
      expect(await keyRow(c, key)).toMatchObject({ job_id: fresh.job_id, finished_state: null });
    });
  });

  it("a purged job's key is released by prune_keys after its retention", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const old = await jobIn(c, "failed", { task: "t", idempotency_key: key });
      await finishedAgo(c, old, "-20 days");
      expect(await purge(c, "7 days")).toBe(1);
      expect(await keyRow(c, key)).toBeDefined();
      expect(await pruneKeys(c)).toBe(1);
      const fresh = await enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_if_failed" });
      expect(fresh.deduplicated).toBe(false);
    });
  });

  it("removes guard rows older than older_than, keeping fresh ones", async () => {
    await inRollback(db.pool, async (c) => {
      const [old, boundary, fresh] = [unique("g"), unique("g"), unique("g")];
      for (const key of [old, boundary, fresh]) {
        const { rows } = await c.query("SELECT idemq.guard($1) AS go", [key]);
        expect(rows[0].go).toBe(true);
      }
      await c.query("UPDATE idemq.processed SET created_at = now() - interval '14 days 0.001 seconds' WHERE key = $1", [old]);
      await c.query("UPDATE idemq.processed SET created_at = now() - interval '14 days' WHERE key = $1", [boundary]);
      // Guard rows do not count as released keys.
      expect(await pruneKeys(c)).toBe(0);
      const { rows } = await c.query<{ key: string }>("SELECT key FROM idemq.processed WHERE key = ANY($1) ORDER BY key", [
        [old, boundary, fresh],
      ]);
      expect(rows.map((r) => r.key).sort()).toEqual([boundary, fresh].sort());
      // The pruned guard key lets the effect run again.
      const again = await c.query("SELECT idemq.guard($1) AS go", [old]);
      expect(again.rows[0].go).toBe(true);
    });
  });

  it("removes done effect records older than older_than; keeps fresh ones and claims still held, however old", async () => {
    await inRollback(db.pool, async (c) => {
      const [oldDone, freshDone, oldClaim] = [unique("e"), unique("e"), unique("e")];
      for (const key of [oldDone, freshDone, oldClaim]) {
        const { rows } = await c.query("SELECT status FROM idemq.effect_claim($1, 'owner-1')", [key]);
        expect(rows[0].status).toBe("claimed");
      }
      for (const key of [oldDone, freshDone]) {
        await c.query(`SELECT idemq.effect_done($1, 'owner-1', '{"ok": true}')`, [key]);
      }
      await c.query(
        "UPDATE idemq.effects SET claimed_at = now() - interval '30 days', done_at = now() - interval '14 days 0.001 seconds' WHERE key = $1",
        [oldDone],
      );
      await c.query("UPDATE idemq.effects SET claimed_at = now() - interval '30 days' WHERE key = $1", [oldClaim]);
      expect(await pruneKeys(c)).toBe(0);
      const { rows } = await c.query<{ key: string; status: string }>(
        "SELECT key, status FROM idemq.effects WHERE key = ANY($1)",
        [[oldDone, freshDone, oldClaim]],
      );
      expect(new Map(rows.map((r) => [r.key, r.status]))).toEqual(
        new Map([
          [freshDone, "done"],
          [oldClaim, "claimed"],
        ]),
      );
    });
  });

  it("rejects NULL (22004) and a negative older_than (22023)", async () => {
    await inRollback(db.pool, async (c) => {
      await expectSqlError(underSavepoint(c, () => c.query("SELECT idemq.prune_keys(older_than => NULL)")), {
        code: "22004",
      });
      await expectSqlError(underSavepoint(c, () => pruneKeys(c, "-1 day")), { code: "22023" });
    });
  });
});

describe("per-key retention: enqueue(key_retention), kept on the key row", () => {
  it("enqueue and enqueue_many store each key's retention (default 14 days); a takeover stores its own", async () => {
    await inRollback(db.pool, async (c) => {
      const [a, b, d] = [unique("k"), unique("k"), unique("k")];
      await enqueue(c, { task: "t", idempotency_key: a, key_retention: "1 day" });
      const { rows } = await c.query<{ outcome: string }>("SELECT * FROM idemq.enqueue_many($1::jsonb)", [
        JSON.stringify([
          { task: "t", idempotency_key: b, key_retention: "30 days" },
          { task: "t", idempotency_key: d },
        ]),
      ]);
      expect(rows.map((r) => r.outcome)).toEqual(["created", "created"]);
      const retention = async (key: string) =>
        (await c.query<{ r: string }>("SELECT retention::text AS r FROM idemq.keys WHERE key = $1", [key])).rows[0]?.r;
      expect([await retention(a), await retention(b), await retention(d)]).toEqual(["1 day", "30 days", "14 days"]);

      const key = unique("k");
      await jobIn(c, "failed", { task: "t", idempotency_key: key, key_retention: "2 days" });
      expect(await retention(key)).toBe("2 days");
      const taken = await enqueue(c, { task: "t", idempotency_key: key, key_retention: "3 hours" });
      expect(taken.deduplicated).toBe(false);
      expect(await keyRow(c, key)).toMatchObject({ job_id: taken.job_id, finished_state: null });
      expect(await retention(key)).toBe("03:00:00");
    });
  });

  it("retry: a job whose key row is still there keeps its retention; one whose key was released takes the default", async () => {
    await inRollback(db.pool, async (c) => {
      const retention = async (key: string) =>
        (await c.query<{ r: string }>("SELECT retention::text AS r FROM idemq.keys WHERE key = $1", [key])).rows[0]?.r;
      const [kept, released] = [unique("k"), unique("k")];
      const keptJob = await jobIn(c, "failed", { task: "t", idempotency_key: kept, key_retention: "2 days" });
      const releasedJob = await jobIn(c, "failed", { task: "t", idempotency_key: released, key_retention: "2 days" });
      await finishedAgo(c, releasedJob, "-3 days");
      expect(await pruneKeys(c, "0")).toBe(1);
      expect(await retention(released)).toBeUndefined();
      for (const id of [keptJob, releasedJob]) await c.query("SELECT idemq.retry(job_id => $1)", [id]);
      expect(await retention(kept)).toBe("2 days");
      expect(await retention(released)).toBe("14 days");
      expect(await keyRow(c, released)).toMatchObject({ job_id: releasedJob, finished_state: null });
    });
  });

  it("two apps with different retentions share one database: neither's prune_keys, with any argument, releases the other's keys early", async () => {
    await inRollback(db.pool, async (c) => {
      // App A keeps keys 1 day, app B 30 days; each key finished just inside
      // or just outside its own retention.
      const keys = { aInside: unique("a"), aOutside: unique("a"), bInside: unique("b"), bOutside: unique("b") };
      const finished: Record<string, string> = {
        aInside: "-1 day +1 millisecond",
        aOutside: "-1 day -1 millisecond",
        bInside: "-30 days +1 millisecond",
        bOutside: "-30 days -1 millisecond",
      };
      for (const [name, key] of Object.entries(keys)) {
        const retention = name.startsWith("a") ? "1 day" : "30 days";
        const id = await jobIn(c, "succeeded", { task: "t", idempotency_key: key, key_retention: retention });
        await finishedAgo(c, id, finished[name]!);
      }
      const held = async () => {
        const out: string[] = [];
        for (const [name, key] of Object.entries(keys)) if (await keyRow(c, key)) out.push(name);
        return out;
      };
      // Any argument (the default of 14 days, 1 day, 1 second, 0), each under a
      // savepoint (rolled back): inside its own retention no key is ever released.
      for (const olderThan of [undefined, "1 day", "1 second", "0"]) {
        await underSavepoint(c, async () => {
          await pruneKeys(c, olderThan);
          const kept = await held();
          expect(kept, `prune_keys(${olderThan ?? ""})`).toEqual(expect.arrayContaining(["aInside", "bInside"]));
          // Past its own retention a key goes once older_than has passed too (the default 14 days keeps A's).
          expect(kept.includes("aOutside"), `prune_keys(${olderThan ?? ""})`).toBe(olderThan === undefined);
          expect(kept.includes("bOutside"), `prune_keys(${olderThan ?? ""})`).toBe(false);
        });
      }
      // A long floor keeps even B's expired key: older_than can only lengthen.
      expect(await pruneKeys(c, "31 days")).toBe(0);
      expect(await held()).toEqual(["aInside", "aOutside", "bInside", "bOutside"]);
      expect(await pruneKeys(c, "0")).toBe(2);
      expect(await held()).toEqual(["aInside", "bInside"]);
    });
  });

  it("key_retention must not be negative nor over duration_days: 22023 for enqueue and for an enqueue_many element; nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const { rows } = await c.query<{ d: string }>("SELECT value AS d FROM idemq.settings WHERE name = 'duration_days'");
      const days = Number(rows[0]!.d);
      await enqueue(c, { task: "t", idempotency_key: unique("k"), key_retention: `${days} days` });
      await enqueue(c, { task: "t", idempotency_key: unique("k"), key_retention: "0" });
      const before = await count(c, "SELECT 1 FROM idemq.keys");
      for (const [value, message] of [
        ["-1 second", /key_retention must not be negative/],
        [`${days} days 1 second`, /key_retention must be at most 36500 days \(duration_days\)/],
      ] as const) {
        const single = await expectSqlError(
          underSavepoint(c, () => enqueue(c, { task: "t", idempotency_key: unique("k"), key_retention: value })),
          { code: "22023", message },
        );
        expect(single.hint).toMatch(/nothing was enqueued/);
        await expectSqlError(
          underSavepoint(c, () =>
            c.query("SELECT * FROM idemq.enqueue_many($1::jsonb)", [
              JSON.stringify([{ task: "t" }, { task: "t", idempotency_key: unique("k"), key_retention: value }]),
            ]),
          ),
          { code: "22023", message: new RegExp(`^jobs\\[2\\] ${message.source}`) },
        );
      }
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT * FROM idemq.enqueue_many($1::jsonb)", ['[{"task": "t", "key_retention": 5}]'])),
        { code: "22023", message: /^jobs\[1\] key_retention must be an interval string/ },
      );
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT * FROM idemq.enqueue_many($1::jsonb)", ['[{"task": "t", "key_retention": "soon"}]'])),
        { code: "22023", message: /^jobs\[1\] .*not an interval/ },
      );
      await expectSqlError(underSavepoint(c, () => enqueue(c, { task: "t", key_retention: sql("NULL") })), { code: "22004", message: /key_retention/ });
      expect(await count(c, "SELECT 1 FROM idemq.keys")).toBe(before);
    });
  });
});

describe("prune_keys and enqueue, concurrently", () => {
  let a: pg.Client;
  let b: pg.Client;
  beforeAll(async () => {
    a = await db.newClient();
    b = await db.newClient();
  });

  it("a key being taken over by an open enqueue is skipped by prune_keys, which does not wait", async () => {
    const key = unique("k");
    const old = await jobIn(db.pool, "failed", { task: "t", idempotency_key: key });
    await finishedAgo(db.pool, old, "-30 days");
    await a.query("BEGIN");
    const taken = await enqueue(a, { task: "t", idempotency_key: key });
    expect(taken.deduplicated).toBe(false);
    try {
      expect(await pruneKeys(b)).toBe(0);
    } finally {
      await a.query("COMMIT");
    }
    expect(await keyRow(db.pool, key)).toMatchObject({ job_id: taken.job_id, finished_state: null });
  });

  it("an enqueue of a key that an open prune_keys deleted waits for it, then makes a new job", async () => {
    const key = unique("k");
    const old = await jobIn(db.pool, "succeeded", { task: "t", idempotency_key: key });
    await finishedAgo(db.pool, old, "-30 days");
    const run = await interleave(db.pool, {
      first: a,
      holds: async (c) => expect(await pruneKeys(c)).toBeGreaterThanOrEqual(1),
      second: b,
      blocks: (c) => enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_always" }),
      end: "COMMIT",
    });
    expect(run.blockers).toContain(run.firstPid);
    const fresh = await run.second;
    expect(fresh.deduplicated).toBe(false);
    expect(fresh.job_id).not.toBe(old);
    expect(await keyRow(db.pool, key)).toMatchObject({ job_id: fresh.job_id });
  });

  it("an enqueue of a key that an open prune_keys deleted, then rolled back, follows the policy (IQ409)", async () => {
    const key = unique("k");
    const old = await jobIn(db.pool, "succeeded", { task: "t", idempotency_key: key });
    await finishedAgo(db.pool, old, "-30 days");
    const run = await interleave(db.pool, {
      first: a,
      holds: async (c) => expect(await pruneKeys(c)).toBeGreaterThanOrEqual(1),
      second: b,
      blocks: (c) =>
        enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_always" }).then(
          () => undefined,
          (error: unknown) => error,
        ),
      end: "ROLLBACK",
    });
    const error = (await run.second) as { code?: string; detail?: string } | undefined;
    expect(error?.code).toBe("IQ409");
    expect(JSON.parse(error?.detail ?? "{}")).toMatchObject({ key, existing_job_id: Number(old) });
  });
});
