// complete_and_take_next (issue 26, item 9): complete_many, and the next job
// of each concurrency key it frees handed to the completing worker in the
// same statement (awaiting -> processing, one write), but only a job that
// worker's next claim would take first; every other freed key's job is
// admitted for any claim, as complete_many admits it.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase } from "../helpers/db.ts";
import { count, makeJob, makeJobs, stateOf, states, unique, type Queryable } from "../helpers/jobs.ts";
import { claim, type ClaimedJob } from "../helpers/work.ts";

const db = useTestDatabase();

interface TakeRow {
  completed: string | null;
  job_id: string | null;
  task: string | null;
  queue: string | null;
  attempt: number | null;
  lease_token: string | null;
  reclaimed: boolean | null;
  timeout: unknown;
}

interface TakeArgs {
  queues?: string[] | null;
  tasks?: string[] | null;
  lease?: string;
  workerId?: string;
}

async function takeNext(q: Queryable, done: readonly ClaimedJob[], args: TakeArgs = {}): Promise<{ completed: string[]; handed: TakeRow[] }> {
  const { rows } = await q.query<TakeRow>(
    `SELECT * FROM idemq.complete_and_take_next($1::bigint[], $2::int[], $3::uuid[], $4, queues => $5::text[],
       lease => $6::interval, tasks => $7::text[])`,
    [
      done.map((j) => j.job_id),
      done.map((j) => j.attempt),
      done.map((j) => j.lease_token),
      args.workerId ?? "w-next",
      args.queues ?? null,
      args.lease ?? "30 seconds",
      args.tasks ?? null,
    ],
  );
  return {
    completed: rows.filter((r) => r.completed !== null).map((r) => r.completed!),
    handed: rows.filter((r) => r.completed === null),
  };
}

const keyed = (queue: string, key: string, extra: Record<string, unknown> = {}): Promise<string> =>
  makeJob(db.pool, { queue, concurrency_key: key, ...extra });

const claimAll = (queue: string, extra: Record<string, unknown> = {}): Promise<ClaimedJob[]> =>
  claim(db.pool, { queues: [queue], batch_size: 100, token: true, ...extra });

const asClaimed = (r: TakeRow): ClaimedJob =>
  ({ job_id: r.job_id!, attempt: r.attempt!, lease_token: r.lease_token! }) as ClaimedJob;

describe("complete_and_take_next hands a freed key's next job to the completing worker", () => {
  it("completes the job and returns the key's next one claimed (processing, attempt 1, a lease and a new token), then the one after", async () => {
    const queue = unique("next");
    const key = unique("customer");
    const [a, b, c] = [await keyed(queue, key), await keyed(queue, key), await keyed(queue, key)];
    const [first] = await claimAll(queue);
    expect(first!.job_id).toBe(a);

    const one = await takeNext(db.pool, [first!], { queues: [queue], tasks: ["test_task"], lease: "2 minutes" });
    expect(one.completed).toEqual([a]);
    expect(one.handed.map((r) => [r.job_id, r.task, r.queue, r.attempt, r.reclaimed])).toEqual([[b, "test_task", queue, 1, false]]);
    expect(one.handed[0]!.lease_token).toMatch(/^[0-9a-f-]{36}$/);
    const row = (
      await db.pool.query(
        "SELECT state, locked_by, lease_token, lease_expires_at - locked_at AS lease FROM idemq.jobs WHERE id = $1",
        [b],
      )
    ).rows[0];
    expect(row).toMatchObject({ state: "processing", locked_by: "w-next", lease_token: one.handed[0]!.lease_token });
    expect(row.lease).toMatchObject({ minutes: 2 });
    expect(await states(db.pool, [a, b, c])).toEqual({ [a]: "succeeded", [b]: "processing", [c]: "awaiting" });
    // Nothing else of the key is runnable: K = 1 holds.
    expect(await claimAll(queue)).toEqual([]);

    // The handed attempt is the worker's: its token completes it, and hands on the next.
    const two = await takeNext(db.pool, [asClaimed(one.handed[0]!)], { queues: [queue] });
    expect(two.completed).toEqual([b]);
    expect(two.handed.map((r) => r.job_id)).toEqual([c]);
    const three = await takeNext(db.pool, [asClaimed(two.handed[0]!)]);
    expect(three).toEqual({ completed: [c], handed: [] });
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE queue = $1 AND state <> 'succeeded'", [queue])).toBe(0);
  });

  it("hands one job of each freed key in one call, in claim order, and leaves keys with nothing waiting alone", async () => {
    const queue = unique("many");
    const heads: string[] = [];
    const nexts: string[] = [];
    for (let k = 0; k < 3; k++) heads.push(await keyed(queue, `${queue}:${k}`));
    for (let k = 0; k < 3; k++) nexts.push(await keyed(queue, `${queue}:${k}`, { priority: k }));
    const lone = await keyed(queue, `${queue}:lone`);
    const claimed = await claimAll(queue);
    expect(claimed.map((j) => j.job_id).sort()).toEqual([...heads, lone].sort());
    const { completed, handed } = await takeNext(db.pool, claimed, { queues: [queue] });
    expect(completed.sort()).toEqual([...heads, lone].sort());
    // priority desc first.
    expect(handed.map((r) => r.job_id)).toEqual([nexts[2], nexts[1], nexts[0]]);
  });

  it("a lost lease completes nothing and hands nothing", async () => {
    const queue = unique("lost");
    const key = unique("k");
    const a = await keyed(queue, key);
    const b = await keyed(queue, key);
    const [first] = await claimAll(queue);
    const stale = { ...first!, lease_token: "00000000-0000-4000-8000-000000000000" };
    expect(await takeNext(db.pool, [stale], { queues: [queue] })).toEqual({ completed: [], handed: [] });
    expect(await states(db.pool, [a, b])).toEqual({ [a]: "processing", [b]: "awaiting" });
  });
});

describe("complete_and_take_next reads the handed jobs back by id", () => {
  // The planner trap in complete_and_take_next's read-back: with the state
  // and worker beside the ids, a plan through jobs_leases walks every job
  // any worker holds. Set up as it bites: statistics taken while nothing was
  // processing, then BUSY jobs held by another worker, and 20 keys handed at
  // once (a lookup of 20 ids costs the planner more than a walk of the
  // "empty" jobs_leases).
  it("reads none of the jobs other workers hold (jobs_leases tuples read in the call < their number)", async () => {
    const BUSY = 300;
    const KEYS = 20;
    const queue = unique("readback");
    const busyQueue = unique("busy");
    await makeJobs(db.pool, BUSY, { queue: busyQueue });
    for (let k = 0; k < KEYS; k++) await keyed(queue, `${queue}:${k}`);
    for (let k = 0; k < KEYS; k++) await keyed(queue, `${queue}:${k}`);
    await db.pool.query("ANALYZE idemq.jobs");
    expect(await claim(db.pool, { worker_id: "w-busy", queues: [busyQueue], batch_size: BUSY })).toHaveLength(BUSY);
    const heads = await claimAll(queue);
    expect(heads).toHaveLength(KEYS);

    // A connection that has read nothing else: pg_stat_get_xact_* also count a
    // backend's earlier transactions whose statistics it has not reported yet.
    const c = await db.newClient();
    await c.query("BEGIN");
    const { handed } = await takeNext(c, heads, { queues: [queue] });
    const { rows } = await c.query<{ n: string }>("SELECT pg_stat_get_xact_tuples_returned('idemq.jobs_leases'::regclass) AS n");
    const leasesRead = Number(rows[0]!.n);
    await c.query("ROLLBACK");
    expect(handed).toHaveLength(KEYS);
    expect(leasesRead).toBeLessThan(BUSY);
  });
});

describe("complete_and_take_next hands only what the worker's next claim would take first; the rest is admitted as complete_many admits it", () => {
  // Each case: a key of two jobs, its head claimed and completed with
  // complete_and_take_next; the next job must come out enqueued (admitted,
  // not handed) for the reason given.
  const cases: { why: string; setup?: (queue: string, key: string) => Promise<void>; next?: Record<string, unknown>; args?: (queue: string) => TakeArgs }[] = [
    { why: "a task the worker lacks", args: (queue) => ({ queues: [queue], tasks: ["another_task"] }) },
    { why: "a queue the worker does not serve", args: () => ({ queues: [unique("elsewhere")] }) },
    {
      why: "an older runnable job of its task and queue",
      setup: async (queue) => {
        await makeJob(db.pool, { queue, run_at: new Date(Date.now() - 3_600_000) });
      },
    },
    {
      why: "a runnable job of higher priority in its task and queue",
      setup: async (queue) => {
        await makeJob(db.pool, { queue, priority: 9 });
      },
    },
    {
      why: "its queue paused",
      setup: async (queue) => {
        await db.pool.query("SELECT idemq.pause(queue => $1)", [queue]);
      },
    },
    {
      why: "a concurrency limit on its queue",
      setup: async (queue) => {
        await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 5)", [queue]);
      },
    },
    {
      why: "a rate limit on its queue",
      setup: async (queue) => {
        await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 100, per => '1 minute')", [queue]);
      },
    },
  ];
  for (const { why, setup, args } of cases) {
    it(`not handed: ${why}`, async () => {
      const queue = unique("kept");
      const key = unique("k");
      const a = await keyed(queue, key);
      const b = await keyed(queue, key);
      const [first] = await claim(db.pool, { queues: [queue], batch_size: 1, token: true });
      expect(first!.job_id).toBe(a);
      await setup?.(queue, key);
      const out = await takeNext(db.pool, [first!], args?.(queue) ?? { queues: [queue] });
      expect(out).toEqual({ completed: [a], handed: [] });
      expect(await stateOf(db.pool, b)).toBe("enqueued");
    });
  }

  it("judges claim order per task and queue within one call: a key whose queue has older work is not handed, one beside it in a clear queue is", async () => {
    const busy = unique("older-work");
    const clear = unique("clear");
    const [kBusy, kClear] = [unique("k"), unique("k")];
    const headBusy = await keyed(busy, kBusy);
    const nextBusy = await keyed(busy, kBusy);
    const headClear = await keyed(clear, kClear);
    const nextClear = await keyed(clear, kClear);
    const heads = await claim(db.pool, { queues: [busy, clear], batch_size: 10, token: true });
    expect(heads.map((j) => j.job_id).sort()).toEqual([headBusy, headClear].sort());
    // Older runnable work in the busy queue only, of the same task.
    await makeJob(db.pool, { queue: busy, run_at: new Date(Date.now() - 3_600_000) });
    const out = await takeNext(db.pool, heads, { queues: [busy, clear] });
    expect(out.completed.sort()).toEqual([headBusy, headClear].sort());
    expect(out.handed.map((r) => r.job_id)).toEqual([nextClear]);
    expect(await states(db.pool, [nextBusy, nextClear])).toEqual({ [nextBusy]: "enqueued", [nextClear]: "processing" });
  });

  it("not handed: a next job whose run_at is later (it is admitted as scheduled)", async () => {
    const queue = unique("later");
    const key = unique("k");
    const a = await keyed(queue, key);
    const b = await keyed(queue, key, { run_at: new Date(Date.now() + 3_600_000) });
    const [first] = await claimAll(queue);
    expect(first!.job_id).toBe(a);
    expect(await takeNext(db.pool, [first!], { queues: [queue] })).toEqual({ completed: [a], handed: [] });
    expect(await stateOf(db.pool, b)).toBe("scheduled");
  });

  it("the hand-off ends with the call: a complete_many later in the same transaction admits for any claim", async () => {
    const queue = unique("scope");
    const keys = [unique("k"), unique("k")];
    const [a1, b1] = [await keyed(queue, keys[0]!), await keyed(queue, keys[1]!)];
    const [a2, b2] = [await keyed(queue, keys[0]!), await keyed(queue, keys[1]!)];
    const claimed = await claimAll(queue);
    const byId = new Map(claimed.map((j) => [j.job_id, j]));
    const client = await db.pool.connect();
    try {
      await client.query("BEGIN");
      const out = await takeNext(client, [byId.get(a1)!], { queues: [queue] });
      expect(out.handed.map((r) => r.job_id)).toEqual([a2]);
      expect((await client.query("SELECT current_setting('idemq.hand_off', true) AS h")).rows[0].h).toBe("");
      const j = byId.get(b1)!;
      await client.query("SELECT idemq.complete_many($1::bigint[], $2::int[], $3::uuid[])", [[j.job_id], [j.attempt], [j.lease_token]]);
      await client.query("COMMIT");
    } finally {
      client.release();
    }
    expect(await states(db.pool, [a2, b2])).toEqual({ [a2]: "processing", [b2]: "enqueued" });
  });

  it("bad input gets 22004 or 22023 with a hint and completes nothing", async () => {
    const queue = unique("bad");
    const a = await keyed(queue, unique("k"));
    const [first] = await claimAll(queue);
    const call = (worker: string | null, lease = "30 seconds") =>
      db.pool.query("SELECT * FROM idemq.complete_and_take_next($1::bigint[], $2::int[], $3::uuid[], $4, lease => $5::interval)", [
        [first!.job_id],
        [first!.attempt],
        [first!.lease_token],
        worker,
        lease,
      ]);
    await expectSqlError(call(null), { code: "22004", message: "complete_and_take_next: worker_id must be a non-empty string", hint: /hostname/ });
    await expectSqlError(call(""), { code: "22023", message: /worker_id must be a non-empty string/, hint: /hostname/ });
    await expectSqlError(call("w", "0 seconds"), { code: "22023", message: /complete_and_take_next: lease must be between/, hint: /./ });
    expect(await stateOf(db.pool, a)).toBe("processing");
  });
});
