// A transactional job's transaction runs with idle_in_transaction_session_timeout
// at its lease plus a margin (5 s), so that the server frees the guard row of
// a worker that froze. It must fire for such a worker only: a live handler
// whose transaction sits idle longer than that (an awaited HTTP call between
// two statements) keeps its session while its heartbeats succeed, because
// each heartbeat also runs a no-op statement on the job's transaction. When
// the server does end the session (here: a worker whose heartbeats never
// come), the attempt's recorded error says so in words a user can act on,
// not pg's "Client has encountered a connection error and is not queryable".
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, type Job } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const LEASE_MS = 500;
/** lease + the worker's idleInTransactionMargin (5 s, src/worker/defaults.ts). */
const IDLE_TIMEOUT_MS = LEASE_MS + 5000;

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let live: TestWorker;
let frozen: TestWorker;

/** The job's lease_expires_at, in ms on the database clock. */
async function leaseExpiresAt(jobId: string): Promise<number> {
  const { rows } = await db.pool.query<{ at: Date }>("SELECT lease_expires_at AS at FROM idemq.jobs WHERE id = $1", [jobId]);
  return rows[0]?.at?.getTime() ?? 0;
}

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query("CREATE TABLE public.ledger (job_id bigint NOT NULL, attempt int NOT NULL, step int NOT NULL)");
  // Nobody rescues: a lease that ran out stays this worker's to record (fail() accepts an expired, unrescued lease).
  const common = { lease: `${LEASE_MS}ms`, rescueInterval: "1 hour", pollInterval: "100ms" } as const;
  live = await startTestWorker(
    db.url,
    {
      // A statement, then a failed one in a savepoint (the subtransaction
      // stays aborted, which the server's timeout covers too), then no
      // statement on its transaction until heartbeats have carried the lease
      // well past the moment the idle timeout would end the session; then the
      // savepoint rolled back and a second write.
      slow_tx: {
        transactional: true,
        run: async (_p, ctx) => {
          const { rows } = await ctx.tx.query<{ at: Date }>(
            "INSERT INTO public.ledger VALUES ($1, $2, 1) RETURNING clock_timestamp() AS at",
            [ctx.job.id, ctx.job.attempt],
          );
          await ctx.tx.query("SAVEPOINT before_failure");
          const failed = await ctx.tx.query("SELECT 1 / 0").then(
            () => undefined,
            (error: { code?: string }) => error.code,
          );
          if (failed !== "22012") throw new Error(`expected a division by zero, got ${String(failed)}`);
          const idleFrom = rows[0]!.at.getTime();
          // Awaited on the test's own pool: the handler's transaction stays idle all along.
          await waitFor(async () => (await leaseExpiresAt(ctx.job.id)) > idleFrom + IDLE_TIMEOUT_MS + 2000, {
            what: `heartbeats extending job ${ctx.job.id}'s lease 2 s past its transaction's idle timeout`,
            timeoutMs: 20_000,
          });
          await ctx.tx.query("ROLLBACK TO SAVEPOINT before_failure");
          await ctx.tx.query("INSERT INTO public.ledger VALUES ($1, $2, 2)", [ctx.job.id, ctx.job.attempt]);
        },
      },
    },
    { ...common, queues: ["live"] },
  );
  frozen = await startTestWorker(
    db.url,
    {
      // Waits until the server ends its session, then tries its next statement.
      stalled_tx: {
        transactional: true,
        // Its retry waits: one attempt is the one this test reads.
        backoff: { kind: "fixed", delays: ["1 hour"] },
        run: async (_p, ctx) => {
          await ctx.tx.query("INSERT INTO public.ledger VALUES ($1, $2, 1)", [ctx.job.id, ctx.job.attempt]);
          await new Promise((resolve) => ctx.tx.once("end", resolve));
          await ctx.tx.query("INSERT INTO public.ledger VALUES ($1, $2, 2)", [ctx.job.id, ctx.job.attempt]);
        },
      },
    },
    // Heartbeats never come, as for a worker that froze: nothing keeps the transaction busy.
    { ...common, queues: ["frozen"], heartbeatInterval: "1 hour" },
  );
});
afterEach(() => {
  expect(live.of("worker:error")).toEqual([]);
  expect(frozen.of("worker:error")).toEqual([]);
});
afterAll(async () => {
  await stopWorkers();
});

/** Waits until the job's first attempt has ended, whichever way. */
async function firstAttemptEnded(w: TestWorker, jobId: string): Promise<Job> {
  await waitFor(
    () => w.events.some((e) => e.payload.jobId === jobId && e.payload.attempt === 1 && e.event !== "job:start" && e.event !== "log"),
    { what: `the end of job ${jobId}'s first attempt`, timeoutMs: 30_000 },
  );
  return (await client.getJob(jobId))!;
}

describe("idle_in_transaction_session_timeout of a transactional job", () => {
  it("does not end a live handler's transaction idle longer than lease + margin while its heartbeats succeed: one attempt, success", async () => {
    const { jobId } = await client.enqueue("slow_tx", {}, { queue: "live" });
    const job = await firstAttemptEnded(live, jobId);
    expect(job).toMatchObject({ state: "succeeded", attempt: 1, errors: [] });
    expect(live.of("job:retry").filter((e) => e.jobId === jobId)).toEqual([]);
    const { rows } = await db.pool.query("SELECT attempt, step FROM public.ledger WHERE job_id = $1 ORDER BY step", [jobId]);
    expect(rows).toEqual([
      { attempt: 1, step: 1 },
      { attempt: 1, step: 2 },
    ]);
  }, 40_000);

  it("that ended a session anyway (no heartbeats) is reported in words a user can act on, in the job's errors and the job:retry event", async () => {
    const { jobId } = await client.enqueue("stalled_tx", {}, { queue: "frozen" });
    const job = await firstAttemptEnded(frozen, jobId);
    expect(job).toMatchObject({ state: "scheduled", attempt: 1 });
    const recorded = job.errors[0] as { class: string; message: string };
    const expected = new RegExp(
      `^job ${jobId} \\(stalled_tx, attempt 1\\): the server ended its transaction after it sat idle for ${IDLE_TIMEOUT_MS} ms ` +
        `\\(idle_in_transaction_session_timeout: the lease, ${LEASE_MS} ms, \\+ 5000 ms\\)`,
    );
    expect(recorded.class).toBe("IdleTransactionTimeoutError");
    expect(recorded.message).toMatch(expected);
    expect(recorded.message).toMatch(/keep the transaction busy .* or give the task a longer lease/);
    expect(recorded.message).not.toMatch(/not queryable/);
    const retry = frozen.of("job:retry").find((e) => e.jobId === jobId);
    expect((retry?.error as { message: string } | undefined)?.message).toBe(recorded.message);
    // Its writes rolled back with the session.
    expect((await db.pool.query("SELECT 1 FROM public.ledger WHERE job_id = $1", [jobId])).rows).toEqual([]);
  }, 40_000);
});
