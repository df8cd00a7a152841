-- idemq.stats() RETURNS TABLE(queue text, task text, metric text, value bigint)
--
-- Counts for dashboards and scripts, one row per (queue, task, metric):
--   metric = a job state: jobs in that state (only non-zero rows);
--   metric = 'lease_expired': processing jobs whose lease ran out, not yet rescued;
--   metric = 'oldest_runnable_seconds': age of the oldest runnable job (run_at passed,
--     not past expires_at: what claim() would hand out; idemq._runnable_jobs());
--   metric = 'deduplicated' | 'rejected' | 'conflict' | 'guard_duplicate'
--     (queue NULL): events counted per task since install. A rejection raised
--     by enqueue() rolls back with the caller's statement and is not counted
--     here; clients count those as events.
--
-- Guarantees: a consistent snapshot of the jobs table (one statement). No
--   stored value makes it fail: a run_at of -infinity (stored before the
--   functions refused it) counts as the largest age a bigint holds.
--   It reveals counts, names of queues and tasks, never a payload: the
--   worker role may call it too (its metrics).
-- Concurrency: plain reads; no locks beyond the snapshot.
-- Errors: none.
-- Tests: test/sql/stats.test.ts, test/contract/examples.test.ts
CREATE OR REPLACE FUNCTION idemq.stats()
RETURNS TABLE(queue text, task text, metric text, value bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT j.queue, j.task, j.state::text, count(*)
  FROM idemq.jobs j
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT j.queue, j.task, 'lease_expired', count(*)
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT r.queue, r.task, 'oldest_runnable_seconds', r.oldest_seconds
  FROM idemq._runnable_jobs() r
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint
  FROM idemq.counters c
  GROUP BY c.task, c.event
  ORDER BY 1, 2, 3;
END;
$$;

COMMENT ON FUNCTION idemq.stats() IS
  'Counts per queue, task and state, expired leases, oldest runnable age, and duplicate/rejection events per task.';
