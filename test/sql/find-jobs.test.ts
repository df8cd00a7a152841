// find_jobs and count_jobs: each filter field on the job zoo (one job in each
// state, its own queue and key, payload {zoo: name}), paging, the count's
// cap, and every bad input refused with 22023 (22004 for NULL) and a HINT
// that names the field.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { BULK_ACTIONS, JOB_FILTER_FIELDS } from "../../src/contract.ts";
import { sqlJobFilter } from "../../src/job-reads.ts";
import { expectSqlError, inRollback, useTestDatabase } from "../helpers/db.ts";
import { enqueue, makeJobs, unique } from "../helpers/jobs.ts";
import { buildZoo, ZOO_NAMES, type Zoo, type ZooName } from "../helpers/zoo.ts";

const db = useTestDatabase({ poolSize: 2 });

function withZoo(work: (c: pg.PoolClient, zoo: Zoo) => Promise<void>): Promise<void> {
  return inRollback(db.pool, async (c) => work(c, await buildZoo(c)));
}

async function find(c: pg.ClientBase, filter: unknown, beforeId?: string, pageSize?: number): Promise<string[]> {
  const { rows } = await c.query<{ job_id: string }>(
    "SELECT job_id FROM idemq.find_jobs(filter => $1::jsonb, before_id => $2::bigint, page_size => coalesce($3::int, 50))",
    [JSON.stringify(filter), beforeId ?? null, pageSize ?? null],
  );
  return rows.map((r) => r.job_id);
}

/** The zoo names of the ids, in the order given. */
function names(zoo: Zoo, ids: string[]): (ZooName | string)[] {
  return ids.map((id) => ZOO_NAMES.find((n) => zoo[n].id === id) ?? id);
}

/** Zoo names newest first (the zoo's ids grow in build order). */
function newestFirst(zoo: Zoo, list: ZooName[]): ZooName[] {
  return [...list].sort((a, b) => Number(BigInt(zoo[b].id) - BigInt(zoo[a].id)));
}

describe("find_jobs: each filter field", () => {
  it("'{}' matches every job, newest first; task names the zoo's", async () => {
    await withZoo(async (c, zoo) => {
      expect(names(zoo, await find(c, {}))).toEqual(newestFirst(zoo, [...ZOO_NAMES]));
      expect(names(zoo, await find(c, { task: "zoo_task" }))).toEqual(newestFirst(zoo, [...ZOO_NAMES]));
      expect(await find(c, { task: "no_such_task" })).toEqual([]);
    });
  });

  it.each([
    ["ids", (zoo: Zoo) => ({ ids: [Number(zoo.failed.id), zoo.succeeded.id] }), ["failed", "succeeded"]],
    ["state", () => ({ state: ["failed", "expired"] }), ["failed", "expired"]],
    ["state (processing)", () => ({ state: ["processing"] }), ["processing", "leaseExpired", "lastAttempt"]],
    ["queue", () => ({ queue: "zoo.enqueued" }), ["enqueued"]],
    ["key", () => ({ key: "zoo:awaiting" }), ["awaiting"]],
    ["error (the last error, any case)", () => ({ error: "zooerror: BOOM" }), ["failed"]],
    ["error (class or message)", () => ({ error: "ZooError" }), ["failed", "lastAttempt"]],
    ["payload, with the task", () => ({ task: "zoo_task", payload: { zoo: "parent" } }), ["parent"]],
    ["fields together (AND)", () => ({ task: "zoo_task", state: ["failed", "scheduled"], queue: "zoo.failed" }), ["failed"]],
  ] as const)("%s", async (_what, filter, expected) => {
    await withZoo(async (c, zoo) => {
      expect(names(zoo, await find(c, filter(zoo)))).toEqual(newestFirst(zoo, [...expected]));
    });
  });

  it("concurrency_key", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("ck");
      const { job_id } = await enqueue(c, { queue, concurrency_key: "customer:7" });
      await enqueue(c, { queue, concurrency_key: "customer:8" });
      await enqueue(c, { queue });
      expect(await find(c, { queue, concurrency_key: "customer:7" })).toEqual([job_id]);
    });
  });

  it("error is the last entry only: a retried job's last entry is its retry", async () => {
    await withZoo(async (c, zoo) => {
      await c.query("SELECT idemq.retry(job_id => $1)", [zoo.failed.id]);
      expect(await find(c, { error: "boom" })).toEqual([]);
      expect(names(zoo, await find(c, { error: "retried by an operator" }))).toEqual(["failed"]);
    });
  });

  it("created_after / created_before and finished_after / finished_before are [after, before)", async () => {
    await withZoo(async (c, zoo) => {
      const { rows } = await c.query<{ now: string }>("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS now");
      const now = rows[0]!.now;
      await c.query("UPDATE idemq.jobs SET created_at = now() - interval '2 days' WHERE id = $1", [zoo.enqueued.id]);
      expect(names(zoo, await find(c, { created_before: now }))).toEqual(["enqueued"]);
      expect(await find(c, { created_after: now })).not.toContain(zoo.enqueued.id);
      expect((await find(c, { created_after: now })).length).toBe(ZOO_NAMES.length - 1);
      // Finished in this transaction: finished_at = now(), inside [now, ...), outside [..., now).
      const finished: ZooName[] = ["succeeded", "failed", "expired", "cancelled"];
      expect(names(zoo, await find(c, { finished_after: now }))).toEqual(newestFirst(zoo, finished));
      expect(await find(c, { finished_before: now })).toEqual([]);
      // With terminal states the range is read from jobs_by_finish and sorted: the same answer.
      expect(names(zoo, await find(c, { state: ["failed", "expired"], finished_after: now }))).toEqual(newestFirst(zoo, ["failed", "expired"]));
      expect(await find(c, { state: ["failed"], finished_before: now })).toEqual([]);
    });
  });

  it("each row is what job() returns for the job", async () => {
    await withZoo(async (c, zoo) => {
      const found = await c.query("SELECT * FROM idemq.find_jobs(filter => $1::jsonb)", [JSON.stringify({ ids: [zoo.failed.id] })]);
      const one = await c.query("SELECT * FROM idemq.job(job_id => $1)", [zoo.failed.id]);
      expect(found.rows).toHaveLength(1);
      expect(found.rows).toEqual(one.rows);
    });
  });
});

describe("find_jobs: paging", () => {
  it("before_id pages newest first, page_size at a time, to the end", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("paging");
      const ids = await makeJobs(c, 7, { queue });
      const newest = [...ids].reverse();
      const first = await find(c, { queue }, undefined, 3);
      expect(first).toEqual(newest.slice(0, 3));
      const second = await find(c, { queue }, first.at(-1), 3);
      expect(second).toEqual(newest.slice(3, 6));
      expect(await find(c, { queue }, second.at(-1), 3)).toEqual(newest.slice(6));
      expect(await find(c, { queue }, newest.at(-1), 3)).toEqual([]);
    });
  });

  it("a search walks the newest _search_walk() ids, then scans below them: rows of both passes come newest first, page_size in all", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("passes");
      const walk = (await c.query<{ n: number }>("SELECT idemq._search_walk() AS n")).rows[0]!.n;
      const old = await makeJobs(c, 3, { queue });
      // Ids jump past the walk (a sequence is not rolled back: a gap only), so the old jobs lie below a search's first pass.
      await c.query("SELECT setval('idemq.jobs_id_seq', nextval('idemq.jobs_id_seq') + $1)", [walk + 10]);
      const recent = await makeJobs(c, 2, { queue });
      expect(BigInt(recent[0]!) - BigInt(old.at(-1)!)).toBeGreaterThan(BigInt(walk));
      const newest = [...old, ...recent].reverse();
      expect(await find(c, { queue })).toEqual(newest);
      expect(await find(c, { queue }, undefined, 2)).toEqual(newest.slice(0, 2));
      expect(await find(c, { queue }, undefined, 4)).toEqual(newest.slice(0, 4));
      expect(await find(c, { queue }, recent[0], 2)).toEqual(newest.slice(2, 4));
      expect(await find(c, { queue, task: "test_task", payload: { i: 0 } })).toEqual([recent[0], old[0]]);
      const { rows } = await c.query("SELECT * FROM idemq.count_jobs(filter => $1::jsonb, at_most => 10)", [JSON.stringify({ queue })]);
      expect(rows[0]).toEqual({ jobs: 5, exact: true });
    });
  });
});

describe("count_jobs", () => {
  it("counts up to at_most, exact below it", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("count");
      await makeJobs(c, 5, { queue });
      const count = async (atMost: number) =>
        (await c.query("SELECT * FROM idemq.count_jobs(filter => $1::jsonb, at_most => $2)", [JSON.stringify({ queue }), atMost])).rows[0];
      expect(await count(5)).toEqual({ jobs: 5, exact: true });
      expect(await count(4)).toEqual({ jobs: 4, exact: false });
      expect(await count(0)).toEqual({ jobs: 0, exact: false });
    });
  });

  it.each([
    ["retry", ["failed", "expired", "cancelled"]],
    ["cancel", ["scheduled", "enqueued", "processing", "awaiting", "leaseExpired", "lastAttempt", "parent"]],
    ["delete", ["succeeded", "failed", "expired", "cancelled"]],
    ["run_now", ["scheduled", "parent"]],
  ] as const)("with action %s: only the jobs it takes", async (action, expected) => {
    await withZoo(async (c) => {
      const { rows } = await c.query("SELECT * FROM idemq.count_jobs(filter => '{\"task\": \"zoo_task\"}', action => $1)", [action]);
      expect(rows).toEqual([{ jobs: expected.length, exact: true }]);
    });
  });
});

describe("bad input: 22023 (22004 for NULL) naming the field, nothing read", () => {
  const HINT_FIELDS = /[Tt]he fields are ids, state, task, queue, key, concurrency_key, error, created_after/;
  it.each([
    ["an unknown field", { tsk: "x" }, /filter field "tsk" is not a filter field/, HINT_FIELDS],
    ["not an object", ["failed"], /filter must be a JSON object/, HINT_FIELDS],
    ["ids not an array", { ids: 5 }, /"ids" must be an array of 1 to 10000 job ids/, /e\.g\. \{"ids": \[42, "43"\]\}/],
    ["ids empty", { ids: [] }, /"ids" must be an array/, /job ids/],
    ["ids not ids", { ids: [1, -2] }, /"ids" must hold only job ids/, /job ids/],
    ["ids beyond bigint", { ids: ["9223372036854775808"] }, /"ids" must hold only job ids/, /job ids/],
    ["ids of a fraction", { ids: [1.5] }, /"ids" must hold only job ids/, /job ids/],
    ["state a string", { state: "failed" }, /"state" must be a non-empty array of states/, /\{"state": \["failed", "expired"\]\}/],
    ["state unknown", { state: ["failed", "broken"] }, /"state" holds something that is not a state/, /the states are scheduled, enqueued/],
    ["task a number", { task: 7 }, /"task" must be a non-empty string/, /\{"task": "send_email"\}/],
    ["queue empty", { queue: "" }, /"queue" must be a non-empty string/, /\{"queue": "default"\}/],
    ["key too long", { key: "k".repeat(1001) }, /"key" must be a non-empty string of at most 1000 characters/, /invoice:42/],
    ["concurrency_key null", { concurrency_key: null }, /"concurrency_key" must be a non-empty string/, /customer:7/],
    ["error an array", { error: ["x"] }, /"error" must be a non-empty string/, /timeout/],
    ["created_after not a time", { created_after: "yesterday-ish" }, /"created_after" is not a time; got "yesterday-ish"/, /2026-12-01T09:00:00Z/],
    ["created_before a number", { created_before: 1700000000 }, /"created_before" must be a time as a string/, /created_before/],
    ["finished_after infinite", { finished_after: "infinity" }, /"finished_after" must be a finite time/, /finished_after/],
    ["finished_before out of range", { finished_before: "2026-13-45" }, /"finished_before" is not a time/, /finished_before/],
    ["payload not an object", { task: "t", payload: [1] }, /"payload" must be a JSON object/, /payload must contain/],
    ["payload without task", { queue: "q", payload: { a: 1 } }, /"payload" needs task \(or key, or ids\) beside it/, /with the task named/],
  ])("%s", async (_what, filter, message, hint) => {
    for (const call of [
      "SELECT * FROM idemq.find_jobs(filter => $1::jsonb)",
      "SELECT * FROM idemq.count_jobs(filter => $1::jsonb)",
      "SELECT * FROM idemq.cancel_jobs(filter => $1::jsonb)",
    ]) {
      const error = await expectSqlError(db.pool.query(call, [JSON.stringify(filter)]), { code: "22023", message, hint });
      expect(error.message).toMatch(/^(find_jobs|count_jobs|cancel_jobs): /);
    }
  });

  it("a malformed JSON text is PostgreSQL's 22P02 before any function runs", async () => {
    await expectSqlError(db.pool.query("SELECT * FROM idemq.find_jobs(filter => $1::jsonb)", ['{"task": ']), { code: "22P02" });
  });

  it("NULL filter, page_size, at_most; page_size and at_most out of range; an unknown action", async () => {
    await expectSqlError(db.pool.query("SELECT * FROM idemq.find_jobs(filter => NULL)"), { code: "22004", hint: /Pass '\{\}' to match every job/ });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.find_jobs(page_size => NULL)"), { code: "22004", message: /page_size/ });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.find_jobs(page_size => 0)"), { code: "22023", message: /page_size must be between 1 and 1000, not 0/ });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.find_jobs(page_size => 1001)"), { code: "22023", hint: /before_id/ });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.count_jobs(at_most => -1)"), { code: "22023", message: /at_most must be between 0 and 1000000/ });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.count_jobs(at_most => NULL)"), { code: "22004" });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.count_jobs(action => 'purge')"), {
      code: "22023",
      message: /count_jobs: action must be retry, cancel, delete or run_now, not purge/,
      hint: /leave action out/,
    });
  });
});

describe("the TypeScript mirror (src/contract.ts, src/job-reads.ts)", () => {
  it("JOB_FILTER_FIELDS names exactly the fields SQL accepts, in its order", async () => {
    const error = await expectSqlError(db.pool.query(`SELECT * FROM idemq.find_jobs(filter => '{"zzz": 1}')`), { code: "22023" });
    const listed = /The fields are (.*)\.$/.exec(error.hint ?? "")?.[1]?.split(", ");
    expect(listed).toEqual(Object.values(JOB_FILTER_FIELDS));
  });

  it("BULK_ACTIONS are the actions count_jobs takes", async () => {
    const error = await expectSqlError(db.pool.query("SELECT * FROM idemq.count_jobs(action => 'x')"), { code: "22023" });
    expect(/must be (.*), not x$/.exec(error.message)?.[1]).toBe(`${BULK_ACTIONS.slice(0, -1).join(", ")} or ${BULK_ACTIONS.at(-1)}`);
  });

  it("sqlJobFilter turns every JobFilter field into one SQL accepts and matches with", async () => {
    await withZoo(async (c, zoo) => {
      const filter = sqlJobFilter({
        ids: [zoo.failed.id, BigInt(zoo.succeeded.id)],
        state: "failed",
        task: "zoo_task",
        queue: "zoo.failed",
        key: "zoo:failed",
        errorText: "boom",
        createdAfter: new Date(Date.now() - 3_600_000),
        createdBefore: "2999-01-01T00:00:00Z",
        finishedAfter: new Date(Date.now() - 3_600_000),
        finishedBefore: new Date(Date.now() + 3_600_000),
        payload: { zoo: "failed" },
      });
      expect(names(zoo, await find(c, filter))).toEqual(["failed"]);
      expect(await find(c, { ...sqlJobFilter({ concurrencyKey: "none" }) })).toEqual([]);
    });
  });
});
