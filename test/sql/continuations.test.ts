// Continuations (enqueue ... after => parents; _on_job_finished): a child waits
// in awaiting until every parent succeeded, then becomes runnable and workers
// are notified; a parent that fails, is cancelled or expires cancels its
// awaiting children (and theirs); parents already finished at enqueue time are
// taken into account; a parent finishing concurrently never strands a child.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, inRollback, interleave, useTestDatabase } from "../helpers/db.ts";
import { count, enqueue, jobRow, keyRow, Listener, unique } from "../helpers/jobs.ts";
import { claimJob, driveTo, jobIn } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

async function dependencies(c: pg.ClientBase | pg.Pool, childId: string): Promise<string[]> {
  const { rows } = await c.query<{ parent_id: string }>(
    "SELECT parent_id FROM idemq.job_dependencies WHERE child_id = $1 ORDER BY parent_id",
    [childId],
  );
  return rows.map((r) => r.parent_id);
}

describe("a child waits for every parent to succeed", () => {
  it("two parents: one succeeds, the child still awaits; both succeed, the child is enqueued and workers are notified", async () => {
    const listener = await Listener.start(await db.newClient());
    const queue = unique("q");
    const a = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const b = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const child = await enqueue(db.pool, { task: "child", queue, after: [a.job_id, b.job_id] });
    expect(child.deduplicated).toBe(false);
    expect((await jobRow(db.pool, child.job_id)).state).toBe("awaiting");
    expect(await dependencies(db.pool, child.job_id)).toEqual([a.job_id, b.job_id].sort((x, y) => Number(x) - Number(y)));

    await driveTo(db.pool, a.job_id, "succeeded");
    expect((await jobRow(db.pool, child.job_id)).state).toBe("awaiting");
    expect(await dependencies(db.pool, child.job_id)).toEqual([b.job_id]);
    await listener.sync(db.pool);
    expect(listener.payloads()).not.toContain(queue);

    await driveTo(db.pool, b.job_id, "succeeded");
    expect(await jobRow(db.pool, child.job_id)).toMatchObject({ state: "enqueued", finished_at: null, errors: [] });
    expect(await dependencies(db.pool, child.job_id)).toEqual([]);
    await listener.waitFor(queue);
    await listener.sync(db.pool);
    expect(listener.payloads().filter((p) => p === queue)).toHaveLength(1);
    // And it runs: a worker can claim it now.
    await driveTo(db.pool, child.job_id, "succeeded");
    await listener.stop();
  });

  it("an awaiting child is never claimed", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("q");
      const parent = await enqueue(c, { task: "parent", queue: unique("q") });
      await enqueue(c, { task: "child", queue, after: [parent.job_id] });
      const { rows } = await c.query("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY[$1])", [queue]);
      expect(rows).toEqual([]);
    });
  });

  it("a released child whose run_at is still ahead becomes scheduled, not enqueued", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await enqueue(c, { task: "parent", queue: unique("q") });
      const child = await enqueue(c, {
        task: "child",
        run_at: new Date(Date.now() + 3_600_000),
        after: [parent.job_id],
      });
      expect((await jobRow(c, child.job_id)).state).toBe("awaiting");
      await driveTo(c, parent.job_id, "succeeded");
      expect((await jobRow(c, child.job_id)).state).toBe("scheduled");
    });
  });

  it("a child released by one parent is released only once its other parent also succeeds, in either order", async () => {
    await inRollback(db.pool, async (c) => {
      const a = await enqueue(c, { task: "parent", queue: unique("q") });
      const b = await enqueue(c, { task: "parent", queue: unique("q") });
      const child = await enqueue(c, { task: "child", after: [b.job_id, a.job_id] });
      await driveTo(c, b.job_id, "succeeded");
      expect((await jobRow(c, child.job_id)).state).toBe("awaiting");
      await driveTo(c, a.job_id, "succeeded");
      expect((await jobRow(c, child.job_id)).state).toBe("enqueued");
    });
  });
});

describe("a parent that does not succeed cancels its awaiting children", () => {
  it.each(["failed", "cancelled", "expired"] as const)(
    "parent %s: the child is cancelled with the reason in errors, cascading to grandchildren",
    async (parentEnd) => {
      await inRollback(db.pool, async (c) => {
        const parent = await enqueue(c, { task: "parent", queue: unique("q") });
        const other = await enqueue(c, { task: "other_parent", queue: unique("q") });
        const childKey = unique("k");
        const child = await enqueue(c, { task: "child", after: [parent.job_id, other.job_id], idempotency_key: childKey });
        const grandchild = await enqueue(c, { task: "grandchild", after: [child.job_id] });
        const greatGrandchild = await enqueue(c, { task: "great_grandchild", after: [grandchild.job_id] });

        await driveTo(c, parent.job_id, parentEnd);

        const childRow = await jobRow(c, child.job_id);
        expect(childRow.state).toBe("cancelled");
        expect(childRow.finished_at).not.toBeNull();
        expect(childRow.errors).toEqual([
          expect.objectContaining({
            class: "ParentNotSucceeded",
            attempt: 0,
            message: `parent job ${parent.job_id} ended ${parentEnd} before this job could run`,
          }),
        ]);
        const grandRow = await jobRow(c, grandchild.job_id);
        expect(grandRow.state).toBe("cancelled");
        expect(grandRow.errors).toEqual([
          expect.objectContaining({
            class: "ParentNotSucceeded",
            message: `parent job ${child.job_id} ended cancelled before this job could run`,
          }),
        ]);
        expect((await jobRow(c, greatGrandchild.job_id)).state).toBe("cancelled");
        // The cancelled child's key is finished in the ledger, so the policy applies to it.
        expect(await keyRow(c, childKey)).toMatchObject({ job_id: child.job_id, finished_state: "cancelled" });
        // The other parent is unaffected; when it succeeds later it releases nothing.
        expect((await jobRow(c, other.job_id)).state).toBe("enqueued");
        await driveTo(c, other.job_id, "succeeded");
        expect((await jobRow(c, child.job_id)).state).toBe("cancelled");
      });
    },
  );

  it("a parent failing with retries left does not cancel the child; it waits for the retry's outcome", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await enqueue(c, { task: "parent", queue: unique("q"), max_attempts: 2 });
      const child = await enqueue(c, { task: "child", after: [parent.job_id] });
      const attempt = await claimJob(c, parent.job_id);
      const { rows } = await c.query<{ state: string }>(
        "SELECT f.state FROM idemq.fail($1, $2, '\"flaky\"', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), retry_at => now()) f",
        [parent.job_id, attempt],
      );
      expect(rows[0]!.state).toBe("scheduled");
      expect((await jobRow(c, child.job_id)).state).toBe("awaiting");
      // The last attempt fails too: now the child is cancelled.
      const last = await claimJob(c, parent.job_id);
      await c.query("SELECT idemq.fail($1, $2, '\"flaky\"', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [parent.job_id, last]);
      expect((await jobRow(c, parent.job_id)).state).toBe("failed");
      expect((await jobRow(c, child.job_id)).state).toBe("cancelled");
    });
  });

  it("only awaiting children are cancelled: a child already cancelled by its other parent stays as it was", async () => {
    await inRollback(db.pool, async (c) => {
      const a = await enqueue(c, { task: "parent", queue: unique("q") });
      const b = await enqueue(c, { task: "parent", queue: unique("q") });
      const child = await enqueue(c, { task: "child", after: [a.job_id, b.job_id] });
      await driveTo(c, a.job_id, "cancelled");
      const first = await jobRow(c, child.job_id);
      await driveTo(c, b.job_id, "failed");
      const after = await jobRow(c, child.job_id);
      expect(after.state).toBe("cancelled");
      expect(after.errors).toEqual(first.errors);
    });
  });
});

describe("parents already finished at enqueue time", () => {
  it("a parent that already succeeded: the child is runnable immediately", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await jobIn(c, "succeeded", { task: "parent" });
      const child = await enqueue(c, { task: "child", after: [parent] });
      expect((await jobRow(c, child.job_id)).state).toBe("enqueued");
      expect(await dependencies(c, child.job_id)).toEqual([]);
    });
  });

  it("one parent succeeded, one still running: the child waits only on the running one", async () => {
    await inRollback(db.pool, async (c) => {
      const done = await jobIn(c, "succeeded", { task: "parent" });
      const running = await jobIn(c, "processing", { task: "parent" });
      const child = await enqueue(c, { task: "child", after: [done, running] });
      expect((await jobRow(c, child.job_id)).state).toBe("awaiting");
      expect(await dependencies(c, child.job_id)).toEqual([running]);
      await c.query("SELECT idemq.complete($1, 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [running]);
      expect((await jobRow(c, child.job_id)).state).toBe("enqueued");
    });
  });

  it.each(["failed", "cancelled", "expired"] as const)(
    "a parent that already %s: the child is created cancelled, with the reason",
    async (parentEnd) => {
      await inRollback(db.pool, async (c) => {
        const parent = await jobIn(c, parentEnd, { task: "parent" });
        const running = await jobIn(c, "enqueued", { task: "parent" });
        const key = unique("k");
        const child = await enqueue(c, { task: "child", after: [running, parent], idempotency_key: key });
        const row = await jobRow(c, child.job_id);
        expect(row.state).toBe("cancelled");
        expect(row.finished_at).not.toBeNull();
        expect(row.errors).toEqual([
          expect.objectContaining({
            class: "ParentNotSucceeded",
            message: `parent job ${parent} ended ${parentEnd} before this job could run`,
          }),
        ]);
        expect(await dependencies(c, child.job_id)).toEqual([]);
        expect(await keyRow(c, key)).toMatchObject({ finished_state: "cancelled" });
        // The running parent finishing later changes nothing.
        await driveTo(c, running, "succeeded");
        expect((await jobRow(c, child.job_id)).state).toBe("cancelled");
      });
    },
  );

  it("an unknown parent raises IQ404 and nothing is written", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await enqueue(c, { task: "parent", queue: unique("q") });
      const key = unique("k");
      const { rows: before } = await c.query(
        "SELECT (SELECT count(*) FROM idemq.jobs) AS jobs, (SELECT count(*) FROM idemq.keys) AS keys, (SELECT count(*) FROM idemq.job_dependencies) AS deps",
      );
      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "child", after: [parent.job_id, "987654321"], idempotency_key: key })),
        { code: "IQ404", message: /parent job 987654321/ },
      );
      const { rows: after } = await c.query(
        "SELECT (SELECT count(*) FROM idemq.jobs) AS jobs, (SELECT count(*) FROM idemq.keys) AS keys, (SELECT count(*) FROM idemq.job_dependencies) AS deps",
      );
      expect(after).toEqual(before);
      expect(await keyRow(c, key)).toBeUndefined();
      const { rows } = await c.query("SELECT has_children FROM idemq.jobs WHERE id = $1", [parent.job_id]);
      expect(rows[0].has_children).toBe(false);
    });
  });

  it("an expires_at passing while the child awaits expires the child, and cancels its own children", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await enqueue(c, { task: "parent", queue: unique("q") });
      const child = await enqueue(c, { task: "child", after: [parent.job_id], expires_at: "2000-01-01T00:00:00Z" });
      const grandchild = await enqueue(c, { task: "grandchild", after: [child.job_id] });
      expect((await jobRow(c, child.job_id)).state).toBe("awaiting");
      await c.query("SELECT idemq.rescue()");
      expect((await jobRow(c, child.job_id)).state).toBe("expired");
      expect((await jobRow(c, grandchild.job_id)).state).toBe("cancelled");
      expect((await jobRow(c, parent.job_id)).state).toBe("enqueued");
    });
  });
});

describe("a parent finishing concurrently with a child's enqueue", () => {
  it("the parent's complete holds the row; the child's enqueue blocks, then sees the success: the child ends enqueued", async () => {
    const parentTx = await db.newClient();
    const childTx = await db.newClient();
    const parent = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const attempt = await claimJob(db.pool, parent.job_id);

    const run = await interleave(db.pool, {
      first: parentTx,
      holds: (c) => c.query("SELECT idemq.complete($1, $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [parent.job_id, attempt]),
      second: childTx,
      blocks: (c) => enqueue(c, { task: "child", after: [parent.job_id] }),
      end: "COMMIT",
    });
    expect(run.blockers).toContain(run.firstPid);

    const child = await run.second;
    expect((await jobRow(db.pool, parent.job_id)).state).toBe("succeeded");
    expect((await jobRow(db.pool, child.job_id)).state).toBe("enqueued");
    expect(await dependencies(db.pool, child.job_id)).toEqual([]);
  });

  it("the child's enqueue holds the parent; the parent's complete blocks, then releases the child: the child ends enqueued", async () => {
    const parentTx = await db.newClient();
    const childTx = await db.newClient();
    const parent = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const attempt = await claimJob(db.pool, parent.job_id);

    const run = await interleave(db.pool, {
      first: childTx,
      holds: (c) => enqueue(c, { task: "child", after: [parent.job_id] }),
      second: parentTx,
      blocks: (c) => c.query("SELECT idemq.complete($1, $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [parent.job_id, attempt]),
      end: "COMMIT",
    });
    await run.second;
    const child = run.held;

    expect((await jobRow(db.pool, parent.job_id)).state).toBe("succeeded");
    expect((await jobRow(db.pool, child.job_id)).state).toBe("enqueued");
    expect(await dependencies(db.pool, child.job_id)).toEqual([]);
  });

  it("two parents of one child completing concurrently release the child (the second waits for the first)", async () => {
    const firstTx = await db.newClient();
    const secondTx = await db.newClient();
    const a = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const b = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const child = await enqueue(db.pool, { task: "child", after: [a.job_id, b.job_id] });
    const attemptA = await claimJob(db.pool, a.job_id);
    const attemptB = await claimJob(db.pool, b.job_id);

    // Each saw the other's dependency row still there: without serialisation
    // on the child, neither would release it.
    const run = await interleave(db.pool, {
      first: firstTx,
      holds: (c) => c.query("SELECT idemq.complete($1, $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [a.job_id, attemptA]),
      second: secondTx,
      blocks: (c) => c.query("SELECT idemq.complete($1, $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [b.job_id, attemptB]),
      end: "COMMIT",
    });
    expect(run.blockers).toContain(run.firstPid);
    await run.second;

    expect((await jobRow(db.pool, a.job_id)).state).toBe("succeeded");
    expect((await jobRow(db.pool, b.job_id)).state).toBe("succeeded");
    expect((await jobRow(db.pool, child.job_id)).state).toBe("enqueued");
    expect(await dependencies(db.pool, child.job_id)).toEqual([]);
  });

  it("one parent failing while the other completes, concurrently: the child ends cancelled, never released", async () => {
    const failTx = await db.newClient();
    const completeTx = await db.newClient();
    const a = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const b = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const child = await enqueue(db.pool, { task: "child", after: [a.job_id, b.job_id] });
    const attemptA = await claimJob(db.pool, a.job_id);
    const attemptB = await claimJob(db.pool, b.job_id);

    const run = await interleave(db.pool, {
      first: completeTx,
      holds: (c) => c.query("SELECT idemq.complete($1, $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [b.job_id, attemptB]),
      second: failTx,
      blocks: (c) => c.query("SELECT idemq.fail($1, $2, '\"boom\"', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), retryable => false)", [a.job_id, attemptA]),
      end: "COMMIT",
    });
    await run.second;

    expect((await jobRow(db.pool, child.job_id)).state).toBe("cancelled");
  });

  it("the child's enqueue holds the parent; the parent's fail blocks, then cancels the child", async () => {
    const parentTx = await db.newClient();
    const childTx = await db.newClient();
    const parent = await enqueue(db.pool, { task: "parent", queue: unique("q") });
    const attempt = await claimJob(db.pool, parent.job_id);

    const run = await interleave(db.pool, {
      first: childTx,
      holds: (c) => enqueue(c, { task: "child", after: [parent.job_id] }),
      second: parentTx,
      blocks: (c) => c.query("SELECT idemq.fail($1, $2, '\"boom\"', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), retryable => false)", [parent.job_id, attempt]),
      end: "COMMIT",
    });
    await run.second;
    const child = run.held;

    expect((await jobRow(db.pool, parent.job_id)).state).toBe("failed");
    expect((await jobRow(db.pool, child.job_id)).state).toBe("cancelled");
    expect(await count(db.pool, "SELECT 1 FROM idemq.job_dependencies WHERE child_id = $1", [child.job_id])).toBe(0);
  });
});
