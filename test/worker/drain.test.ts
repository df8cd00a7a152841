// Several worker processes drain 20,000 jobs together: every job runs
// exactly once (one job:start per job across all processes, and attempt 1 on
// every row: never claimed twice, never rescued), and none is left.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { killAllWorkers, startedWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const JOBS = 20_000;

const db = useTestDatabase({ poolSize: 3 });
let client: Client;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterEach(async () => {
  await killAllWorkers();
});

async function enqueueNoops(queue: string): Promise<void> {
  for (let i = 0; i < JOBS; i += 5000) {
    const results = await client.enqueueMany(Array.from({ length: 5000 }, () => ({ task: "noop", queue })));
    expect(results.every((r) => r.outcome === "created")).toBe(true);
  }
}

async function stateCounts(queue: string): Promise<Record<string, number>> {
  const { rows } = await db.pool.query<{ state: string; attempt: number; n: number }>(
    "SELECT state::text, attempt, count(*)::int AS n FROM idemq.jobs WHERE queue = $1 GROUP BY 1, 2",
    [queue],
  );
  return Object.fromEntries(rows.map((r) => [`${r.state}/${r.attempt}`, r.n]));
}

describe.each([2, 4])("%i worker processes drain 20,000 jobs", (processes) => {
  it("every job runs exactly once and none is left", async () => {
    const queue = `drain${processes}`;
    await enqueueNoops(queue);
    const workers = await Promise.all(
      Array.from({ length: processes }, () =>
        startedWorker({ tasks: "noop-tasks.ts", databaseUrl: db.url, args: ["--queues", queue, "--concurrency", "20"] }),
      ),
    );
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state = 'succeeded'",
          [queue],
        );
        return rows[0]!.n === JOBS;
      },
      { what: `${JOBS} jobs succeeded`, timeoutMs: 150_000, intervalMs: 200 },
    );
    for (const w of workers) w.child.kill("SIGTERM");
    const exits = await Promise.all(workers.map((w) => w.exited));
    expect(exits).toEqual(workers.map(() => ({ code: 0, signal: null })));

    // In the table: all succeeded on their first attempt (claimed once, never rescued), nothing else left.
    expect(await stateCounts(queue)).toEqual({ "succeeded/1": JOBS });
    // In the processes: one start and one success per job, over all of them.
    const starts = workers.flatMap((w) => w.events.filter((e) => e.event === "job:start").map((e) => e.jobId));
    const successes = workers.flatMap((w) => w.events.filter((e) => e.event === "job:success").map((e) => e.jobId));
    expect(starts).toHaveLength(JOBS);
    expect(new Set(starts).size).toBe(JOBS);
    expect(successes).toHaveLength(JOBS);
    expect(new Set(successes).size).toBe(JOBS);
    for (const w of workers) {
      expect(w.count("job:lease-lost") + w.count("job:retry") + w.count("job:failed") + w.count("worker:error")).toBe(0);
    }
    expect(workers.filter((w) => w.count("job:start") > 0).length).toBeGreaterThanOrEqual(2);
  });
});
