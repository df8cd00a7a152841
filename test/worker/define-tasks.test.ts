// defineTasks at run time: it checks the tasks as createWorker does and
// returns them unchanged; tasks declared with it run in a worker fed by a
// Client typed with them, and ctx.job.payload is the payload the handler
// receives. (The compile-time checks are in test/types/typed-tasks.ts.)
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, defineTasks, WorkerConfigError } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 4 });
beforeAll(async () => {
  await db.pool.query("CREATE TABLE ledger (order_id int PRIMARY KEY, amount int NOT NULL)");
});
afterEach(stopWorkers);

describe("defineTasks", () => {
  it("returns the tasks object itself", () => {
    const greet = async (p: { name: string }) => p.name;
    const definition = { greet };
    expect(defineTasks(definition)).toBe(definition);
  });

  it("refuses what createWorker refuses, naming the task and the option", () => {
    const ping = async () => "pong";
    expect(() => defineTasks({ ping: { run: ping, retries: 3 } as never })).toThrow(
      new WorkerConfigError('task "ping" has an unknown option "retries" (options: run, transactional, guardKey, maxAttempts, backoff, exceptOn, onlyOn, lease, timeout, concurrencyLimit, rateLimit)'),
    );
    expect(() => defineTasks({})).toThrow(WorkerConfigError);
  });

  it("tasks it declares run in a worker; ctx.job.payload is the handler's payload; a transactional task's guard key dedupes", async () => {
    const seen: unknown[] = [];
    const tasks = defineTasks({
      credit: {
        transactional: true,
        guardKey: (p) => `credit:${String(p.orderId)}`,
        run: async (p: { orderId: number; amount: number }, ctx) => {
          seen.push(ctx.job.payload);
          await ctx.tx.query("INSERT INTO ledger (order_id, amount) VALUES ($1, $2)", [p.orderId, p.amount]);
        },
      },
      send_greeting: async (p: { name: string }, ctx) => {
        seen.push(ctx.job.payload);
        return { greeted: p.name };
      },
    });
    const client = new Client<typeof tasks>({ pool: db.pool });
    await startTestWorker(db.url, tasks);

    const greeting = await client.enqueue("send_greeting", { name: "Ada" });
    const [first, second] = await client.enqueueMany([
      { task: "credit", payload: { orderId: 7, amount: 10 } },
      { task: "credit", payload: { orderId: 7, amount: 10 } },
    ]);
    const ids = [greeting.jobId, first!.jobId!, second!.jobId!];
    const jobs = await waitFor(
      async () => {
        const all = await Promise.all(ids.map((id) => client.getJob(id)));
        return all.every((job) => job?.state === "succeeded") && all;
      },
      { what: "the three jobs to succeed" },
    );
    expect(jobs[0]!.result).toEqual({ greeted: "Ada" });
    // The second credit found the guard row: its handler never ran.
    expect(seen).toHaveLength(2);
    expect(seen).toEqual(expect.arrayContaining([{ name: "Ada" }, { orderId: 7, amount: 10 }]));
    const { rows } = await db.pool.query("SELECT order_id, amount FROM ledger");
    expect(rows).toEqual([{ order_id: 7, amount: 10 }]);
  });
});
