// The worker's hand-off (complete_and_take_next, issue 26 item 9): a batch
// completion that frees a concurrency key brings the key's next job back
// claimed, and the worker runs it as a claimed one: fewer claims than jobs,
// still one job of a key at a time, in the key's order; once the worker
// stops, its completions hand nothing. A batch without a keyed job frees no
// key: it is completed with complete_many.
import { afterAll, describe, expect, it, vi } from "vitest";
import { Client, createWorker, type Worker, type WorkerOptions } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 6 });
const workers: Worker[] = [];
afterAll(async () => {
  await Promise.all(workers.map((w) => w.stop()));
});

function worker(options: Partial<WorkerOptions>): Worker {
  const w = createWorker({ pool: db.pool, handleSignals: false, ...options } as WorkerOptions);
  workers.push(w);
  return w;
}

/** Until `n` jobs of `queue` have succeeded. */
async function succeeded(queue: string, n: number, what: string): Promise<void> {
  await waitFor(async () => {
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state = 'succeeded'", [queue]);
    return rows[0].n === n;
  }, { what });
}

/**
 * Runs `body` while each completion call the workers send through db.pool
 * (complete_many or complete_and_take_next) goes through `around`, which
 * gets the function's name and the call to make.
 */
async function watchingCompletions(around: (fn: string, call: () => Promise<unknown>) => Promise<unknown>, body: () => Promise<void>): Promise<void> {
  const query = db.pool.query.bind(db.pool) as (...args: unknown[]) => Promise<unknown>;
  const spy = vi.spyOn(db.pool, "query").mockImplementation(((config: unknown, values?: unknown) => {
    const text = typeof config === "string" ? config : (config as { text?: string }).text ?? "";
    const fn = /idemq\.(complete_and_take_next|complete_many)\(/.exec(text)?.[1];
    return fn === undefined ? query(config, values) : around(fn, () => query(config, values));
  }) as never);
  try {
    await body();
  } finally {
    spy.mockRestore();
  }
}

const KEYS = 8;
const PER_KEY = 12;

describe("a worker completing a keyed job takes the key's next job in the same call", () => {
  it(`${KEYS} keys of ${PER_KEY} jobs at concurrency 4: every job runs once, at most one of a key at a time, in the key's order, and most arrive handed over, not claimed`, async () => {
    const client = new Client({ pool: db.pool });
    const queue = unique("take-next");
    const ran: { key: string; i: number }[] = [];
    const running = new Map<string, number>();
    let overlap = 0;
    const w = worker({
      queues: [queue],
      concurrency: 4,
      tasks: {
        keyed: async (payload: { key: string; i: number }) => {
          const now = (running.get(payload.key) ?? 0) + 1;
          running.set(payload.key, now);
          overlap = Math.max(overlap, now);
          ran.push(payload);
          // Let other jobs interleave, so a second job of the key would overlap this one.
          await new Promise((resolve) => setImmediate(resolve));
          running.set(payload.key, now - 1);
        },
      },
    });
    let claimedJobs = 0;
    w.on("worker:claimed", (e) => (claimedJobs += e.jobs));
    const jobs = [];
    for (let i = 0; i < PER_KEY; i++) {
      for (let k = 0; k < KEYS; k++) jobs.push({ task: "keyed", queue, payload: { key: `${queue}:${k}`, i }, concurrencyKey: `${queue}:${k}` });
    }
    await client.enqueueMany(jobs);
    await w.start();
    await succeeded(queue, KEYS * PER_KEY, `the ${KEYS * PER_KEY} keyed jobs succeeded`);
    expect(ran).toHaveLength(KEYS * PER_KEY);
    expect(overlap).toBe(1);
    for (let k = 0; k < KEYS; k++) {
      expect(ran.filter((r) => r.key === `${queue}:${k}`).map((r) => r.i)).toEqual([...Array(PER_KEY).keys()]);
    }
    // Each job ran once (attempt 1), and the claims brought fewer jobs than ran: the rest were handed over.
    const { rows } = await db.pool.query("SELECT max(attempt) AS a, count(DISTINCT locked_by)::int AS w FROM idemq.jobs WHERE queue = $1", [queue]);
    expect(rows[0]).toEqual({ a: 1, w: 1 });
    expect(claimedJobs).toBeLessThan(KEYS * PER_KEY / 2);
  });

  it("a stopping worker completes with complete_many: the last job's key is admitted for any claim, not handed to it", async () => {
    const client = new Client({ pool: db.pool });
    const queue = unique("take-next-stop");
    const key = unique("k");
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => (release = resolve));
    const w = worker({ queues: [queue], concurrency: 1, tasks: { keyed: () => gate } });
    const [first, second] = await client.enqueueMany([
      { task: "keyed", queue, concurrencyKey: key },
      { task: "keyed", queue, concurrencyKey: key },
    ]);
    await w.start();
    await waitFor(() => w.runningCount === 1, { what: "the first job running" });
    const stopped = w.stop();
    release();
    await stopped;
    const { rows } = await db.pool.query("SELECT id, state FROM idemq.jobs WHERE id = ANY ($1::bigint[]) ORDER BY id", [[first!.jobId, second!.jobId]]);
    expect(rows.map((r) => r.state)).toEqual(["succeeded", "enqueued"]);
  });
});

describe("which completion call a batch gets", () => {
  it("a batch with no keyed job is completed with complete_many, one with a keyed job with complete_and_take_next", async () => {
    const client = new Client({ pool: db.pool });
    const queue = unique("which-call");
    const calls: string[] = [];
    await watchingCompletions(
      (fn, call) => {
        calls.push(fn);
        return call();
      },
      async () => {
        const w = worker({ queues: [queue], concurrency: 2, tasks: { noop: async () => {} } });
        await w.start();
        await client.enqueueMany(Array.from({ length: 20 }, () => ({ task: "noop", queue })));
        await succeeded(queue, 20, "the 20 jobs without a key succeeded");
        expect(calls.length).toBeGreaterThan(0);
        expect(new Set(calls)).toEqual(new Set(["complete_many"]));
        calls.length = 0;
        const key = unique("k");
        await client.enqueueMany(Array.from({ length: 3 }, () => ({ task: "noop", queue, concurrencyKey: key })));
        await succeeded(queue, 23, "the 3 keyed jobs succeeded");
        expect(calls.length).toBeGreaterThan(0);
        expect(new Set(calls)).toEqual(new Set(["complete_and_take_next"]));
      },
    );
  });
});

describe("the Completer's calls in flight", () => {
  it("a second completion call goes out beside the first once jobs pile up behind it, never a third, and every job completes once", async () => {
    const client = new Client({ pool: db.pool });
    const queue = unique("two-calls");
    const total = 3000;
    await client.enqueueMany(Array.from({ length: total }, (_, i) => ({ task: "noop", queue, payload: { i } })));
    let inFlight = 0;
    let most = 0;
    await watchingCompletions(
      (_fn, call) => {
        inFlight++;
        most = Math.max(most, inFlight);
        return call().finally(() => inFlight--);
      },
      async () => {
        let ran = 0;
        const w = worker({ queues: [queue], concurrency: 10, prefetch: 490, tasks: { noop: async () => void ran++ } });
        await w.start();
        await succeeded(queue, total, `the ${total} jobs succeeded`);
        expect(ran).toBe(total);
        expect(most).toBe(2);
      },
    );
  });
});
