// The worker's tick() service: runOnce() (what its timer calls) enqueues the
// due slots of the schedules, and a started worker ticks on its own timer and
// runs the slot's job. Two workers ticking the same schedule give one job.
import { afterAll, describe, expect, it } from "vitest";
import { createWorker, type Worker } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { schedule, slotJobs } from "../helpers/schedules.ts";

const db = useTestDatabase({ poolSize: 8 });
const workers: Worker[] = [];

afterAll(async () => {
  await Promise.all(workers.map((w) => w.stop()));
});

function worker(options: { tickInterval?: string; queues?: string[] } = {}): Worker {
  const w = createWorker({ pool: db.pool, handleSignals: false, tasks: { report: async () => {} }, ...options });
  workers.push(w);
  return w;
}

/** A per-minute schedule in its own queue whose current minute's slot is due. */
async function dueSchedule(queue: string): Promise<string> {
  const name = unique("tick");
  await schedule(db.pool, { name, cron: "* * * * *", task: "report", queue });
  await db.pool.query("UPDATE idemq.schedules SET next_at = date_trunc('minute', now()) WHERE name = $1", [name]);
  return name;
}

describe("ticker", () => {
  it("runOnce() calls tick(): the due slot gets one job; from a second worker, none", async () => {
    const name = await dueSchedule(unique("q"));
    expect(await worker().ticker.runOnce()).toBe(1);
    expect(await worker().ticker.runOnce()).toBe(0);
    expect(await slotJobs(db.pool, name)).toHaveLength(1);
    await db.pool.query("SELECT idemq.unschedule(name => $1)", [name]);
  });

  it("a started worker ticks on its timer and runs the slot's job", async () => {
    const queue = unique("q");
    const name = await dueSchedule(queue);
    const w = worker({ tickInterval: "100ms", queues: [queue] });
    await w.start();
    const deadline = Date.now() + 20_000;
    let states: string[] = [];
    while (Date.now() < deadline) {
      states = (await slotJobs(db.pool, name)).map((j) => j.state);
      if (states.includes("succeeded")) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(states).toEqual(["succeeded"]);
    await w.stop();
    await db.pool.query("SELECT idemq.unschedule(name => $1)", [name]);
  });
});
