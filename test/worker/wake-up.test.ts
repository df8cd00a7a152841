// The worker's side of the wake-up protocol: when a claim comes back short it
// waits (idemq.wait_for_jobs, on a connection of its own, application_name
// idemq-wait-marker), so enqueues notify it; with a backlog it stops waiting.
// The fallback poll and rescue are set to a minute: a job done within seconds
// came through a NOTIFY or the claim after wait_for_jobs.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { markerPid as markerPidOf, markersHeld as markersHeldOf } from "../fixtures/worker/wait-marker.ts";

const db = useTestDatabase({ poolSize: 6 });
let client: Client;
let w: TestWorker;
let release: (() => void) | undefined;
let gate: Promise<void> = Promise.resolve();

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  w = await startTestWorker(
    db.url,
    {
      ping: async () => "pong",
      // Holds its slot until the test opens the gate: builds a backlog.
      gated: async () => gate,
    },
    { pollInterval: "60s", rescueInterval: "60s", concurrency: 2, prefetch: 2 },
  );
});
afterAll(async () => {
  release?.();
  await stopWorkers();
});

const markerPid = () => markerPidOf(db.pool);
/** 1 while the worker waits (it claims from every queue). */
const markersHeld = () => markersHeldOf(db.pool);

async function succeededWithin(jobIds: string[], ms: number): Promise<void> {
  await waitFor(
    async () => {
      const { rows } = await db.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM idemq.jobs WHERE id = ANY ($1::bigint[]) AND state = 'succeeded'",
        [jobIds],
      );
      return rows[0]!.n === jobIds.length;
    },
    { what: `${jobIds.length} jobs to succeed`, timeoutMs: ms },
  );
}

describe("the worker waits for jobs only when it ran dry", () => {
  it("an idle worker waits (holds its marker), and jobs enqueued one by one are picked up by NOTIFY", async () => {
    await waitFor(async () => (await markersHeld()) === 1, { what: "the worker to wait for jobs", timeoutMs: 10_000 });
    const ids: string[] = [];
    for (let i = 0; i < 20; i++) ids.push((await client.enqueue("ping", { i })).jobId);
    await succeededWithin(ids, 10_000);
  });

  it("with a backlog it stops waiting; once it drains it waits again, and nothing enqueued meanwhile is left behind", async () => {
    gate = new Promise<void>((resolve) => (release = resolve));
    const ids: string[] = [];
    // Claims of 2 (concurrency 2, prefetch 2) come back full while the backlog lasts.
    for (let i = 0; i < 8; i++) ids.push((await client.enqueue("gated", { i })).jobId);
    await waitFor(async () => (await markersHeld()) === 0, { what: "the worker to stop waiting", timeoutMs: 10_000 });
    // Enqueued while it does not wait: no NOTIFY; the worker's own claims find them.
    for (let i = 0; i < 4; i++) ids.push((await client.enqueue("ping", { late: i })).jobId);
    release!();
    await succeededWithin(ids, 10_000);
    await waitFor(async () => (await markersHeld()) === 1, { what: "the worker to wait again", timeoutMs: 10_000 });
    const next = await client.enqueue("ping", { after: true });
    await succeededWithin([next.jobId], 10_000);
  });

  it("a lost marker connection is replaced, and the worker is woken by NOTIFY again", async () => {
    const before = await markerPid();
    expect(before).toBeTypeOf("number");
    const { rows } = await db.pool.query<{ ok: boolean }>("SELECT pg_terminate_backend($1) AS ok", [before]);
    expect(rows[0]!.ok).toBe(true);
    const after = await waitFor(
      async () => {
        const pid = await markerPid();
        return pid !== undefined && pid !== before && (await markersHeld()) === 1 ? pid : undefined;
      },
      { what: "a new wait-marker session holding the marker", timeoutMs: 10_000 },
    );
    expect(after).not.toBe(before);
    const { jobId } = await client.enqueue("ping", { reconnected: true });
    await succeededWithin([jobId], 10_000);
    expect(w.of("worker:error").filter((e) => !String(e.during).includes("wait-marker"))).toEqual([]);
  });
});
