// The LISTEN connection survives pg_terminate_backend: pg-listen reconnects
// and LISTENs again, and the worker polls once on reconnecting (a NOTIFY sent
// while it was disconnected is lost). The fallback poll and rescue are set to
// a minute here, so a job picked up within seconds came through the listener.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let w: TestWorker;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  w = await startTestWorker(db.url, { ping: async () => "pong" }, { pollInterval: "60s", rescueInterval: "60s" });
});
afterAll(async () => {
  await stopWorkers();
});

async function listenerPid(): Promise<number | undefined> {
  const { rows } = await db.pool.query<{ pid: number }>(
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'idemq-listener'",
  );
  expect(rows.length).toBeLessThanOrEqual(1);
  return rows[0]?.pid;
}

async function succeededWithin(jobId: string, ms: number): Promise<void> {
  await waitFor(async () => (await client.getJob(jobId))?.state === "succeeded", { what: `job ${jobId} to succeed`, timeoutMs: ms });
}

describe("the listener", () => {
  it("picks up a job by NOTIFY, long before the 60 s fallback poll", async () => {
    const { jobId } = await client.enqueue("ping", {});
    await succeededWithin(jobId, 10_000);
  });

  it("survives pg_terminate_backend: a job enqueued right after is picked up without the fallback poll, and so is the next", async () => {
    const before = await listenerPid();
    expect(before).toBeTypeOf("number");
    const { rows } = await db.pool.query<{ ok: boolean }>("SELECT pg_terminate_backend($1) AS ok", [before]);
    expect(rows[0]!.ok).toBe(true);

    // Right after: its NOTIFY may reach no listener; the poll on reconnect finds it.
    const first = await client.enqueue("ping", {});
    await succeededWithin(first.jobId, 10_000);

    // Reconnected: a new LISTEN session, and NOTIFY wakes the worker again.
    const after = await waitFor(async () => {
      const pid = await listenerPid();
      return pid !== undefined && pid !== before ? pid : undefined;
    }, { what: "a new LISTEN session", timeoutMs: 10_000 });
    expect(after).not.toBe(before);
    const second = await client.enqueue("ping", {});
    await succeededWithin(second.jobId, 10_000);
    // The lost connection was noticed, and nothing else went wrong.
    expect(w.of("log").some((e) => String(e.message).includes("LISTEN connection lost"))).toBe(true);
    expect(w.of("worker:error").filter((e) => !String(e.during).includes("LISTEN"))).toEqual([]);
  });
});
