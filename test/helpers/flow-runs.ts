// What the flow-control fault tests share: the table their handlers record
// each run in (test/fixtures/worker/flow-tasks.ts writes it from the worker
// processes), short leases so a SIGKILLed worker's jobs come back within
// about a second, and a SQL consumer that claims and completes beside the
// workers, recording its runs the same way.
import type pg from "pg";
import type { TestDatabase } from "./db.ts";

/** Short leases, heartbeats, rescues and polls for the worker processes. */
export const FLOW_WORKER_ENV = { IDEMQ_TEST_LEASE: "1s", IDEMQ_TEST_HEARTBEAT: "300ms", IDEMQ_TEST_RESCUE: "200ms", IDEMQ_TEST_POLL: "100ms" };

/** public.flow_runs: one row per run of a job's attempt, started and ended by the clock of the database. */
export async function createFlowRuns(pool: pg.Pool): Promise<void> {
  await pool.query(`
    CREATE TABLE public.flow_runs (
      job_id bigint NOT NULL, attempt int NOT NULL, who text NOT NULL, reclaimed boolean NOT NULL,
      started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz,
      PRIMARY KEY (job_id, attempt))`);
}

/**
 * A SQL consumer: claim(batch 2) from `queue` and, per job, record its start,
 * work payload.ms, record its end, complete; until `done()`. Returns the jobs
 * it finished.
 */
export async function sqlConsumer(db: TestDatabase, name: string, queue: string, done: () => boolean): Promise<number> {
  const conn = await db.newClient();
  let finished = 0;
  while (!done()) {
    const { rows } = await conn.query<{ job_id: string; attempt: number; lease_token: string; payload: { ms: number } }>(
      "SELECT job_id, attempt, lease_token, payload FROM idemq.claim($1, queues => ARRAY[$2], batch_size => 2, lease => '10 seconds', token => true)",
      [name, queue],
    );
    if (rows.length === 0) {
      // Nothing claimable now (slots, starts or keys used up): poll again, as a worker does.
      await new Promise((resolve) => setTimeout(resolve, 20));
      continue;
    }
    for (const job of rows) {
      await conn.query("INSERT INTO public.flow_runs (job_id, attempt, who, reclaimed) VALUES ($1, $2, $3, false)", [job.job_id, job.attempt, name]);
      await new Promise((resolve) => setTimeout(resolve, job.payload.ms));
      await conn.query("UPDATE public.flow_runs SET ended_at = clock_timestamp() WHERE job_id = $1 AND attempt = $2", [job.job_id, job.attempt]);
      await conn.query("SELECT idemq.complete($1, $2, NULL, $3)", [job.job_id, job.attempt, job.lease_token]);
      finished++;
    }
  }
  return finished;
}
