// Schedules from TypeScript, on a real server: the Client's schedule,
// schedules, scheduleNext and unschedule round trip; createWorker({ schedules })
// refuses a bad list when it is created, upserts a good one at start (all or
// none), leaves the schedules it does not list alone, and several workers
// starting at once with the same list give one row and one job per slot.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  BadArgumentError,
  Client,
  createWorker,
  WorkerConfigError,
  type ScheduleDefinition,
  type Worker,
} from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { scheduleRow, slotJobs } from "../helpers/schedules.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 12 });
let client: Client;
const workers: Worker[] = [];

beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop()));
});
afterAll(async () => {
  await client?.close();
});

function worker(schedules: readonly ScheduleDefinition[], options: { tickInterval?: string | number; queues?: string[] } = {}): Worker {
  const w = createWorker({ pool: db.pool, handleSignals: false, tasks: { report: async () => {} }, schedules, ...options });
  workers.push(w);
  return w;
}

describe("Client schedules", () => {
  it("schedule() creates a row schedules() returns typed; the same definition again keeps its next slot", async () => {
    const name = unique("nightly");
    const next = await client.schedule({
      name,
      cron: "0 3 * * *",
      task: "report",
      payload: { kind: "daily" },
      timezone: "Europe/Berlin",
      overlap: "queue_one",
      misfire: "all",
      misfireGrace: "2m",
      priority: 5,
      maxAttempts: 3,
    });
    expect(next).toBeInstanceOf(Date);
    const row = (await client.schedules()).find((s) => s.name === name)!;
    expect(row).toMatchObject({
      name,
      cron: "0 3 * * *",
      timezone: "Europe/Berlin",
      task: "report",
      queue: "default",
      payload: { kind: "daily" },
      priority: 5,
      maxAttempts: 3,
      overlap: "queue_one",
      misfire: "all",
      misfireGrace: "00:02:00",
      nextAt: next,
      lastSlotAt: null,
      lastJobId: null,
      lastJobState: null,
      skipped: 0,
    });
    expect(row.createdAt).toBeInstanceOf(Date);
    // 03:00 in Berlin is 01:00 or 02:00 UTC, by the season.
    expect([1, 2]).toContain(next.getUTCHours());

    // Moved back, as if a slot were due: re-declaring it unchanged must keep that slot.
    await db.pool.query("UPDATE idemq.schedules SET next_at = next_at - interval '1 day' WHERE name = $1", [name]);
    const due = (await scheduleRow(db.pool, name))!.next_at;
    expect(
      await client.schedule({ name, cron: "0 3 * * *", task: "report", payload: { kind: "daily" }, timezone: "Europe/Berlin" }),
    ).toEqual(due);
    // Options left out took the SQL defaults again: a schedule() call replaces the whole definition.
    expect((await client.schedules()).find((s) => s.name === name)).toMatchObject({ overlap: "skip", misfire: "once", priority: 0 });
    expect(await client.unschedule(name)).toBe(true);
  });

  it("scheduleNext(name) starts with the slot not yet handled; scheduleNext({ cron }) checks an expression, DST included", async () => {
    const name = unique("every");
    await client.schedule({ name, cron: "@every 10s", task: "report" });
    const { nextAt } = (await client.schedules()).find((s) => s.name === name)!;
    const slots = (await client.scheduleNext(name, { count: 3 }))!;
    expect(slots.map((d) => d.getTime())).toEqual([0, 10_000, 20_000].map((ms) => nextAt.getTime() + ms));
    expect(await client.scheduleNext(unique("none"))).toBeNull();

    // 02:30 does not exist in Berlin on 2026-03-29 (clocks go forward): that slot runs at the change, 03:00 CEST.
    const berlin = await client.scheduleNext({ cron: "30 2 * * *", timezone: "Europe/Berlin", after: "2026-03-28T12:00:00Z", count: 2 });
    expect(berlin.map((d) => d.toISOString())).toEqual(["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"]);
    expect(await client.scheduleNext({ cron: "0 0 * * *", after: new Date("2026-01-01T00:00:00Z") })).toEqual([
      new Date("2026-01-02T00:00:00Z"),
    ]);
    await client.unschedule(name);
  });

  it("SQL's refusals arrive as BadArgumentError with the field and a hint; nothing is saved", async () => {
    const name = unique("bad");
    const error = await client.schedule({ name, cron: "0 25 * * *", task: "report" }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BadArgumentError);
    expect(error).toMatchObject({ code: "22023", message: 'cron field 2 (hour) "25" is out of range 0-23' });
    expect((error as BadArgumentError).hint).toMatch(/0-23/);
    await expect(client.schedule({ name, cron: "* * * * *", task: "report", timezone: "Mars/Olympus" })).rejects.toMatchObject({
      code: "22023",
    });
    await expect(client.scheduleNext({ cron: "@every 0s" })).rejects.toBeInstanceOf(BadArgumentError);
    expect(await scheduleRow(db.pool, name)).toBeUndefined();
    expect(await client.unschedule(name)).toBe(false);
  });
});

describe("createWorker({ schedules })", () => {
  it("refuses a bad list when created, naming the entry: an unknown option, a bad policy, a name given twice", () => {
    const base = { name: "a", cron: "* * * * *", task: "report" };
    expect(() => worker([{ ...base, timeZone: "UTC" } as unknown as ScheduleDefinition])).toThrow(WorkerConfigError);
    expect(() => worker([{ ...base, timeZone: "UTC" } as unknown as ScheduleDefinition])).toThrow(
      /^schedules\[0\]: schedule "a": unknown option "timeZone" \(the options are name, cron, task, /,
    );
    expect(() => worker([base, { ...base, overlap: "never" as never }])).toThrow(/^schedules\[1\]: schedule "a": overlap must be one of/);
    expect(() => worker([base, { ...base, cron: "@hourly" }])).toThrow(/^schedules\[1\]: the name "a" is declared twice/);
    expect(() => worker({} as never)).toThrow(/schedules must be an array/);
  });

  it("a definition SQL refuses fails start(), naming the schedule and the fix; none of the list is written", async () => {
    const good = unique("good");
    const bad = unique("bad");
    const w = worker([
      { name: good, cron: "@hourly", task: "report" },
      { name: bad, cron: "0 0 31 2 *", task: "report" },
    ]);
    const error = await w.start().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BadArgumentError);
    expect((error as Error).message).toMatch(new RegExp(`^schedule "${bad}" of the worker's schedules: .*never fires`));
    expect((error as BadArgumentError).hint).toBeTruthy();
    expect(await scheduleRow(db.pool, good)).toBeUndefined();
    expect(await scheduleRow(db.pool, bad)).toBeUndefined();
  });

  it("upserts its schedules at start and leaves the schedules it does not list alone", async () => {
    const other = unique("other-app");
    await client.schedule({ name: other, cron: "@daily", task: "elsewhere" });
    const mine = unique("mine");
    const w = worker([{ name: mine, cron: "@hourly", task: "report" }], { tickInterval: 0 });
    const logs: string[] = [];
    w.on("log", (entry) => logs.push(entry.message));
    await w.start();
    expect((await scheduleRow(db.pool, mine))?.cron).toBe("@hourly");
    expect((await scheduleRow(db.pool, other))?.task).toBe("elsewhere");
    expect(logs).toContain("declared 1 schedule");
  });

  it("warns about a schedule whose task this worker lacks (another worker may have it)", async () => {
    const name = unique("foreign");
    const w = worker([{ name, cron: "@hourly", task: "not_mine" }], { tickInterval: 0 });
    const warnings: string[] = [];
    w.on("log", (entry) => entry.level === "warn" && warnings.push(entry.message));
    await w.start();
    expect(warnings).toEqual([`schedule "${name}": its task "not_mine" is not one of this worker's tasks; its jobs wait for a worker that has it`]);
  });

  it("five workers starting at once with the same schedules: one row, and one job for each slot", async () => {
    const queue = unique("q");
    const name = unique("every-second");
    const list: ScheduleDefinition[] = [
      // overlap "allow": every slot gets its job even while the last one still runs (the default
      // "skip" drops a slot whose previous job has not finished: on a loaded machine a job can
      // take over a second, and that gap is the policy, not a lost slot).
      { name, cron: "@every 1s", task: "report", queue, overlap: "allow" },
      { name: unique("hourly"), cron: "@hourly", task: "report", queue },
    ];
    const five = Array.from({ length: 5 }, () => worker(list, { tickInterval: "100ms", queues: [queue] }));
    await Promise.all(five.map((w) => w.start()));
    const { rows } = await db.pool.query(
      "SELECT count(*)::int AS n, bool_and(updated_at = created_at) AS unchanged FROM idemq.schedules WHERE name = $1",
      [name],
    );
    // One row, written once: the four other declarations found it unchanged.
    expect(rows[0]).toEqual({ n: 1, unchanged: true });
    const jobs = await waitFor(
      async () => {
        const all = await slotJobs(db.pool, name);
        return all.filter((j) => j.state === "succeeded").length >= 4 ? all : undefined;
      },
      { what: "four slots of the schedule to have run", timeoutMs: 30_000, intervalMs: 100 },
    );
    const slots = jobs.map((j) => j.slot);
    expect(new Set(slots).size).toBe(slots.length);
    // Consecutive seconds: no slot was lost while the five declared and ticked.
    const times = slots.map((s) => Date.parse(s));
    for (let i = 1; i < times.length; i++) expect(times[i]! - times[i - 1]!).toBe(1000);
  });
});
