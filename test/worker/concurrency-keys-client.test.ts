// The client's concurrencyKey (issue 26, item 3): enqueue and enqueueMany pass
// it to SQL, getJob and listJobs say what an awaiting job waits for, and a bad
// key is SQL's 22023 with its hint.
import { describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 3 });

describe("Client concurrencyKey", () => {
  it("enqueue and enqueueMany admit one job of a key and leave the rest waiting for it, as getJob and listJobs show", async () => {
    const client = new Client({ pool: db.pool });
    const queue = unique("client-keys");
    const key = unique("customer");
    const first = await client.enqueue("test_task", {}, { queue, concurrencyKey: key });
    const [second, other] = await client.enqueueMany([
      { task: "test_task", queue, concurrencyKey: key },
      { task: "test_task", queue, concurrencyKey: `${key}:other` },
    ]);
    expect(await client.getJob(first.jobId)).toMatchObject({ state: "enqueued", concurrencyKey: key, waitingFor: null });
    expect(await client.getJob(second!.jobId!)).toMatchObject({ state: "awaiting", concurrencyKey: key, waitingFor: "concurrency_key" });
    expect(await client.getJob(other!.jobId!)).toMatchObject({ state: "enqueued", waitingFor: null });
    const listed = await client.listJobs({ queue, state: "awaiting" });
    expect(listed.map((j) => [j.id, j.waitingFor])).toEqual([[second!.jobId, "concurrency_key"]]);
    const parent = await client.enqueue("test_task", {}, { queue: unique("parents") });
    const child = await client.enqueue("test_task", {}, { queue, after: [parent.jobId] });
    expect((await client.getJob(child.jobId))!.waitingFor).toBe("parents");
  });

  it("an empty key is refused by SQL with its hint, and nothing is enqueued", async () => {
    const client = new Client({ pool: db.pool });
    const queue = unique("client-bad-key");
    const error = await client.enqueue("test_task", {}, { queue, concurrencyKey: "" }).catch((e: unknown) => e);
    expect(error).toMatchObject({ code: "22023" });
    expect(String((error as Error).message)).toMatch(/concurrency_key must be a non-empty string/);
    expect((await db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1", [queue])).rows[0].n).toBe(0);
  });
});
