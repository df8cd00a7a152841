// idemq.enqueue_many: one (ordinal, job_id, outcome) row per element, in order;
// duplicates within a batch (the first element with a key decides); bulk sizes
// in one call; all-or-nothing validation; counters behind stats().
import { describe, expect, it } from "vitest";
import type pg from "pg";
import { createHash } from "node:crypto";
import { expectSqlError, useTestDatabase, inRollback, type PgError } from "../helpers/db.ts";
import { count, enqueue, enqueueMany, jobRow, keyRow, Listener, type ManyRow, unique } from "../helpers/jobs.ts";
import { jobIn } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const md5 = (text: string) => createHash("md5").update(text).digest("hex");

const db = useTestDatabase();

async function snapshotCounts(c: pg.ClientBase): Promise<number[]> {
  const { rows } = await c.query<{ jobs: string; keys: string; counters: string; deps: string }>(
    `SELECT (SELECT count(*) FROM idemq.jobs) AS jobs, (SELECT count(*) FROM idemq.keys) AS keys,
            (SELECT coalesce(sum(n), 0) FROM idemq.counters) AS counters,
            (SELECT count(*) FROM idemq.job_dependencies) AS deps`,
  );
  const r = rows[0]!;
  return [r.jobs, r.keys, r.counters, r.deps].map(Number);
}

describe("outcomes", () => {
  it("returns created, deduplicated, rejected and conflict per element, in order, with the job each refers to", async () => {
    await inRollback(db.pool, async (c) => {
      const [active, done, other] = [unique("k"), unique("k"), unique("k")];
      const activeJob = await jobIn(c, "enqueued", { task: "t", payload: { n: 1 }, idempotency_key: active });
      const doneJob = await jobIn(c, "succeeded", { task: "t", payload: { n: 2 }, idempotency_key: done });
      const otherJob = await jobIn(c, "processing", { task: "t", payload: { n: 3 }, idempotency_key: other });

      const rows = await enqueueMany(c, [
        { task: "t", payload: { n: 0 } },
        { task: "t", payload: { n: 1 }, idempotency_key: active },
        { task: "t", payload: { n: 2 }, idempotency_key: done, duplicate_policy: "reject_if_succeeded" },
        { task: "t", payload: { n: 99 }, idempotency_key: other },
        { task: "t", payload: { n: 4 }, idempotency_key: unique("k") },
      ]);
      expect(rows.map((r) => [r.ordinal, r.outcome])).toEqual([
        [1, "created"],
        [2, "deduplicated"],
        [3, "rejected"],
        [4, "conflict"],
        [5, "created"],
      ]);
      expect(rows[1]!.job_id).toBe(activeJob);
      expect(rows[2]!.job_id).toBe(doneJob);
      expect(rows[3]!.job_id).toBe(otherJob);
      expect(await jobRow(c, rows[0]!.job_id!)).toMatchObject({ payload: { n: 0 }, state: "enqueued" });
      expect(await jobRow(c, rows[4]!.job_id!)).toMatchObject({ payload: { n: 4 }, state: "enqueued" });
      // Rejected and conflicting elements wrote no job; the others' jobs are untouched.
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE payload IN ('{\"n\": 99}')")).toBe(0);
      expect((await jobRow(c, doneJob)).state).toBe("succeeded");
      expect((await jobRow(c, otherJob)).state).toBe("processing");
    });
  });

  it("an empty array enqueues nothing and returns no rows", async () => {
    await inRollback(db.pool, async (c) => {
      const before = await snapshotCounts(c);
      expect(await enqueueMany(c, [])).toEqual([]);
      expect(await snapshotCounts(c)).toEqual(before);
    });
  });

  it("elements get enqueue()'s defaults, and their own fields when given", async () => {
    await inRollback(db.pool, async (c) => {
      const [plain, full] = await enqueueMany(c, [
        { task: "plain" },
        {
          task: "full",
          payload: { a: 1 },
          queue: "q1",
          run_at: "2100-01-01T00:00:00Z",
          priority: 5,
          max_attempts: 2,
          backoff: { kind: "exponential", initial: "1 second" },
          expires_at: "2100-02-01T00:00:00Z",
        },
      ]);
      expect(await jobRow(c, plain!.job_id!)).toMatchObject({
        queue: "default",
        priority: 0,
        max_attempts: 10,
        payload: {},
        state: "enqueued",
        backoff: null,
        expires_at: null,
      });
      expect(await jobRow(c, full!.job_id!)).toMatchObject({
        queue: "q1",
        priority: 5,
        max_attempts: 2,
        payload: { a: 1 },
        state: "scheduled",
        run_at: new Date("2100-01-01T00:00:00Z"),
        expires_at: new Date("2100-02-01T00:00:00Z"),
        backoff: { kind: "exponential", initial: "1 second" },
      });
    });
  });

  it("an element with after waits for its parent like enqueue()", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await enqueue(c, { task: "p" });
      const [child] = await enqueueMany(c, [{ task: "c", after: [Number(parent.job_id)] }]);
      expect(child!.outcome).toBe("created");
      expect((await jobRow(c, child!.job_id!)).state).toBe("awaiting");
    });
  });
});

describe("duplicates within one batch: the first element with a key decides", () => {
  it("the same work twice: created, then deduplicated against that job", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const rows = await enqueueMany(c, [
        { task: "t", payload: { a: 1, b: 2 }, idempotency_key: key },
        { task: "t", payload: { b: 2, a: 1 }, idempotency_key: key },
      ]);
      expect(rows.map((r) => r.outcome)).toEqual(["created", "deduplicated"]);
      expect(rows[1]!.job_id).toBe(rows[0]!.job_id);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE idempotency_key = $1", [key])).toBe(1);
    });
  });

  it("a later element with different work is a conflict with the first element's job", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const rows = await enqueueMany(c, [
        { task: "t", payload: { a: 1 }, idempotency_key: key },
        { task: "t", payload: { a: 2 }, idempotency_key: key },
        { task: "u", payload: { a: 1 }, idempotency_key: key },
      ]);
      expect(rows.map((r) => r.outcome)).toEqual(["created", "conflict", "conflict"]);
      expect(rows.map((r) => r.job_id)).toEqual(Array(3).fill(rows[0]!.job_id));
      expect((await jobRow(c, rows[0]!.job_id!)).payload).toEqual({ a: 1 });
    });
  });

  it("a first element refused by its policy makes later elements with the key rejected too, whatever their policy", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const old = await jobIn(c, "failed", { task: "t", idempotency_key: key });
      const rows = await enqueueMany(c, [
        { task: "t", idempotency_key: key, duplicate_policy: "reject_if_failed" },
        { task: "t", idempotency_key: key, duplicate_policy: "allow_after_failed" },
      ]);
      expect(rows.map((r) => [r.outcome, r.job_id])).toEqual([
        ["rejected", old],
        ["rejected", old],
      ]);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE idempotency_key = $1", [key])).toBe(1);
    });
  });

  it("a first element allowed by its policy takes the key; a later rejecting element is deduplicated against the new job", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const old = await jobIn(c, "failed", { task: "t", idempotency_key: key });
      const rows = await enqueueMany(c, [
        { task: "t", idempotency_key: key, duplicate_policy: "allow_after_failed" },
        { task: "t", idempotency_key: key, duplicate_policy: "reject_always" },
      ]);
      expect(rows.map((r) => r.outcome)).toEqual(["created", "deduplicated"]);
      expect(rows[0]!.job_id).not.toBe(old);
      expect(rows[1]!.job_id).toBe(rows[0]!.job_id);
    });
  });

  it("later elements whose payload differs in text but is equal as jsonb (1 and 1.0) are deduplicated, against a new or an existing job", async () => {
    await inRollback(db.pool, async (c) => {
      const [fresh, held] = [unique("k"), unique("k")];
      const existing = await jobIn(c, "enqueued", { task: "t", payload: { n: 2 }, idempotency_key: held });
      // Raw JSON text: JSON.stringify would print 1.0 as 1.
      const { rows } = await c.query<{ job_id: string; outcome: string }>(
        `SELECT job_id, outcome FROM idemq.enqueue_many($1::jsonb) ORDER BY ordinal`,
        [
          `[{"task": "t", "payload": {"n": 1}, "idempotency_key": "${fresh}"},
            {"task": "t", "payload": {"n": 1.0}, "idempotency_key": "${fresh}"},
            {"task": "t", "payload": {"n": 2.00}, "idempotency_key": "${held}"},
            {"task": "t", "payload": {"n": 2e0}, "idempotency_key": "${held}"},
            {"task": "t", "payload": {"n": 3}, "idempotency_key": "${held}"}]`,
        ],
      );
      const created = rows[0]!.job_id;
      expect(rows.map((r) => [r.outcome, r.job_id])).toEqual([
        ["created", created],
        ["deduplicated", created],
        ["deduplicated", existing],
        ["deduplicated", existing],
        ["conflict", existing],
      ]);
    });
  });

  it("after a first element's conflict with an active job, a later element matching that job is deduplicated against it", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const active = await jobIn(c, "enqueued", { task: "t", payload: { v: 1 }, idempotency_key: key });
      const rows = await enqueueMany(c, [
        { task: "t", payload: { v: 2 }, idempotency_key: key },
        { task: "t", payload: { v: 1 }, idempotency_key: key },
      ]);
      expect(rows.map((r) => [r.outcome, r.job_id])).toEqual([
        ["conflict", active],
        ["deduplicated", active],
      ]);
    });
  });
});

describe("bulk", () => {
  it("20,000 unkeyed jobs in one call are all created", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("bulk");
      const jobs = Array.from({ length: 20_000 }, (_, i) => ({ task: "bulk", queue, payload: { i } }));
      const rows = await enqueueMany(c, jobs);
      expect(rows).toHaveLength(20_000);
      expect(rows.every((r, i) => r.ordinal === i + 1 && r.outcome === "created")).toBe(true);
      expect(new Set(rows.map((r) => r.job_id)).size).toBe(20_000);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE queue = $1 AND state = 'enqueued'", [queue])).toBe(20_000);
      // Each element's job carries that element's payload.
      const { rows: sample } = await c.query<{ id: string; i: number }>(
        "SELECT id::text, (payload->>'i')::int AS i FROM idemq.jobs WHERE id = ANY($1::bigint[])",
        [[rows[0]!.job_id, rows[12_345]!.job_id, rows[19_999]!.job_id]],
      );
      expect(new Map(sample.map((s) => [s.id, s.i]))).toEqual(
        new Map([
          [rows[0]!.job_id, 0],
          [rows[12_345]!.job_id, 12_345],
          [rows[19_999]!.job_id, 19_999],
        ]),
      );
    });
  });

  it("5,000 keyed jobs in one call are created, and the same call again deduplicates all 5,000", async () => {
    await inRollback(db.pool, async (c) => {
      const prefix = unique("bk");
      const jobs = Array.from({ length: 5_000 }, (_, i) => ({
        task: "bulk_keyed",
        payload: { i },
        idempotency_key: `${prefix}-${i}`,
      }));
      const first = await enqueueMany(c, jobs);
      expect(first).toHaveLength(5_000);
      expect(first.every((r) => r.outcome === "created")).toBe(true);
      expect(await count(c, "SELECT 1 FROM idemq.keys WHERE starts_with(key, $1)", [prefix])).toBe(5_000);

      const again = await enqueueMany(c, jobs);
      expect(again.every((r) => r.outcome === "deduplicated")).toBe(true);
      expect(again.map((r) => r.job_id)).toEqual(first.map((r) => r.job_id));
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE task = 'bulk_keyed'")).toBe(5_000);
    });
  });
});

describe("all or nothing", () => {
  it("a bad element (empty task) raises 22023 naming jobs[N], and nothing is written", async () => {
    await inRollback(db.pool, async (c) => {
      const before = await snapshotCounts(c);
      await expectSqlError(
        underSavepoint(c, () =>
          enqueueMany(c, [
            { task: "ok", idempotency_key: unique("k") },
            { task: "ok" },
            { task: "" },
            { task: "ok" },
          ]),
        ),
        { code: "22023", message: /^jobs\[3\] /, hint: /element 3/ },
      );
      expect(await snapshotCounts(c)).toEqual(before);
    });
  });

  it("a timestamp that does not parse raises 22023 naming its element, and nothing is written", async () => {
    await inRollback(db.pool, async (c) => {
      const before = await snapshotCounts(c);
      await expectSqlError(
        underSavepoint(c, () => enqueueMany(c, [{ task: "ok" }, { task: "ok", run_at: "next tuesday-ish" }])),
        { code: "22023", message: /^jobs\[2\] run_at\/expires_at/ },
      );
      expect(await snapshotCounts(c)).toEqual(before);
    });
  });

  it("an unknown parent in after raises IQ404 after other elements were resolved, and nothing is written", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await enqueue(c, { task: "p" });
      const before = await snapshotCounts(c);
      await expectSqlError(
        underSavepoint(c, () =>
          enqueueMany(c, [
            { task: "ok", idempotency_key: unique("k") },
            { task: "ok", after: [Number(parent.job_id)] },
            { task: "ok", after: [Number(parent.job_id), 999_999_999] },
          ]),
        ),
        { code: "IQ404", message: /999999999/ },
      );
      expect(await snapshotCounts(c)).toEqual(before);
    });
  });
});

// One pipeline takes every batch (there is no fast path left to disagree
// with a validating one): an element's outcome, job and error must not depend
// on what else the batch holds. Each case runs twice: as is, and with a last
// element `after: []` (no parents; it once sent a batch down another path).
// Job ids follow element order in both: the probes' keys sort the other way
// (PROBE_Z, then PROBE_A), so numbering in key order would show. Elements the
// old fast path handed over but that are valid (1.0 as an int) are accepted
// like the others.
describe("one path: an element is decided alike whatever else the batch holds", () => {
  interface Ran {
    outcomes?: Array<[string, Record<string, unknown> | null]>;
    error?: { code?: string; message: string; hint?: string };
    inElementOrder?: boolean;
  }

  /** Runs the raw JSON batch under a savepoint (rolled back): outcomes with each job's columns, or the error. */
  async function run(c: pg.ClientBase, batch: string, probes: [string, string]): Promise<Ran> {
    try {
      return await underSavepoint(c, async () => {
        // The raw text: JSON.parse would turn 1.0 into 1.
        const { rows: made } = await c.query<ManyRow>("SELECT * FROM idemq.enqueue_many($1::jsonb) ORDER BY ordinal", [batch]);
        // A second statement: the first one's snapshot does not see its own jobs.
        const { rows } = await c.query<{ id: string; row: Record<string, unknown> }>(
          "SELECT j.id::text, to_jsonb(j) - 'id' - 'created_at' AS row FROM idemq.jobs j WHERE j.id = ANY($1::bigint[])",
          [made.map((m) => m.job_id)],
        );
        const byId = new Map(rows.map((r) => [r.id, r.row]));
        const id = (key: string) => BigInt(rows.find((r) => r.row.idempotency_key === key)!.id);
        return {
          outcomes: made.map((m) => [m.outcome, byId.get(m.job_id!) ?? null]),
          inElementOrder: id(probes[0]) < id(probes[1]),
        };
      });
    } catch (error) {
      const e = error as PgError;
      return { error: { code: e.code, message: e.message, hint: e.hint } };
    }
  }

  // Valid elements (among them those the old fast path took), and elements it
  // handed over: valid ones it could not parse (1.0 as an int), then invalid ones.
  const TAKEN = [
    `{"task": "t"}`,
    `{"task": "t", "payload": null, "queue": null, "run_at": null, "priority": null, "max_attempts": null,
      "idempotency_key": null, "duplicate_policy": null, "backoff": null, "expires_at": null, "after": null}`,
    `{"task": "t", "payload": {"a": [1, {"b": null}]}, "queue": "q", "run_at": "2100-01-01T00:00:00Z",
      "priority": -5, "max_attempts": 3, "duplicate_policy": "reject_always",
      "expires_at": "2101-01-01T00:00:00+02:00"}`,
    `{"task": "t", "priority": 1e2, "max_attempts": 2147483647}`,
    `{"task": "t", "run_at": "2000-01-01 00:00:00Z"}`,
    `{"task": "t", "backoff": {"kind": "fixed", "delays": ["1 second"]}}`,
    `{"task": "t", "idempotency_key": "K1"}`,
  ];
  const HANDED_OVER_VALID = [`{"task": "t", "priority": 1.0}`, `{"task": "t", "max_attempts": 2.00}`];
  const HANDED_OVER = [
    `{"task": 7}`,
    `{"task": ""}`,
    `{"task": null}`,
    `{"payload": {}}`,
    `{"task": "t", "priorty": 1}`,
    `{"task": "t", "payload": [1]}`,
    `{"task": "t", "payload": "x"}`,
    `{"task": "t", "queue": ""}`,
    `{"task": "t", "queue": 5}`,
    `{"task": "t", "queue": "${"q".repeat(1001)}"}`,
    `{"task": "t", "run_at": 20261201}`,
    `{"task": "t", "run_at": "next tuesday-ish"}`,
    `{"task": "t", "expires_at": true}`,
    `{"task": "t", "expires_at": "soon"}`,
    `{"task": "t", "priority": "5"}`,
    `{"task": "t", "priority": 1.5}`,
    `{"task": "t", "priority": 3000000000}`,
    `{"task": "t", "max_attempts": 0}`,
    `{"task": "t", "max_attempts": "3"}`,
    `{"task": "t", "idempotency_key": ""}`,
    `{"task": "t", "idempotency_key": 5}`,
    `{"task": "t", "idempotency_key": ["K2"]}`,
    `{"task": "t", "duplicate_policy": "reject_never"}`,
    `{"task": "t", "duplicate_policy": 5}`,
    `{"task": "t", "backoff": {"kind": "fixed"}}`,
    `{"task": "t", "backoff": "fast"}`,
    `{"task": "t", "after": 5}`,
    `5`,
    `"t"`,
    `null`,
    `[{"task": "t"}]`,
  ];

  const short = (e: string) => (e.length > 70 ? `${e.slice(0, 67)}...` : e);
  it.each([
    ...TAKEN.map((e) => [short(e), true, e] as const),
    ...HANDED_OVER_VALID.map((e) => [short(e), true, e] as const),
    ...HANDED_OVER.map((e) => [short(e), false, e] as const),
  ])(
    "element %s after good keyed and unkeyed ones (valid: %s)",
    async (_label, valid, element) => {
      await inRollback(db.pool, async (c) => {
        const probes: [string, string] = [unique("z-probe"), unique("a-probe")];
        const head = `{"task": "t", "idempotency_key": "${unique("k")}"}, {"task": "t", "payload": {"n": 1}}`;
        const tail = (after: string) =>
          `{"task": "t", "idempotency_key": "${probes[0]}"}, {"task": "t", "idempotency_key": "${probes[1]}"${after}}`;
        const plain = await run(c, `[${head}, ${element}, ${tail("")}]`, probes);
        const withAfter = await run(c, `[${head}, ${element}, ${tail(`, "after": []`)}]`, probes);
        expect(plain.outcomes).toEqual(withAfter.outcomes);
        expect(plain.error).toEqual(withAfter.error);
        if (withAfter.error) expect(withAfter.error.message).toMatch(/^jobs\[3\] /);
        expect(plain.error === undefined).toBe(valid);
        for (const ran of [plain, withAfter]) expect(ran.inElementOrder ?? valid).toBe(valid);
        if (valid) expect(plain.outcomes?.map(([outcome]) => outcome)).toEqual(["created", "created", "created", "created", "created"]);
      });
    },
  );

  it("a key that exists, after new ones, hands the batch over: outcomes as usual, and the new keys written once", async () => {
    await inRollback(db.pool, async (c) => {
      const [a, held, b] = [unique("k"), unique("k"), unique("k")];
      const active = await jobIn(c, "enqueued", { task: "t", idempotency_key: held });
      const rows = await enqueueMany(c, [
        { task: "t", idempotency_key: a },
        { task: "t", idempotency_key: held },
        { task: "t", payload: { other: 1 }, idempotency_key: held },
        { task: "t" },
        { task: "t", idempotency_key: b },
      ]);
      expect(rows.map((r) => r.outcome)).toEqual(["created", "deduplicated", "conflict", "created", "created"]);
      expect(rows[1]!.job_id).toBe(active);
      expect(await count(c, "SELECT 1 FROM idemq.keys WHERE key = ANY($1)", [[a, held, b]])).toBe(3);
      for (const r of [rows[0]!, rows[4]!]) {
        expect(await keyRow(c, (await jobRow(c, r.job_id!)).idempotency_key!)).toMatchObject({ job_id: r.job_id });
      }
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE idempotency_key = ANY($1)", [[a, held, b]])).toBe(3);
    });
  });

  it("a batch mixing keyed and unkeyed jobs, with a key repeated, on the fast path: outcomes, key rows and counters", async () => {
    await inRollback(db.pool, async (c) => {
      const task = unique("task");
      const [k1, k2] = [unique("k"), unique("k")];
      const rows = await enqueueMany(c, [
        { task, payload: { n: 1 }, idempotency_key: k1 },
        { task, payload: { n: 2 } },
        { task, payload: { n: 1 }, idempotency_key: k1 },
        { task, payload: { n: 3 }, idempotency_key: k2, run_at: "2100-01-01T00:00:00Z" },
        { task, payload: { n: 9 }, idempotency_key: k1 },
        { task, payload: { n: 2 } },
      ]);
      expect(rows.map((r) => r.outcome)).toEqual(["created", "created", "deduplicated", "created", "conflict", "created"]);
      const ids = rows.map((r) => r.job_id);
      expect([ids[2], ids[4]]).toEqual([ids[0], ids[0]]);
      expect(new Set([ids[0], ids[1], ids[3], ids[5]]).size).toBe(4);
      expect(await jobRow(c, ids[0]!)).toMatchObject({ payload: { n: 1 }, idempotency_key: k1, state: "enqueued" });
      expect(await jobRow(c, ids[1]!)).toMatchObject({ payload: { n: 2 }, idempotency_key: null });
      expect(await jobRow(c, ids[3]!)).toMatchObject({ payload: { n: 3 }, idempotency_key: k2, state: "scheduled" });
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE task = $1", [task])).toBe(4);
      const { rows: keys } = await c.query(
        "SELECT key, job_id::text, task, payload_md5, finished_state FROM idemq.keys WHERE key = ANY($1) ORDER BY key",
        [[k1, k2]],
      );
      expect(keys).toEqual(
        [
          { key: k1, job_id: ids[0], task, payload_md5: md5('{"n": 1}'), finished_state: null },
          { key: k2, job_id: ids[3], task, payload_md5: md5('{"n": 3}'), finished_state: null },
        ].sort((x, y) => (x.key < y.key ? -1 : 1)),
      );
      const { rows: counted } = await c.query(
        "SELECT event, sum(n)::int AS n FROM idemq.counters WHERE task = $1 GROUP BY event ORDER BY event",
        [task],
      );
      expect(counted).toEqual([
        { event: "conflict", n: 1 },
        { event: "deduplicated", n: 1 },
      ]);
    });
  });
});

describe("batches of 64 elements or more: new keys by a plain INSERT first (_resolve_keys)", () => {
  const filler = (prefix: string, n: number) =>
    Array.from({ length: n }, (_, i) => ({ task: "t", payload: { i }, idempotency_key: `${prefix}-${i}` }));

  it("a key that exists in the middle of the batch rolls the attempt back: outcomes as usual, every new key written once", async () => {
    await inRollback(db.pool, async (c) => {
      const prefix = unique("pf");
      const held = `${prefix}-m`;
      const active = await jobIn(c, "enqueued", { task: "t", idempotency_key: held });
      const jobs = [
        ...filler(prefix, 40),
        { task: "t", idempotency_key: held },
        { task: "t", payload: { other: 1 }, idempotency_key: held },
        { task: "t" },
        ...filler(`${prefix}-z`, 40),
      ];
      const rows = await enqueueMany(c, jobs);
      expect(rows.map((r) => r.outcome)).toEqual([
        ...Array(40).fill("created"),
        "deduplicated",
        "conflict",
        "created",
        ...Array(40).fill("created"),
      ]);
      expect(rows[40]!.job_id).toBe(active);
      expect(await count(c, "SELECT 1 FROM idemq.keys WHERE starts_with(key, $1)", [prefix])).toBe(81);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE starts_with(idempotency_key, $1)", [prefix])).toBe(81);
      const { rows: keyed } = await c.query<{ n: string }>(
        `SELECT count(*) AS n FROM idemq.keys k JOIN idemq.jobs j ON j.id = k.job_id AND j.idempotency_key = k.key
         WHERE starts_with(k.key, $1)`,
        [prefix],
      );
      expect(Number(keyed[0]!.n)).toBe(81);
    });
  });

  it("a first key that exists (the batch sent again) deduplicates every element", async () => {
    await inRollback(db.pool, async (c) => {
      const jobs = filler(unique("again"), 100);
      const first = await enqueueMany(c, jobs);
      const again = await enqueueMany(c, jobs);
      expect(again.map((r) => r.outcome)).toEqual(Array(100).fill("deduplicated"));
      expect(again.map((r) => r.job_id)).toEqual(first.map((r) => r.job_id));
    });
  });

  it("keys repeated within an all-new batch: the leaders are created, later elements deduplicated or in conflict, and counted", async () => {
    await inRollback(db.pool, async (c) => {
      const task = unique("task");
      const prefix = unique("rep");
      const jobs = [
        ...filler(prefix, 70).map((j) => ({ ...j, task })),
        { task, payload: { i: 3 }, idempotency_key: `${prefix}-3` },
        { task, payload: { i: 999 }, idempotency_key: `${prefix}-4` },
      ];
      const rows = await enqueueMany(c, jobs);
      expect(rows.map((r) => r.outcome)).toEqual([...Array(70).fill("created"), "deduplicated", "conflict"]);
      expect([rows[70]!.job_id, rows[71]!.job_id]).toEqual([rows[3]!.job_id, rows[4]!.job_id]);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE task = $1", [task])).toBe(70);
      const { rows: counted } = await c.query(
        "SELECT event, sum(n)::int AS n FROM idemq.counters WHERE task = $1 GROUP BY event ORDER BY event",
        [task],
      );
      expect(counted).toEqual([
        { event: "conflict", n: 1 },
        { event: "deduplicated", n: 1 },
      ]);
    });
  });
});

describe("NOTIFY idemq_jobs", () => {
  it("once per queue with a job runnable now, at commit, whichever path ran", async () => {
    const listener = await Listener.start(await db.newClient());
    const sender = await db.newClient();
    try {
      const [q1, q2, later] = [unique("q"), unique("q"), unique("q")];
      const held = unique("k");
      await jobIn(sender, "enqueued", { task: "t", idempotency_key: held });
      for (const handOver of [false, true]) {
        await sender.query("BEGIN");
        await enqueueMany(sender, [
          { task: "t", queue: q1 },
          { task: "t", queue: q2, idempotency_key: unique("k") },
          { task: "t", queue: q1, idempotency_key: unique("k") },
          { task: "t", queue: later, run_at: "2100-01-01T00:00:00Z" },
          // A key that exists, last: the fast path fails on it and rolls back.
          ...(handOver ? [{ task: "t", queue: q2, idempotency_key: held }] : []),
        ]);
        await listener.sync(db.pool);
        expect(listener.payloads().filter((p) => [q1, q2, later].includes(p))).toEqual([]);
        await sender.query("COMMIT");
        await listener.sync(sender);
        expect(listener.payloads().filter((p) => [q1, q2, later].includes(p)).sort()).toEqual([q1, q2].sort());
        listener.received.length = 0;
      }
    } finally {
      await listener.stop();
      await sender.end();
    }
  });
});

describe("counters for stats()", () => {
  it("counts deduplicated, rejected and conflict outcomes per task, created ones not", async () => {
    await inRollback(db.pool, async (c) => {
      const [taskA, taskB] = [unique("task"), unique("task")];
      const [ka, kb, kdone] = [unique("k"), unique("k"), unique("k")];
      await jobIn(c, "failed", { task: taskB, idempotency_key: kdone });
      await enqueueMany(c, [
        { task: taskA, payload: { x: 1 }, idempotency_key: ka }, // created
        { task: taskA, payload: { x: 1 }, idempotency_key: ka }, // deduplicated
        { task: taskA, payload: { x: 1 }, idempotency_key: ka }, // deduplicated
        { task: taskA, payload: { x: 2 }, idempotency_key: ka }, // conflict
        { task: taskB, idempotency_key: kb }, // created
        { task: taskB, idempotency_key: kdone, duplicate_policy: "reject_if_failed" }, // rejected
        { task: taskB, idempotency_key: kb }, // deduplicated
      ]);
      // A single enqueue's deduplication counts too.
      await enqueue(c, { task: taskB, idempotency_key: kb });

      const { rows } = await c.query<{ task: string; metric: string; value: string }>(
        "SELECT task, metric, value FROM idemq.stats() WHERE queue IS NULL AND task = ANY($1) ORDER BY task, metric",
        [[taskA, taskB]],
      );
      const got = rows.map((r) => [r.task, r.metric, Number(r.value)]);
      expect(got).toEqual(
        [
          [taskA, "conflict", 1],
          [taskA, "deduplicated", 2],
          [taskB, "deduplicated", 2],
          [taskB, "rejected", 1],
        ].sort((x, y) => String(x[0]).localeCompare(String(y[0])) || String(x[1]).localeCompare(String(y[1]))),
      );
    });
  });

  it("a rejection raised by enqueue() rolls back with the statement and is not counted", async () => {
    await inRollback(db.pool, async (c) => {
      const task = unique("task");
      const key = unique("k");
      await jobIn(c, "succeeded", { task, idempotency_key: key });
      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task, idempotency_key: key, duplicate_policy: "reject_always" })),
        { code: "IQ409" },
      );
      expect(await count(c, "SELECT 1 FROM idemq.counters WHERE task = $1", [task])).toBe(0);
    });
  });
});
