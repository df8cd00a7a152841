-- idemq._job_counts() RETURNS TABLE(queue text, task text, state idemq.job_state, jobs bigint)
--
-- How many jobs each (queue, task) has in each state, read from
-- idemq.job_counts (kept by the trigger function _count_jobs) instead of
-- counting idemq.jobs: the one read of those counts, for stats() and
-- overview().
--
-- Guarantees:
--   * Exact: jobs is count(*) of idemq.jobs per (queue, task, state) in the
--     caller's snapshot (the counts change in the transactions that change
--     the jobs). Only non-zero counts.
--   * Cost: one scan of idemq.job_counts, whose rows are one per (queue,
--     task, state) after apply_retention() folded them, plus one per group
--     and per statement that changed a count since; never the jobs table,
--     whatever it holds.
-- Concurrency: plain reads; no locks beyond the snapshot.
-- Errors: none.
-- Tests: test/sql/job-counts.test.ts, test/sql/stats.test.ts
CREATE OR REPLACE FUNCTION idemq._job_counts()
RETURNS TABLE(queue text, task text, state idemq.job_state, jobs bigint)
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
  SELECT c.queue, c.task, c.state, sum(c.n)::bigint
  FROM idemq.job_counts c
  GROUP BY c.queue, c.task, c.state
  HAVING sum(c.n) <> 0;
END;

COMMENT ON FUNCTION idemq._job_counts() IS
  'Jobs per queue, task and state, exact, summed from idemq.job_counts (never a count of idemq.jobs).';
