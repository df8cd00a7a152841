// Fan-out and fan-in in SQL: spawn (named children, idempotent by name),
// wait_for_children (the parent parked, its attempt not spent), the
// children's finishes releasing it (_child_finished, _release_waiting),
// fail_fast, children() after retention, concurrency keys, fencing, and a
// last-two-children race on real connections.
import { describe, expect, it } from "vitest";
import { expectSqlError, inRollback, useTestDatabase, waitUntilBlocked, backendPid } from "../helpers/db.ts";
import { jobRow, makeJob, stateOf, unique, type Queryable } from "../helpers/jobs.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { claim, claimJobRow, type ClaimedJob } from "../helpers/work.ts";

const db = useTestDatabase();

interface SpawnRow {
  name: string;
  child_job_id: string;
  state: string;
  result: unknown;
  last_error: { class?: string; message?: string } | null;
  outcome: string;
}

async function spawn(c: Queryable, parent: ClaimedJob, children: unknown, failFast = false): Promise<SpawnRow[]> {
  const { rows } = await c.query<SpawnRow>(
    "SELECT * FROM idemq.spawn(job_id => $1, attempt => $2, children => $3::jsonb, lease_token => $4, fail_fast => $5)",
    [parent.job_id, parent.attempt, JSON.stringify(children), parent.lease_token, failFast],
  );
  return rows;
}

async function park(c: Queryable, parent: ClaimedJob): Promise<boolean> {
  const { rows } = await c.query<{ parked: boolean }>(
    "SELECT idemq.wait_for_children(job_id => $1, attempt => $2, lease_token => $3) AS parked",
    [parent.job_id, parent.attempt, parent.lease_token],
  );
  return rows[0]!.parked;
}

async function childrenOf(c: Queryable, id: string): Promise<SpawnRow[]> {
  return (await c.query<SpawnRow>("SELECT * FROM idemq.children(job_id => $1)", [id])).rows;
}

async function waitingFor(c: Queryable, id: string): Promise<string | null> {
  return (await c.query<{ waiting_for: string | null }>("SELECT waiting_for FROM idemq.job(job_id => $1)", [id])).rows[0]!.waiting_for;
}

/** Claims child `id` (its own queue) and completes it with `result`. */
async function finishChild(c: Queryable, id: string, result: unknown): Promise<void> {
  const job = await claimJobRow(c, id);
  await c.query("SELECT idemq.complete(job_id => $1, attempt => $2, result => $3::jsonb, lease_token => $4)", [
    id,
    job.attempt,
    JSON.stringify(result),
    job.lease_token,
  ]);
}

async function failChild(c: Queryable, id: string, message: string): Promise<void> {
  const job = await claimJobRow(c, id);
  await c.query("SELECT idemq.fail(job_id => $1, attempt => $2, error => $3::jsonb, retryable => false, lease_token => $4)", [
    id,
    job.attempt,
    JSON.stringify({ class: "Boom", message }),
    job.lease_token,
  ]);
}

/** A parent job claimed with a token, in its own queue. */
async function claimedParent(c: Queryable, args: { concurrency_key?: string } = {}): Promise<ClaimedJob> {
  const queue = unique("parents");
  const id = await makeJob(c, { task: "parent", queue, ...args });
  const rows = await claim(c, { queues: [queue], token: true });
  expect(rows.map((r) => r.job_id)).toEqual([id]);
  return rows[0]!;
}

/** Children each in a queue of its own, so claimJobRow can take each. */
function kids(names: string[]): { name: string; task: string; queue: string; payload: { n: string } }[] {
  return names.map((name) => ({ name, task: "child", queue: unique(`kid-${name}`), payload: { n: name } }));
}

describe("spawn and wait_for_children", () => {
  it("parks the parent without spending its attempt; the last child's finish makes it runnable; children() has the results", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const rows = await spawn(c, parent, kids(["a", "b"]));
      expect(rows.map((r) => [r.name, r.state, r.outcome])).toEqual([
        ["a", "enqueued", "created"],
        ["b", "enqueued", "created"],
      ]);
      expect(await park(c, parent)).toBe(true);
      const parked = await jobRow(c, parent.job_id);
      expect(parked.state).toBe("awaiting");
      expect(parked.attempt - parked.uncounted).toBe(0);
      expect(await waitingFor(c, parent.job_id)).toBe("children");

      await finishChild(c, rows[0]!.child_job_id, { size: 1 });
      expect(await stateOf(c, parent.job_id)).toBe("awaiting");
      await finishChild(c, rows[1]!.child_job_id, { size: 2 });
      expect(await stateOf(c, parent.job_id)).toBe("enqueued");
      expect(await waitingFor(c, parent.job_id)).toBeNull();
      expect((await childrenOf(c, parent.job_id)).map((r) => [r.name, r.state, r.result])).toEqual([
        ["a", "succeeded", { size: 1 }],
        ["b", "succeeded", { size: 2 }],
      ]);
    });
  });

  it("is idempotent by name: a replay spawns nothing again and says existing; a new name is added to the count", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const first = await spawn(c, parent, kids(["a", "b"]));
      const again = await spawn(c, parent, [...kids(["a", "b"]), ...kids(["c"])]);
      expect(again.map((r) => [r.name, r.outcome])).toEqual([
        ["a", "existing"],
        ["b", "existing"],
        ["c", "created"],
      ]);
      expect(again.slice(0, 2).map((r) => r.child_job_id)).toEqual(first.map((r) => r.child_job_id));
      const { rows } = await c.query("SELECT pending, failed FROM idemq.child_waits WHERE parent_id = $1", [parent.job_id]);
      expect(rows).toEqual([{ pending: 3, failed: 0 }]);
    });
  });

  it("a replay after the children finished returns their outcomes; wait_for_children then says false and writes nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const [a] = await spawn(c, parent, kids(["a"]));
      await finishChild(c, a!.child_job_id, "done");
      const replay = await spawn(c, parent, kids(["a"]));
      expect(replay.map((r) => [r.name, r.state, r.result, r.outcome])).toEqual([["a", "succeeded", "done", "existing"]]);
      expect(await park(c, parent)).toBe(false);
      expect(await stateOf(c, parent.job_id)).toBe("processing");
    });
  });

  it("without fail_fast the parent waits for every child, failures included, and reads each one's error", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const rows = await spawn(c, parent, kids(["a", "b"]));
      expect(await park(c, parent)).toBe(true);
      await failChild(c, rows[0]!.child_job_id, "no disk");
      expect(await stateOf(c, parent.job_id)).toBe("awaiting");
      await finishChild(c, rows[1]!.child_job_id, 2);
      expect(await stateOf(c, parent.job_id)).toBe("enqueued");
      const out = await childrenOf(c, parent.job_id);
      expect(out.map((r) => [r.name, r.state, r.last_error?.message ?? null, r.result])).toEqual([
        ["a", "failed", "no disk", null],
        ["b", "succeeded", null, 2],
      ]);
    });
  });

  it("fail_fast: the first child that does not succeed releases the parent; wait_for_children then says false", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const rows = await spawn(c, parent, kids(["a", "b", "c"]), true);
      expect(await park(c, parent)).toBe(true);
      await c.query("SELECT idemq.cancel(job_id => $1)", [rows[1]!.child_job_id]);
      expect(await stateOf(c, parent.job_id)).toBe("enqueued");
      const again = await claimJobRow(c, parent.job_id);
      expect(again.attempt).toBe(parent.attempt + 1);
      expect(await park(c, again)).toBe(false);
      // The others still run; their finish no longer moves the parent.
      await finishChild(c, rows[0]!.child_job_id, 1);
      expect(await stateOf(c, parent.job_id)).toBe("processing");
    });
  });

  it("a parent with a concurrency key is not promoted while parked, and is admitted by its key once released", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("key");
      const parent = await claimedParent(c, { concurrency_key: key });
      const next = await makeJob(c, { task: "other", queue: unique("q"), concurrency_key: key });
      expect(await stateOf(c, next)).toBe("awaiting");
      const [a] = await spawn(c, parent, kids(["a"]));
      expect(await park(c, parent)).toBe(true);
      // The key's place went to the next job, not to the parked parent.
      expect(await stateOf(c, next)).toBe("enqueued");
      expect(await waitingFor(c, parent.job_id)).toBe("children");
      await finishChild(c, a!.child_job_id, 1);
      expect(await waitingFor(c, parent.job_id)).toBe("concurrency_key");
      await c.query("SELECT idemq.cancel(job_id => $1)", [next]);
      expect(await stateOf(c, parent.job_id)).toBe("enqueued");
    });
  });

  it("a parked parent cancelled, then retried, runs again and finds its children linked", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const [a] = await spawn(c, parent, kids(["a"]));
      expect(await park(c, parent)).toBe(true);
      await c.query("SELECT idemq.cancel(job_id => $1)", [parent.job_id]);
      expect(await c.query("SELECT 1 FROM idemq.job_dependencies WHERE child_id = $1", [parent.job_id])).toMatchObject({ rowCount: 0 });
      await finishChild(c, a!.child_job_id, 7);
      expect(await stateOf(c, parent.job_id)).toBe("cancelled");
      await c.query("SELECT idemq.retry(job_id => $1)", [parent.job_id]);
      const again = await claimJobRow(c, parent.job_id);
      expect((await spawn(c, again, kids(["a"]))).map((r) => [r.state, r.result, r.outcome])).toEqual([["succeeded", 7, "existing"]]);
    });
  });

  it("children() keeps a child's outcome after retention deleted the child; the parent's deletion takes its links", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const [a] = await spawn(c, parent, kids(["a"]));
      await finishChild(c, a!.child_job_id, { kept: true });
      const finishedLongAgo = "UPDATE idemq.jobs SET finished_at = now() - interval '1 hour' WHERE id = $1";
      await c.query(finishedLongAgo, [a!.child_job_id]);
      await c.query("SELECT idemq.purge(older_than => '1 minute', states => '{succeeded}')");
      expect(await stateOf(c, a!.child_job_id)).toBeUndefined();
      expect((await childrenOf(c, parent.job_id)).map((r) => r.result)).toEqual([{ kept: true }]);
      await c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", [parent.job_id, parent.attempt, parent.lease_token]);
      await c.query(finishedLongAgo, [parent.job_id]);
      await c.query("SELECT idemq.purge(older_than => '1 minute', states => '{succeeded}')");
      expect(await c.query("SELECT 1 FROM idemq.job_children WHERE parent_id = $1 UNION ALL SELECT 1 FROM idemq.child_waits WHERE parent_id = $1", [parent.job_id])).toMatchObject({ rowCount: 0 });
    });
  });

  it("a child deduplicated by its key onto an active job is linked to it: that job's finish counts", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const queue = unique("q");
      const earlier = await makeJob(c, { task: "child", queue, idempotency_key: key });
      const parent = await claimedParent(c);
      const rows = await spawn(c, parent, [{ name: "a", task: "child", queue, idempotency_key: key }]);
      expect(rows.map((r) => [r.child_job_id, r.state, r.outcome])).toEqual([[earlier, "enqueued", "deduplicated"]]);
      expect(await park(c, parent)).toBe(true);
      await finishChild(c, earlier, "shared");
      expect(await stateOf(c, parent.job_id)).toBe("enqueued");
      expect((await childrenOf(c, parent.job_id)).map((r) => r.result)).toEqual(["shared"]);
    });
  });

  it("a child deduplicated onto a job that finished before its link was written counts as finished, with that job's outcome", async () => {
    await inRollback(db.pool, async (c) => {
      const dead = await claimedParent(c);
      await c.query("SELECT idemq.cancel(job_id => $1)", [dead.job_id]);
      const parent = await claimedParent(c);
      // Both share a key: "b" is deduplicated onto "a", which _insert_jobs cancels at once (its after-parent was cancelled).
      const twin = { task: "child", queue: unique("q"), idempotency_key: unique("k"), after: [Number(dead.job_id)] };
      const rows = await spawn(c, parent, [
        { name: "a", ...twin },
        { name: "b", ...twin },
      ]);
      expect(rows.map((r) => [r.name, r.child_job_id, r.state, r.outcome])).toEqual([
        ["a", rows[0]!.child_job_id, "cancelled", "created"],
        ["b", rows[0]!.child_job_id, "cancelled", "deduplicated"],
      ]);
      const { rows: wait } = await c.query("SELECT pending, failed FROM idemq.child_waits WHERE parent_id = $1", [parent.job_id]);
      expect(wait).toEqual([{ pending: 0, failed: 2 }]);
      expect(await park(c, parent)).toBe(false);
      // Both links name one child, so children() orders them by name: without that tie-breaker this
      // read returned b before a (PostgreSQL 15).
      const linked = (await childrenOf(c, parent.job_id)).map((r) => [r.name, r.state, r.last_error?.class]);
      expect(linked).toEqual([
        ["a", "cancelled", "ParentNotSucceeded"],
        ["b", "cancelled", "ParentNotSucceeded"],
      ]);
    });
  });

  it("writes each new child once, has_children set at insert: spawn updates no child row", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const updates = async () =>
        Number((await c.query<{ n: string }>("SELECT n_tup_upd AS n FROM pg_stat_xact_user_tables WHERE relid = 'idemq.jobs'::regclass")).rows[0]!.n);
      await spawn(c, parent, kids(["warm"]));
      const before = await updates();
      const rows = await spawn(c, parent, kids(["a", "b", "c", "d", "e"]));
      // The parent has has_children since the first call: no row of jobs is updated now.
      expect((await updates()) - before).toBe(0);
      const { rows: flags } = await c.query<{ has_children: boolean }>("SELECT has_children FROM idemq.jobs WHERE id = ANY ($1::bigint[])", [
        rows.map((r) => r.child_job_id),
      ]);
      expect(flags).toEqual(rows.map(() => ({ has_children: true })));
    });
  });

  it("a child cancelled at once (a parent in its after had failed) counts as finished: the parent does not wait for it", async () => {
    await inRollback(db.pool, async (c) => {
      const dead = await claimedParent(c);
      await c.query("SELECT idemq.fail(job_id => $1, attempt => $2, error => $3::jsonb, retryable => false, lease_token => $4)", [
        dead.job_id,
        dead.attempt,
        JSON.stringify({ class: "Boom", message: "gone" }),
        dead.lease_token,
      ]);
      const parent = await claimedParent(c);
      const rows = await spawn(c, parent, [{ ...kids(["a"])[0], after: [Number(dead.job_id)] }, ...kids(["b"])]);
      expect(rows.map((r) => [r.name, r.state, r.last_error?.class ?? null, r.outcome])).toEqual([
        ["a", "cancelled", "ParentNotSucceeded", "created"],
        ["b", "enqueued", null, "created"],
      ]);
      const { rows: wait } = await c.query("SELECT pending, failed FROM idemq.child_waits WHERE parent_id = $1", [parent.job_id]);
      expect(wait).toEqual([{ pending: 1, failed: 1 }]);
      expect(await park(c, parent)).toBe(true);
      await finishChild(c, rows[1]!.child_job_id, 2);
      expect(await stateOf(c, parent.job_id)).toBe("enqueued");
      expect((await childrenOf(c, parent.job_id)).map((r) => [r.name, r.state])).toEqual([
        ["a", "cancelled"],
        ["b", "succeeded"],
      ]);
    });
  });

  it("is fenced: a wrong token gets IQ410 and spawns nothing; a job it does not hold cannot be parked", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const wrong = { ...parent, lease_token: "00000000-0000-4000-8000-000000000000" };
      await underSavepoint(c, () => expectSqlError(spawn(c, wrong, kids(["a"])), { code: "IQ410" }));
      expect(await childrenOf(c, parent.job_id)).toEqual([]);
      await spawn(c, parent, kids(["a"]));
      await underSavepoint(c, () => expectSqlError(park(c, wrong), { code: "IQ410" }));
      await underSavepoint(c, () => expectSqlError(park(c, { ...parent, attempt: parent.attempt + 1 }), { code: "IQ410" }));
      expect(await stateOf(c, parent.job_id)).toBe("processing");
    });
  });

  it("refuses bad children with 22023 naming the element, and a child refused by its key with IQ409 naming it; nothing spawned", async () => {
    await inRollback(db.pool, async (c) => {
      const parent = await claimedParent(c);
      const cases: [unknown, RegExp][] = [
        [{}, /children must be a JSON array/],
        [[1], /children\[1\] must be an object/],
        [[{ task: "t" }], /children\[1\] has no "name"/],
        [[{ name: 3, task: "t" }], /name that is not a string/],
        [[{ name: "", task: "t" }], /empty name/],
        [[{ name: "x".repeat(201), task: "t" }], /201 characters, over 200/],
        [[{ name: "a", task: "t" }, { name: "a", task: "t" }], /children\[2\] has the name "a" of an earlier element/],
        [[{ name: "a", task: "" }], /spawn: jobs\[1\]/],
      ];
      for (const [children, message] of cases) {
        await underSavepoint(c, () => expectSqlError(spawn(c, parent, children), { code: "22023", message }));
      }
      const key = unique("k");
      await makeJob(c, { task: "other", idempotency_key: key });
      await underSavepoint(c, () =>
        expectSqlError(spawn(c, parent, [{ name: "z", task: "child", idempotency_key: key }]), { code: "IQ409", message: /child "z"/ }),
      );
      expect(await childrenOf(c, parent.job_id)).toEqual([]);
    });
  });
});

describe("the last two children finishing at once", () => {
  it("release the parked parent exactly once, whichever commits first (real connections)", async () => {
    const setup = await db.pool.connect();
    let parentId: string;
    let ids: string[];
    let attempts: { id: string; attempt: number; token: string }[];
    try {
      const parent = await claimedParent(setup);
      parentId = parent.job_id;
      const rows = await spawn(setup, parent, kids(["a", "b"]));
      ids = rows.map((r) => r.child_job_id);
      expect(await park(setup, parent)).toBe(true);
      attempts = [];
      for (const id of ids) {
        const job = await claimJobRow(setup, id);
        attempts.push({ id, attempt: job.attempt, token: job.lease_token! });
      }
    } finally {
      setup.release();
    }
    const [one, two] = [await db.pool.connect(), await db.pool.connect()];
    try {
      const twoPid = await backendPid(two);
      await one.query("BEGIN");
      await two.query("BEGIN");
      const complete = (c: Queryable, a: { id: string; attempt: number; token: string }) =>
        c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", [a.id, a.attempt, a.token]);
      await complete(one, attempts[0]!);
      const second = complete(two, attempts[1]!);
      // The second finisher waits on the parent's count row, held by the first.
      await waitUntilBlocked(db.pool, twoPid);
      await one.query("COMMIT");
      await second;
      await two.query("COMMIT");
      expect(await stateOf(db.pool, parentId)).toBe("enqueued");
      const { rows } = await db.pool.query("SELECT pending FROM idemq.child_waits WHERE parent_id = $1", [parentId]);
      expect(rows).toEqual([{ pending: 0 }]);
    } finally {
      one.release();
      two.release();
    }
  });
});

describe("20,000 children", () => {
  it("one spawn links and counts them all; the parent stays parked until the last batch of completions, then children() has every result", async () => {
    const c = await db.pool.connect();
    try {
      const parent = await claimedParent(c);
      const queue = unique("many");
      const n = 20_000;
      const rows = await spawn(
        c,
        parent,
        Array.from({ length: n }, (_, i) => ({ name: `c${i}`, task: "child", queue, payload: { i } })),
      );
      expect(rows).toHaveLength(n);
      expect(new Set(rows.map((r) => r.child_job_id)).size).toBe(n);
      expect(rows.every((r, i) => r.name === `c${i}` && r.outcome === "created" && r.state === "enqueued")).toBe(true);
      expect(await park(c, parent)).toBe(true);
      // 1,000 at a time, each batch its own transaction (claim + complete() with a result per job).
      for (let done = 0; done < n; ) {
        expect(await stateOf(c, parent.job_id)).toBe("awaiting");
        await c.query("BEGIN");
        const { rows: claimed } = await c.query<{ job_id: string; attempt: number; lease_token: string; payload: { i: number } }>(
          "SELECT job_id, attempt, lease_token, payload FROM idemq.claim(worker_id => 'many', queues => ARRAY[$1], batch_size => 1000, token => true)",
          [queue],
        );
        await c.query(
          `SELECT idemq.complete(job_id => u.id, attempt => u.attempt, result => to_jsonb(u.i * 2), lease_token => u.token)
             FROM unnest($1::bigint[], $2::int[], $3::uuid[], $4::int[]) AS u(id, attempt, token, i)`,
          [claimed.map((j) => j.job_id), claimed.map((j) => j.attempt), claimed.map((j) => j.lease_token), claimed.map((j) => j.payload.i)],
        );
        await c.query("COMMIT");
        done += claimed.length;
        expect(claimed.length).toBeGreaterThan(0);
      }
      expect(await stateOf(c, parent.job_id)).toBe("enqueued");
      const out = await childrenOf(c, parent.job_id);
      expect(out).toHaveLength(n);
      expect(out.every((r) => r.state === "succeeded" && r.result === Number(r.name.slice(1)) * 2)).toBe(true);
      const { rows: count } = await c.query("SELECT pending, failed FROM idemq.child_waits WHERE parent_id = $1", [parent.job_id]);
      expect(count).toEqual([{ pending: 0, failed: 0 }]);
    } finally {
      c.release();
    }
  }, 300_000);
});
