// idemq.enqueue: a new job without a key, the defaults of its signature, what it
// returns, an expires_at already past, and NOTIFY idemq_jobs at commit only for
// jobs runnable now (an outbox: nothing is sent for a rolled-back enqueue).
import type pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { count, enqueue, enqueueMany, jobRow, Listener, unique } from "../helpers/jobs.ts";
import { driveTo } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

describe("enqueue: new jobs", () => {
  it("without a key, the same task and payload always make a new job", async () => {
    await inRollback(db.pool, async (c) => {
      const ids = new Set<string>();
      for (let i = 0; i < 3; i++) {
        const r = await enqueue(c, { task: "no_key", payload: { order: 1 } });
        expect(r.deduplicated).toBe(false);
        ids.add(r.job_id);
      }
      expect(ids.size).toBe(3);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE task = 'no_key'")).toBe(3);
      expect(await count(c, "SELECT 1 FROM idemq.keys")).toBe(0);
    });
  });

  it("returns exactly the columns (job_id, deduplicated, job_traceparent); the id is the job's, deduplicated false when created", async () => {
    await inRollback(db.pool, async (c) => {
      const { rows, fields } = await c.query("SELECT * FROM idemq.enqueue(task => 'ret')");
      expect(fields.map((f) => f.name)).toEqual(["job_id", "deduplicated", "job_traceparent"]);
      expect(rows[0].job_traceparent).toBeNull();
      expect(rows).toHaveLength(1);
      expect(rows[0].deduplicated).toBe(false);
      expect((await jobRow(c, rows[0].job_id)).task).toBe("ret");

      const key = unique("k");
      const first = await enqueue(c, { task: "ret", idempotency_key: key });
      const again = await enqueue(c, { task: "ret", idempotency_key: key });
      expect(first.deduplicated).toBe(false);
      expect(again).toEqual({ job_id: first.job_id, deduplicated: true });
    });
  });

  it("applies the defaults: queue default, priority 0, max_attempts 10, payload {}, run_at now, state enqueued", async () => {
    await inRollback(db.pool, async (c) => {
      const { job_id } = await enqueue(c, { task: "defaults" });
      const row = await jobRow(c, job_id);
      const { rows } = await c.query<{ now: Date }>("SELECT now() AS now");
      expect(row).toMatchObject({
        task: "defaults",
        queue: "default",
        priority: 0,
        max_attempts: 10,
        payload: {},
        state: "enqueued",
        attempt: 0,
        idempotency_key: null,
        errors: [],
        finished_at: null,
        expires_at: null,
        backoff: null,
      });
      expect(row.run_at).toEqual(rows[0]!.now);
      expect(row.created_at).toEqual(rows[0]!.now);
    });
  });

  it("a run_at in the future makes the job scheduled; run_at now or past makes it enqueued", async () => {
    await inRollback(db.pool, async (c) => {
      const future = await enqueue(c, { task: "when", run_at: new Date(Date.now() + 3_600_000) });
      const past = await enqueue(c, { task: "when", run_at: "2000-01-01T00:00:00Z" });
      expect((await jobRow(c, future.job_id)).state).toBe("scheduled");
      expect((await jobRow(c, past.job_id)).state).toBe("enqueued");
      // Just inside / just outside "now" (the transaction's now()).
      const { rows } = await c.query<{ at: string; later: string }>(
        "SELECT now()::text AS at, (now() + interval '1 microsecond')::text AS later",
      );
      const atNow = await enqueue(c, { task: "when", run_at: rows[0]!.at });
      const justLater = await enqueue(c, { task: "when", run_at: rows[0]!.later });
      expect((await jobRow(c, atNow.job_id)).state).toBe("enqueued");
      expect((await jobRow(c, justLater.job_id)).state).toBe("scheduled");
    });
  });

  it("stores task, payload, queue, priority, max_attempts, backoff and expires_at as given", async () => {
    await inRollback(db.pool, async (c) => {
      const payload = { to: "a@example.com", lines: [1, 2, { nested: true }], note: null };
      const backoff = { kind: "fixed", delays: ["2 seconds"] };
      const { job_id } = await enqueue(c, {
        task: "send_email",
        payload,
        queue: "mail",
        priority: -5,
        max_attempts: 3,
        backoff,
        expires_at: "2100-01-01T00:00:00Z",
      });
      expect(await jobRow(c, job_id)).toMatchObject({
        task: "send_email",
        payload,
        queue: "mail",
        priority: -5,
        max_attempts: 3,
        backoff,
        expires_at: new Date("2100-01-01T00:00:00Z"),
        state: "enqueued",
      });
    });
  });

  // enqueue() without a key or parents is one INSERT of its own; everything
  // else goes through the path enqueue_many uses. Both must write the same row.
  it("writes the same row as enqueue_many for the same arguments (its one-INSERT path)", async () => {
    await inRollback(db.pool, async (c) => {
      const cases = [
        { task: "same_row" },
        { task: "same_row", payload: { a: [1, 2.5, null] }, queue: "q-same", priority: 7, max_attempts: 2 },
        { task: "same_row", run_at: "2100-01-01T00:00:00Z", backoff: { kind: "exponential", initial: "1 second" } },
        { task: "same_row", run_at: "2000-01-01T00:00:00Z", expires_at: "2100-01-01T00:00:00Z", backoff: null },
      ];
      const columns = "task, queue, payload, state, priority, run_at, attempt, uncounted, max_attempts, " +
        "idempotency_key, backoff, locked_by, lease_expires_at, errors, result, finished_at, expires_at, " +
        "run_at = created_at AS runs_at_creation";
      for (const args of cases) {
        const single = await enqueue(c, args);
        const [many] = await enqueueMany(c, [args]);
        const { rows } = await c.query(`SELECT ${columns} FROM idemq.jobs WHERE id = ANY ($1::bigint[]) ORDER BY id`, [
          [single.job_id, many!.job_id],
        ]);
        expect(rows).toHaveLength(2);
        expect(rows[0]).toEqual(rows[1]);
      }
    });
  });

  it("with a new key, writes the same job and key rows as enqueue_many (its two-INSERT path)", async () => {
    await inRollback(db.pool, async (c) => {
      const args = { task: "same_key_row", payload: { n: 1.5, s: "é" }, queue: "q-key", priority: 2, max_attempts: 4 };
      const single = await enqueue(c, { ...args, idempotency_key: "parity-single" });
      const [many] = await enqueueMany(c, [{ ...args, idempotency_key: "parity-many" }]);
      expect(single.deduplicated).toBe(false);
      const { rows: jobs } = await c.query(
        "SELECT id::text, task, queue, payload, state, priority, max_attempts, attempt, errors, backoff, expires_at FROM idemq.jobs WHERE id = ANY ($1::bigint[]) ORDER BY id",
        [[single.job_id, many!.job_id]],
      );
      const [a, b] = jobs.map(({ id: _id, ...rest }) => rest);
      expect(jobs).toHaveLength(2);
      expect(a).toEqual(b);
      const { rows: keys } = await c.query(
        "SELECT key, job_id::text, task, payload_md5, finished_state FROM idemq.keys WHERE key IN ('parity-single', 'parity-many') ORDER BY key DESC",
      );
      expect(keys).toEqual([
        { key: "parity-single", job_id: single.job_id, task: "same_key_row", payload_md5: keys[1].payload_md5, finished_state: null },
        { key: "parity-many", job_id: many!.job_id, task: "same_key_row", payload_md5: keys[1].payload_md5, finished_state: null },
      ]);
      // The key now exists: the same call again is deduplicated (through the shared path).
      const again = await enqueue(c, { ...args, idempotency_key: "parity-single" });
      expect(again).toEqual({ job_id: single.job_id, deduplicated: true });
    });
  });

  it("accepts an expires_at already past: the job is created, never claimed, and rescue expires it", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      const { job_id } = await enqueue(c, { task: "late", queue, expires_at: "2000-01-01T00:00:00Z" });
      expect((await jobRow(c, job_id)).state).toBe("enqueued");
      const claimed = await c.query("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY[$1])", [queue]);
      expect(claimed.rows).toEqual([]);
      await driveTo(c, job_id, "expired");
      expect((await jobRow(c, job_id)).finished_at).not.toBeNull();
    });
  });
});

describe("enqueue: the queue name is the NOTIFY payload", () => {
  it("a queue name of 1000 characters is accepted; 1001 raises 22023 and nothing is written", async () => {
    await inRollback(db.pool, async (c) => {
      const ok = await enqueue(c, { task: "long_queue", queue: "q".repeat(1000) });
      expect((await jobRow(c, ok.job_id)).queue).toHaveLength(1000);
      // Scheduled too: the notify would come later (rescue, a parent's release), so it is refused up front.
      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "long_queue", queue: "q".repeat(1001), run_at: "2100-01-01T00:00:00Z" })),
        { code: "22023", message: /queue must be at most 1000 characters/ },
      );
      await expectSqlError(
        underSavepoint(c, () => enqueueMany(c, [{ task: "long_queue" }, { task: "long_queue", queue: "é".repeat(1001) }])),
        { code: "22023", message: /^jobs\[2\] queue must be at most 1000 characters/ },
      );
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE task = 'long_queue'")).toBe(1);
    });
  });
});

describe("enqueue: NOTIFY idemq_jobs", () => {
  let listener: Listener;
  let sender: pg.Client;
  beforeAll(async () => {
    listener = await Listener.start(await db.newClient());
    sender = await db.newClient();
  });

  it("a job runnable now notifies with its queue name, delivered at commit, not before", async () => {
    const queue = unique("q");
    await sender.query("BEGIN");
    await enqueue(sender, { task: "notify", queue });
    // Anything sent before this sentinel has arrived by the time it does.
    await listener.sync(db.pool);
    expect(listener.payloads()).not.toContain(queue);
    await sender.query("COMMIT");
    await listener.waitFor(queue);
    await listener.sync(sender);
    expect(listener.payloads().filter((p) => p === queue)).toEqual([queue]);
  });

  it("a job with a future run_at sends no notification", async () => {
    const queue = unique("q");
    const { job_id } = await enqueue(sender, { task: "notify", queue, run_at: new Date(Date.now() + 3_600_000) });
    expect((await jobRow(sender, job_id)).state).toBe("scheduled");
    await listener.sync(sender);
    expect(listener.payloads()).not.toContain(queue);
  });

  it("a rolled-back enqueue sends no notification", async () => {
    const queue = unique("q");
    await sender.query("BEGIN");
    await enqueue(sender, { task: "notify", queue });
    await sender.query("ROLLBACK");
    await listener.sync(sender);
    expect(listener.payloads()).not.toContain(queue);
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE queue = $1", [queue])).toBe(0);
  });

  it("a deduplicated enqueue sends no notification of its own", async () => {
    const queue = unique("q");
    const key = unique("k");
    await enqueue(sender, { task: "notify", queue, idempotency_key: key });
    await listener.sync(sender);
    const before = listener.payloads().filter((p) => p === queue).length;
    expect(before).toBe(1);
    const again = await enqueue(sender, { task: "notify", queue, idempotency_key: key });
    expect(again.deduplicated).toBe(true);
    await listener.sync(sender);
    expect(listener.payloads().filter((p) => p === queue)).toHaveLength(1);
  });

  it("an awaiting job (continuation) sends no notification at enqueue", async () => {
    const parentQueue = unique("q");
    const queue = unique("q");
    const parent = await enqueue(sender, { task: "parent", queue: parentQueue });
    const child = await enqueue(sender, { task: "child", queue, after: [parent.job_id] });
    expect((await jobRow(sender, child.job_id)).state).toBe("awaiting");
    await listener.sync(sender);
    expect(listener.payloads()).not.toContain(queue);
  });

  it("enqueue_many notifies each queue that got a job runnable now, and not the others", async () => {
    const [a, b, later] = [unique("q"), unique("q"), unique("q")];
    const future = new Date(Date.now() + 3_600_000).toISOString();
    await enqueueMany(sender, [
      { task: "t", queue: a },
      { task: "t", queue: a },
      { task: "t", queue: b },
      { task: "t", queue: later, run_at: future },
    ]);
    await listener.sync(sender);
    const payloads = listener.payloads();
    expect(payloads.filter((p) => p === a)).toHaveLength(1);
    expect(payloads.filter((p) => p === b)).toHaveLength(1);
    expect(payloads).not.toContain(later);
  });
});
