// Concurrent tick() callers on real connections need no leader: each due
// schedule row is locked FOR UPDATE SKIP LOCKED by one of them, and its
// slots' keys make a replay create nothing. A stress test (8 callers, 100
// due slots, misfire all: exactly one job per slot) and interleavings whose
// order is fixed: a second tick while the first holds the row skips it
// without waiting; schedule() on a row being ticked waits (pg_blocking_pids).
import type pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { interleave, useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { schedule, scheduleRow, slotJobs } from "../helpers/schedules.ts";

const CALLERS = 8;

const db = useTestDatabase({ poolSize: 4 });
let clients: pg.Client[];
beforeAll(async () => {
  clients = [];
  for (let i = 0; i < CALLERS; i++) {
    const c = await db.newClient();
    clients.push(c);
  }
});

async function tick(c: pg.ClientBase): Promise<number> {
  const { rows } = await c.query<{ n: number }>("SELECT idemq.tick() AS n");
  return rows[0]!.n;
}

/** A per-minute schedule (misfire all, overlap allow) whose 100 latest slots up to this minute are due. */
async function hundredDue(): Promise<string> {
  const name = unique("burst");
  await schedule(db.pool, { name, cron: "* * * * *", queue: unique("q"), overlap: "allow", misfire: "all" });
  await db.pool.query("UPDATE idemq.schedules SET next_at = date_trunc('minute', now()) - interval '99 minutes' WHERE name = $1", [name]);
  return name;
}

async function unschedule(name: string): Promise<void> {
  await db.pool.query("SELECT idemq.unschedule(name => $1)", [name]);
}

describe("concurrent ticks", () => {
  it(`${CALLERS} concurrent tick() callers over 100 due slots: exactly one job per slot, 100 in all`, async () => {
    const name = await hundredDue();
    try {
      const created = await Promise.all(clients.map((c) => tick(c)));
      // If the minute turned between setup and the ticks, 101 slots were due
      // and the bound (the latest 100) still gives 100.
      expect(created.reduce((a, b) => a + b, 0)).toBe(100);
      const jobs = await slotJobs(db.pool, name);
      expect(jobs).toHaveLength(100);
      expect(new Set(jobs.map((j) => j.slot)).size).toBe(100);
      // Consecutive minutes, one job each.
      const times = jobs.map((j) => Date.parse(j.slot));
      expect(times.slice(1).map((t, i) => t - times[i]!)).toEqual(Array(99).fill(60_000));
      // Once more, all of them at once: nothing is due.
      expect(await Promise.all(clients.map((c) => tick(c)))).toEqual(Array(CALLERS).fill(0));
    } finally {
      await unschedule(name);
    }
  });

  it(`${CALLERS} callers over ${CALLERS * 2} due schedules: they split the schedules, each slot once`, async () => {
    const names: string[] = [];
    try {
      for (let i = 0; i < CALLERS * 2; i++) {
        const name = unique("many");
        await schedule(db.pool, { name, cron: "* * * * *", queue: unique("q"), overlap: "allow", misfire: "all" });
        await db.pool.query("UPDATE idemq.schedules SET next_at = date_trunc('minute', now()) - interval '4 minutes' WHERE name = $1", [name]);
        names.push(name);
      }
      const created = await Promise.all(clients.map((c) => tick(c)));
      const perSchedule = await Promise.all(names.map((n) => slotJobs(db.pool, n)));
      const total = perSchedule.reduce((a, jobs) => a + jobs.length, 0);
      expect(created.reduce((a, b) => a + b, 0)).toBe(total);
      for (const jobs of perSchedule) {
        // 5 slots (6 if the minute turned meanwhile), each with one job.
        expect(jobs.length).toBeGreaterThanOrEqual(5);
        expect(jobs.length).toBeLessThanOrEqual(6);
        expect(new Set(jobs.map((j) => j.slot)).size).toBe(jobs.length);
      }
    } finally {
      for (const n of names) await unschedule(n);
    }
  });
});

describe("interleavings", () => {
  it("while one tick holds a due schedule, a second tick skips it at once (no wait); after the commit nothing is left due", async () => {
    const name = await hundredDue();
    const [first, second] = clients as [pg.Client, pg.Client];
    try {
      await first.query("BEGIN");
      expect(await tick(first)).toBe(100);
      // Not blocked: SKIP LOCKED. It creates nothing for the held schedule.
      expect(await tick(second)).toBe(0);
      await first.query("COMMIT");
      expect(await tick(second)).toBe(0);
      expect(await slotJobs(db.pool, name)).toHaveLength(100);
    } finally {
      await first.query("ROLLBACK").catch(() => {});
      await unschedule(name);
    }
  });

  it("a tick that rolls back leaves the slots due: the next tick creates them", async () => {
    const name = await hundredDue();
    const [first, second] = clients as [pg.Client, pg.Client];
    try {
      await first.query("BEGIN");
      expect(await tick(first)).toBe(100);
      await first.query("ROLLBACK");
      expect(await tick(second)).toBe(100);
      expect(await slotJobs(db.pool, name)).toHaveLength(100);
    } finally {
      await unschedule(name);
    }
  });

  it("schedule() of a schedule being ticked waits for the tick's commit, then sees its next_at", async () => {
    const name = await hundredDue();
    const [first, second] = clients as [pg.Client, pg.Client];
    try {
      const run = await interleave(db.pool, {
        first,
        holds: (c) => tick(c),
        second,
        blocks: (c) => schedule(c, { name, cron: "* * * * *", queue: "other", overlap: "allow", misfire: "all" }),
        end: "COMMIT",
      });
      expect(run.blockers).toContain(run.firstPid);
      const redefined = await run.second;
      const row = await scheduleRow(db.pool, name);
      expect(row!.queue).toBe("other");
      expect(redefined).toEqual(row!.next_at);
      expect(row!.next_at.getTime()).toBeGreaterThan(Date.now() - 60_000);
      expect(await tick(second)).toBe(0);
    } finally {
      await first.query("ROLLBACK").catch(() => {});
      await unschedule(name);
    }
  });
});
