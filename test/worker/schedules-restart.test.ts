// Declarative schedules across restarts, with real `idemq worker` processes
// whose tasks module exports `schedules`: restarted twice (SIGTERM, start
// again), the worker re-declares its schedule each time and the schedule
// keeps one row, never rewritten, and one job per slot, its slots consecutive (the short
// downtimes are within misfire_grace, so no slot is lost either). A module
// whose schedule SQL refuses stops the worker at start: one line naming the
// schedule, exit 2.
import { afterEach, describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { slotJobs } from "../helpers/schedules.ts";
import { killAllWorkers, startedWorker, startWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });

afterEach(async () => {
  await killAllWorkers();
});

/** Waits until the schedule has at least `n` succeeded slot jobs; returns all its jobs. */
function succeededSlots(name: string, n: number) {
  return waitFor(
    async () => {
      const jobs = await slotJobs(db.pool, name);
      return jobs.filter((j) => j.state === "succeeded").length >= n ? jobs : undefined;
    },
    { what: `${n} succeeded slots of ${name}`, timeoutMs: 30_000, intervalMs: 100 },
  );
}

describe("idemq worker with a tasks module exporting schedules", () => {
  it("restarted twice, keeps one schedule row and one job per slot, its slots consecutive", async () => {
    const env = { IDEMQ_TEST_SCHEDULE: "restarts" };
    let ran = 0;
    for (let run = 1; run <= 3; run++) {
      const proc = await startedWorker({ tasks: "schedule-tasks.ts", databaseUrl: db.url, env });
      const declared = await proc.waitForEvent((e) => e.event === "log" && e.message === "declared 1 schedule", "the declaration line");
      expect(declared.schedules).toEqual(["restarts"]);
      ran = (await succeededSlots("restarts", ran + 2)).filter((j) => j.state === "succeeded").length;
      proc.child.kill("SIGTERM");
      expect((await proc.exited).code).toBe(0);
    }
    // Re-declared unchanged at each start: never rewritten.
    const { rows } = await db.pool.query("SELECT count(*)::int AS n, bool_and(updated_at = created_at) AS unchanged FROM idemq.schedules");
    expect(rows[0]).toEqual({ n: 1, unchanged: true });
    const jobs = await slotJobs(db.pool, "restarts");
    expect(jobs.length).toBeGreaterThanOrEqual(6);
    const slots = jobs.map((j) => j.slot);
    expect(new Set(slots).size).toBe(slots.length);
    const times = slots.map((s) => Date.parse(s));
    for (let i = 1; i < times.length; i++) expect(times[i]! - times[i - 1]!, `after slot ${slots[i - 1]}`).toBe(1000);
  });

  it("a schedule SQL refuses stops the worker before it starts: one line naming it and the fix, exit 2, nothing saved", async () => {
    const proc = startWorker({
      tasks: "schedule-tasks.ts",
      databaseUrl: db.url,
      env: { IDEMQ_TEST_SCHEDULE: "broken", IDEMQ_TEST_CRON: "61 * * * *" },
    });
    const { code } = await proc.exited;
    expect(code).toBe(2);
    expect(proc.stderr().trim()).toMatch(
      /^idemq: schedule "broken" of the worker's schedules: cron field 1 \(minute\) "61" is out of range 0-59 \(SQLSTATE 22023\); .+$/,
    );
    expect(proc.count("worker:started")).toBe(0);
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.schedules WHERE name = 'broken'");
    expect(rows[0].n).toBe(0);
  });
});
