// tick() on a clock the test sets (idemq._tick(at), which tick() calls with
// now()): each due slot once, with key schedule:<name>:<slot>; the overlap
// policies skip (counted), allow and queue_one; the misfire policies once,
// skip and all after a simulated downtime of 10 slots (next_at moved back),
// with the misfire_grace boundary and the 100-slot bound; a schedule whose job
// enqueue refuses (a limit lowered after schedule()) is skipped with its error
// recorded while the others fire. Each test runs in a
// transaction that rolls back, so no test's schedules are due in another's.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { useTestDatabase, inRollback } from "../helpers/db.ts";
import { jobRow, unique } from "../helpers/jobs.ts";
import { schedule, scheduleRow, setNextAt, slotJobs, tickAt, type ScheduleArgs } from "../helpers/schedules.ts";
import { claimJob, complete } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });

/** A schedule every 5 minutes (unless given) in its own queue, whose next slot is `nextAt`. */
async function every5(c: pg.ClientBase, nextAt: string, args: ScheduleArgs = {}): Promise<string> {
  const name = unique("s");
  await schedule(c, { name, cron: "*/5 * * * *", queue: unique("q"), ...args });
  await setNextAt(c, name, nextAt);
  return name;
}

const slots = (...times: string[]) => times.map((t) => `2030-01-01T${t}:00Z`);

describe("tick: one job per due slot", () => {
  it("enqueues the due slot with key schedule:<name>:<slot UTC>, the schedule's task, payload, queue, priority and attempts", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T12:00:00Z", { task: "nightly", payload: { region: "eu" }, priority: 5, max_attempts: 3 });
      expect(await tickAt(c, "2030-01-01T12:00:10Z")).toBe(1);
      const jobs = await slotJobs(c, name);
      expect(jobs.map((j) => [j.slot, j.state])).toEqual([["2030-01-01T12:00:00Z", "enqueued"]]);
      const row = await scheduleRow(c, name);
      expect(await jobRow(c, jobs[0]!.id)).toMatchObject({
        task: "nightly", payload: { region: "eu" }, queue: row!.queue, priority: 5, max_attempts: 3,
        idempotency_key: `schedule:${name}:2030-01-01T12:00:00Z`,
      });
      expect(row).toMatchObject({
        next_at: new Date("2030-01-01T12:05:00Z"), last_slot_at: new Date("2030-01-01T12:00:00Z"),
        last_job_id: jobs[0]!.id, last_job_state: "enqueued", skipped: "0",
      });
    });
  });

  it("before next_at nothing is due; a second tick at the same clock enqueues nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T12:00:00Z");
      expect(await tickAt(c, "2030-01-01T11:59:59.999999Z")).toBe(0);
      expect(await tickAt(c, "2030-01-01T12:00:00Z")).toBe(1);
      expect(await tickAt(c, "2030-01-01T12:00:00Z")).toBe(0);
      expect(await tickAt(c, "2030-01-01T12:04:59Z")).toBe(0);
      expect((await slotJobs(c, name)).map((j) => j.slot)).toEqual(slots("12:00"));
    });
  });

  it("a slot replayed (next_at moved back over it) gets no second job, even after its job finished", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T12:00:00Z");
      expect(await tickAt(c, "2030-01-01T12:00:10Z")).toBe(1);
      const [job] = await slotJobs(c, name);
      await complete(c, job!.id, await claimJob(c, job!.id));
      await setNextAt(c, name, "2030-01-01T12:00:00Z");
      expect(await tickAt(c, "2030-01-01T12:00:20Z")).toBe(0);
      expect((await slotJobs(c, name)).map((j) => [j.slot, j.state])).toEqual([["2030-01-01T12:00:00Z", "succeeded"]]);
    });
  });

  it("tick() runs on now(): a schedule whose next slot has passed gets its job", async () => {
    await inRollback(db.pool, async (c) => {
      const name = unique("now");
      await schedule(c, { name, cron: "* * * * *", queue: unique("q") });
      await c.query("UPDATE idemq.schedules SET next_at = date_trunc('minute', now()) WHERE name = $1", [name]);
      const { rows } = await c.query<{ n: number }>("SELECT idemq.tick() AS n");
      expect(rows[0]!.n).toBeGreaterThanOrEqual(1);
      const { rows: expected } = await c.query<{ slot: string }>(
        `SELECT to_char(date_trunc('minute', now()) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS slot`,
      );
      expect((await slotJobs(c, name)).map((j) => j.slot)).toEqual([expected[0]!.slot]);
    });
  });
});

describe("overlap", () => {
  it("skip (default): while the previous job is active the slot is skipped and counted; once it finished the next slot runs", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T12:00:00Z");
      expect(await tickAt(c, "2030-01-01T12:00:10Z")).toBe(1);
      const [first] = await slotJobs(c, name);
      expect(await tickAt(c, "2030-01-01T12:05:10Z")).toBe(0); // enqueued, not started: active
      const attempt = await claimJob(c, first!.id);
      expect(await tickAt(c, "2030-01-01T12:10:10Z")).toBe(0); // processing: active
      expect(await scheduleRow(c, name)).toMatchObject({ skipped: "2", last_job_id: first!.id, last_job_state: "processing" });
      await complete(c, first!.id, attempt);
      expect(await tickAt(c, "2030-01-01T12:15:10Z")).toBe(1);
      expect((await slotJobs(c, name)).map((j) => [j.slot, j.state])).toEqual([
        ["2030-01-01T12:00:00Z", "succeeded"],
        ["2030-01-01T12:15:00Z", "enqueued"],
      ]);
      expect(await scheduleRow(c, name)).toMatchObject({ skipped: "2", last_slot_at: new Date("2030-01-01T12:15:00Z") });
    });
  });

  it("skip: a job that failed for good is not active, so the next slot runs", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T12:00:00Z", { max_attempts: 1 });
      await tickAt(c, "2030-01-01T12:00:10Z");
      const [first] = await slotJobs(c, name);
      const attempt = await claimJob(c, first!.id);
      await c.query("SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{}')", [first!.id, attempt]);
      expect(await tickAt(c, "2030-01-01T12:05:10Z")).toBe(1);
      expect((await scheduleRow(c, name))!.skipped).toBe("0");
    });
  });

  it("allow: a slot runs while the previous job is active, nothing counted", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T12:00:00Z", { overlap: "allow" });
      expect(await tickAt(c, "2030-01-01T12:00:10Z")).toBe(1);
      expect(await tickAt(c, "2030-01-01T12:05:10Z")).toBe(1);
      expect((await slotJobs(c, name)).map((j) => [j.slot, j.state])).toEqual([
        ["2030-01-01T12:00:00Z", "enqueued"],
        ["2030-01-01T12:05:00Z", "enqueued"],
      ]);
      expect((await scheduleRow(c, name))!.skipped).toBe("0");
    });
  });

  it("queue_one: at most one run waits behind the running one; it starts after that one succeeded", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T12:00:00Z", { overlap: "queue_one" });
      expect(await tickAt(c, "2030-01-01T12:00:10Z")).toBe(1);
      const [first] = await slotJobs(c, name);
      expect(await tickAt(c, "2030-01-01T12:05:10Z")).toBe(0); // the first has not started: it is the waiting run
      const attempt = await claimJob(c, first!.id);
      expect(await tickAt(c, "2030-01-01T12:10:10Z")).toBe(1); // queued behind the running one
      expect(await tickAt(c, "2030-01-01T12:15:10Z")).toBe(0); // one waits already
      let jobs = await slotJobs(c, name);
      expect(jobs.map((j) => [j.slot, j.state])).toEqual([
        ["2030-01-01T12:00:00Z", "processing"],
        ["2030-01-01T12:10:00Z", "awaiting"],
      ]);
      await complete(c, first!.id, attempt);
      jobs = await slotJobs(c, name);
      expect(jobs.map((j) => j.state)).toEqual(["succeeded", "enqueued"]);
      expect(await tickAt(c, "2030-01-01T12:20:10Z")).toBe(0); // the queued one has not started yet
      expect((await scheduleRow(c, name))!.skipped).toBe("3");
      await claimJob(c, jobs[1]!.id);
      expect(await tickAt(c, "2030-01-01T12:25:10Z")).toBe(1);
      expect((await slotJobs(c, name)).map((j) => [j.slot, j.state])).toEqual([
        ["2030-01-01T12:00:00Z", "succeeded"],
        ["2030-01-01T12:10:00Z", "processing"],
        ["2030-01-01T12:25:00Z", "awaiting"],
      ]);
    });
  });
});

describe("misfire after a downtime of 10 slots (11:15 .. 12:00 missed; ticks resume at 12:02:30)", () => {
  const missed = slots("11:15", "11:20", "11:25", "11:30", "11:35", "11:40", "11:45", "11:50", "11:55", "12:00");

  it("once (default): one run, for the latest missed slot; then the schedule goes on", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T11:15:00Z", { overlap: "allow" });
      expect(await tickAt(c, "2030-01-01T12:02:30Z")).toBe(1);
      expect((await slotJobs(c, name)).map((j) => j.slot)).toEqual(slots("12:00"));
      expect((await scheduleRow(c, name))!.next_at).toEqual(new Date("2030-01-01T12:05:00Z"));
      expect(await tickAt(c, "2030-01-01T12:05:05Z")).toBe(1);
      expect((await slotJobs(c, name)).map((j) => j.slot)).toEqual(slots("12:00", "12:05"));
    });
  });

  it("skip: no run for the missed slots, only the next one", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T11:15:00Z", { overlap: "allow", misfire: "skip" });
      expect(await tickAt(c, "2030-01-01T12:02:30Z")).toBe(0);
      expect(await slotJobs(c, name)).toEqual([]);
      expect((await scheduleRow(c, name))!.next_at).toEqual(new Date("2030-01-01T12:05:00Z"));
      expect(await tickAt(c, "2030-01-01T12:05:05Z")).toBe(1);
      expect((await slotJobs(c, name)).map((j) => j.slot)).toEqual(slots("12:05"));
    });
  });

  it("all: each missed slot runs once, in order", async () => {
    await inRollback(db.pool, async (c) => {
      const name = await every5(c, "2030-01-01T11:15:00Z", { overlap: "allow", misfire: "all" });
      expect(await tickAt(c, "2030-01-01T12:02:30Z")).toBe(10);
      expect((await slotJobs(c, name)).map((j) => j.slot)).toEqual(missed);
      expect(await tickAt(c, "2030-01-01T12:02:40Z")).toBe(0);
      expect((await scheduleRow(c, name))!.last_slot_at).toEqual(new Date("2030-01-01T12:00:00Z"));
    });
  });

  it("once with overlap skip: the one run is not also skipped; all with overlap skip runs the first and counts 9", async () => {
    await inRollback(db.pool, async (c) => {
      const once = await every5(c, "2030-01-01T11:15:00Z");
      const all = await every5(c, "2030-01-01T11:15:00Z", { misfire: "all" });
      expect(await tickAt(c, "2030-01-01T12:02:30Z")).toBe(2);
      expect((await slotJobs(c, once)).map((j) => j.slot)).toEqual(slots("12:00"));
      expect((await slotJobs(c, all)).map((j) => j.slot)).toEqual(slots("11:15"));
      expect((await scheduleRow(c, once))!.skipped).toBe("0");
      expect((await scheduleRow(c, all))!.skipped).toBe("9");
    });
  });

  it("a slot on time (late by less than misfire_grace) runs under every policy; the missed ones as the policy says", async () => {
    await inRollback(db.pool, async (c) => {
      const names = {
        once: await every5(c, "2030-01-01T11:15:00Z", { overlap: "allow", misfire: "once" }),
        skip: await every5(c, "2030-01-01T11:15:00Z", { overlap: "allow", misfire: "skip" }),
        all: await every5(c, "2030-01-01T11:15:00Z", { overlap: "allow", misfire: "all" }),
      };
      // 12:00 is 30 seconds late: on time; 11:15 .. 11:55 are missed.
      expect(await tickAt(c, "2030-01-01T12:00:30Z")).toBe(1 + 1 + 10);
      expect((await slotJobs(c, names.once)).map((j) => j.slot)).toEqual(slots("12:00"));
      expect((await slotJobs(c, names.skip)).map((j) => j.slot)).toEqual(slots("12:00"));
      expect((await slotJobs(c, names.all)).map((j) => j.slot)).toEqual(missed);
    });
  });

  it("misfire_grace boundary: late by just under the grace is on time, late by exactly the grace is missed", async () => {
    await inRollback(db.pool, async (c) => {
      const inside = await every5(c, "2030-01-01T12:00:00Z", { misfire: "skip", misfire_grace: "2 minutes" });
      expect(await tickAt(c, "2030-01-01T12:01:59.999999Z")).toBe(1);
      expect((await slotJobs(c, inside)).map((j) => j.slot)).toEqual(slots("12:00"));
    });
    await inRollback(db.pool, async (c) => {
      const outside = await every5(c, "2030-01-01T12:00:00Z", { misfire: "skip", misfire_grace: "2 minutes" });
      expect(await tickAt(c, "2030-01-01T12:02:00Z")).toBe(0);
      expect(await slotJobs(c, outside)).toEqual([]);
    });
  });

  it("all is bounded: after 721 missed minutes only the latest 100 slots run", async () => {
    await inRollback(db.pool, async (c) => {
      const name = unique("bound");
      await schedule(c, { name, cron: "* * * * *", queue: unique("q"), overlap: "allow", misfire: "all" });
      await setNextAt(c, name, "2030-01-01T00:00:00Z");
      expect(await tickAt(c, "2030-01-01T12:00:30Z")).toBe(100);
      const jobs = await slotJobs(c, name);
      expect(jobs).toHaveLength(100);
      expect([jobs[0]!.slot, jobs.at(-1)!.slot]).toEqual(slots("10:21", "12:00"));
      expect((await scheduleRow(c, name))!.next_at).toEqual(new Date("2030-01-01T12:01:00Z"));
    });
  });

  it("a long downtime costs no walk over every missed slot: a per-second schedule down for 30 days, once, grace 1 second", async () => {
    await inRollback(db.pool, async (c) => {
      const name = unique("long");
      await schedule(c, { name, cron: "* * * * * *", queue: unique("q"), misfire_grace: "1 second" });
      await setNextAt(c, name, "2029-12-02T00:00:00Z");
      const started = Date.now();
      expect(await tickAt(c, "2030-01-01T12:00:30.5Z")).toBe(1);
      expect(Date.now() - started).toBeLessThan(10_000);
      expect((await slotJobs(c, name)).map((j) => j.slot)).toEqual(["2030-01-01T12:00:30Z"]);
    });
  });
});

describe("a schedule whose job enqueue refuses (a limit lowered after schedule() accepted it)", () => {
  const setLimit = (c: pg.ClientBase, name: string, value: number) =>
    c.query("UPDATE idemq.settings SET value = $2 WHERE name = $1", [name, value]);

  it("is skipped with its error recorded, the others fire; once the limit is raised the next tick fires it and clears the error", async () => {
    await inRollback(db.pool, async (c) => {
      const good = await every5(c, "2030-01-01T12:00:00Z", { payload: { n: 1 } });
      const big = await every5(c, "2030-01-01T12:00:00Z", { payload: { blob: "x".repeat(200) } });
      const long = await every5(c, "2030-01-01T12:00:00Z", { task: "a_task_name_of_30_bytes_______" });
      await setLimit(c, "payload_bytes", 100);
      await setLimit(c, "task_bytes", 20);

      expect(await tickAt(c, "2030-01-01T12:00:10Z")).toBe(1);
      expect((await slotJobs(c, good)).map((j) => j.slot)).toEqual(slots("12:00"));
      expect(await slotJobs(c, big)).toEqual([]);
      expect(await slotJobs(c, long)).toEqual([]);
      expect(await scheduleRow(c, good)).toMatchObject({ next_at: new Date("2030-01-01T12:05:00Z"), last_error: null, last_error_at: null });
      // Still due (next_at kept), nothing else of it changed, and why.
      expect(await scheduleRow(c, big)).toMatchObject({
        next_at: new Date("2030-01-01T12:00:00Z"), last_slot_at: null, last_job_id: null, skipped: "0",
        last_error: expect.stringMatching(/^payload is \d+ bytes of JSON text, over the limit of 100 bytes \(payload_bytes\): .* \(SQLSTATE 22023\)$/),
        last_error_at: new Date("2030-01-01T12:00:10Z"),
      });
      expect(await scheduleRow(c, long)).toMatchObject({
        next_at: new Date("2030-01-01T12:00:00Z"),
        last_error: expect.stringMatching(/task_bytes.*\(SQLSTATE 22023\)$/),
        last_error_at: new Date("2030-01-01T12:00:10Z"),
      });

      // Every later tick tries again and records when.
      expect(await tickAt(c, "2030-01-01T12:00:40Z")).toBe(0);
      expect((await scheduleRow(c, big))!.last_error_at).toEqual(new Date("2030-01-01T12:00:40Z"));

      // The limits raised: the next tick fires both (the 12:00 slot, missed by more than the grace: misfire once) and clears the errors.
      await setLimit(c, "payload_bytes", 1048576);
      await setLimit(c, "task_bytes", 256);
      expect(await tickAt(c, "2030-01-01T12:02:00Z")).toBe(2);
      for (const name of [big, long]) {
        expect((await slotJobs(c, name)).map((j) => [j.slot, j.state])).toEqual([["2030-01-01T12:00:00Z", "enqueued"]]);
        expect(await scheduleRow(c, name)).toMatchObject({
          next_at: new Date("2030-01-01T12:05:00Z"), last_slot_at: new Date("2030-01-01T12:00:00Z"), last_error: null, last_error_at: null,
        });
      }
    });
  });

  it("none of its slots of that call is kept: misfire all with 3 missed slots enqueues none of them, and the others still fire", async () => {
    await inRollback(db.pool, async (c) => {
      const good = await every5(c, "2030-01-01T12:00:00Z");
      const bad = await every5(c, "2030-01-01T11:50:00Z", { payload: { blob: "x".repeat(200) }, misfire: "all", overlap: "allow" });
      await setLimit(c, "payload_bytes", 100);
      expect(await tickAt(c, "2030-01-01T12:00:10Z")).toBe(1);
      expect(await slotJobs(c, bad)).toEqual([]);
      expect((await slotJobs(c, good)).map((j) => j.slot)).toEqual(slots("12:00"));
      expect((await scheduleRow(c, bad))!.last_error).toMatch(/payload_bytes/);
      await setLimit(c, "payload_bytes", 1048576);
      expect(await tickAt(c, "2030-01-01T12:00:20Z")).toBe(3);
      expect((await slotJobs(c, bad)).map((j) => j.slot)).toEqual(slots("11:50", "11:55", "12:00"));
    });
  });

  it("tick() itself returns normally (the error is the schedule's, not the caller's)", async () => {
    await inRollback(db.pool, async (c) => {
      const name = unique("now");
      await schedule(c, { name, cron: "* * * * *", queue: unique("q"), payload: { blob: "x".repeat(200) } });
      await c.query("UPDATE idemq.schedules SET next_at = date_trunc('minute', now()) WHERE name = $1", [name]);
      await setLimit(c, "payload_bytes", 100);
      const { rows } = await c.query<{ n: number }>("SELECT idemq.tick() AS n");
      expect(rows[0]!.n).toBe(0);
      expect((await scheduleRow(c, name))!.last_error).toMatch(/\(SQLSTATE 22023\)$/);
    });
  });
});
