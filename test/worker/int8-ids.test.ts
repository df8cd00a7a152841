// pg's type parsers are global: an application may make it parse int8 as
// numbers (setTypeParser(20, ...)). The worker's own calls that carry job ids
// (claim, heartbeat, its batched complete_many) bring their own int8 parser,
// so ids stay exact strings and the ids heartbeat and complete_many return
// match the ones claim gave: no job is taken for lost.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let w: TestWorker;
const releases = new Map<string, () => void>();
const idTypes: string[] = [];
const int8 = pg.types.getTypeParser(20, "text");

beforeAll(async () => {
  pg.types.setTypeParser(20, "text", Number);
  w = await startTestWorker(
    db.url,
    {
      quick: async (_p, ctx) => {
        idTypes.push(typeof ctx.job.id);
      },
      long: async (_p, ctx) => new Promise<void>((resolve) => releases.set(ctx.job.id, resolve)),
    },
    { lease: "1s", heartbeatInterval: "200ms", rescueInterval: "100ms" },
  );
});
afterAll(async () => {
  await stopWorkers();
  pg.types.setTypeParser(20, "text", int8);
});

async function enqueue(task: string): Promise<string> {
  const { rows } = await db.pool.query<{ id: string }>("SELECT job_id::text AS id FROM idemq.enqueue(task => $1)", [task]);
  return rows[0]!.id;
}

async function stateOf(id: string): Promise<{ state: string; attempt: number; lease_ms: number | null }> {
  const { rows } = await db.pool.query(
    "SELECT state::text, attempt, (extract(epoch FROM lease_expires_at) * 1000)::float8 AS lease_ms FROM idemq.jobs WHERE id = $1",
    [id],
  );
  return rows[0] as { state: string; attempt: number; lease_ms: number | null };
}

describe("a worker in an application that parses int8 as numbers", () => {
  it("keeps a running job's lease by heartbeat and completes its jobs in batches, none taken for lost", async () => {
    const { rows } = await db.pool.query<{ id: unknown }>("SELECT 1::int8 AS id");
    expect(typeof rows[0]!.id).toBe("number"); // the application's parser is in force

    const long = await enqueue("long");
    await waitFor(() => releases.has(long), { what: "the long job's handler to start" });
    const first = (await stateOf(long)).lease_ms!;
    await waitFor(async () => (await stateOf(long)).lease_ms! > first + 1500, {
      what: "the long job's lease to be extended past the first one by 1.5 s",
      timeoutMs: 15_000,
    });
    const quick = await Promise.all(Array.from({ length: 5 }, () => enqueue("quick")));
    releases.get(long)!();
    await waitFor(async () => {
      const states = await Promise.all([long, ...quick].map(async (id) => (await stateOf(id)).state));
      return states.every((s) => s === "succeeded");
    }, { what: "all six jobs to succeed" });

    expect((await stateOf(long)).attempt).toBe(1);
    expect(idTypes).toEqual(Array(5).fill("string"));
    await waitFor(() => w.of("job:success").length === 6, { what: "six job:success events" });
    expect(w.of("job:success").map((e) => e.jobId).sort()).toEqual([long, ...quick].sort());
    expect(w.of("job:lease-lost")).toEqual([]);
    expect(w.of("worker:error")).toEqual([]);
  });
});
