-- idemq.stats() RETURNS TABLE(queue text, task text, metric text, value bigint,
--   waiting_for idemq.waiting_reason)
--
-- Counts for dashboards and scripts, one row per (queue, task, metric):
--   metric = a job state: jobs in that state (only non-zero rows);
--   metric = 'lease_expired': processing jobs whose lease ran out, not yet rescued;
--   metric = 'oldest_runnable_seconds': age of the oldest runnable job (run_at passed,
--     not past expires_at: what claim() would hand out; idemq._oldest_runnable());
--   metric = 'deduplicated' | 'rejected' | 'conflict' | 'guard_duplicate'
--     (queue NULL): events counted per task since install. A rejection raised
--     by enqueue() rolls back with the caller's statement and is not counted
--     here; clients count those as events.
--   waiting_for: on the rows 'enqueued' and 'oldest_runnable_seconds', why
--     that (queue, task)'s runnable jobs are not running: 'paused', 'held',
--     'concurrency' (no slot free), 'rate' (no start left in the period),
--     as job() says it of each of them (idemq._scope_waits(): the first
--     that holds for its queue or its task); NULL there when none holds
--     (they wait for a worker). NULL on every other row: the 'awaiting' row
--     counts the jobs waiting for their parents or a place of their
--     concurrency key (job() tells which), 'scheduled' those whose run_at
--     has not come (and any due ones, which wait as the enqueued do).
--
-- Guarantees: one consistent snapshot (one statement). Every value is exact:
--   the states' counts come from idemq.job_counts (_job_counts(), kept in
--   the writers' transactions by the trigger function _count_jobs), never
--   from counting idemq.jobs; lease_expired from the partial index of
--   processing jobs (jobs_leases); oldest_runnable_seconds from a few
--   descents of the runnable index (_oldest_runnable()). No stored value
--   makes it fail: a run_at of -infinity (stored before the functions
--   refused it) counts as the largest age a bigint holds.
--   It reveals counts, names of queues and tasks, never a payload: the
--   worker role may call it too (its metrics).
--   Cost: the same with 1,000 or 10,000,000 jobs retained, or a backlog of
--   millions: the rows of idemq.job_counts (one per queue, task and state,
--   plus one per group and statement since apply_retention last folded
--   them), the processing jobs whose lease ran out, and per (queue, task)
--   with runnable jobs one or two index descents per priority. It reads no
--   finished or waiting job: 0.88 ms with 3,000 jobs, 1.2 ms with 1,002,000,
--   1.0 ms with 10,002,000, 40 job rows read each time (it took 320 ms and
--   read every row at 1,002,000 when it counted them; bench/stats-cost.mjs,
--   PostgreSQL 15, a loaded 2-core machine; docs/design.md, "Job counts").
--   waiting_for adds one call of limits() (a row per scope with flow
--   control, and the slots held and starts in the period of each), not a
--   read of idemq.jobs: 1-2 ms with 20 small scopes, 13-25 ms in all with a
--   scope holding 10,000 slots (bench/FINDINGS.md, "Why a job is not
--   running: what waiting_for costs").
-- Concurrency: plain reads; no locks beyond the snapshot.
-- Errors: none.
-- Tests: test/sql/stats.test.ts, test/sql/job-counts.test.ts, test/contract/examples.test.ts,
--   test/sql/waiting-for.test.ts
CREATE OR REPLACE FUNCTION idemq.stats()
RETURNS TABLE(queue text, task text, metric text, value bigint, waiting_for idemq.waiting_reason)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  -- limits() once for every (queue, task), not once per row.
  WITH waits AS MATERIALIZED (
    SELECT w.queue, w.task, w.waiting_for FROM idemq._scope_waits() w WHERE w.waiting_for IS NOT NULL
  )
  SELECT c.queue, c.task, c.state::text, c.jobs,
         CASE WHEN c.state = 'enqueued' THEN
           (SELECT min(w.waiting_for) FROM waits w WHERE w.queue = c.queue OR w.task = c.task) END
  FROM idemq._job_counts() c
  UNION ALL
  -- "state = 'processing'" is the predicate of jobs_leases: a range scan of
  -- the leases that ran out, whatever else the table holds.
  SELECT j.queue, j.task, 'lease_expired', count(*), NULL::idemq.waiting_reason
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT r.queue, r.task, 'oldest_runnable_seconds', r.oldest_seconds,
         (SELECT min(w.waiting_for) FROM waits w WHERE w.queue = r.queue OR w.task = r.task)
  FROM idemq._oldest_runnable() r
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint, NULL
  FROM idemq.counters c
  GROUP BY c.task, c.event
  ORDER BY 1, 2, 3;
END;
$$;

COMMENT ON FUNCTION idemq.stats() IS
  'Counts per queue, task and state, expired leases, oldest runnable age (with why runnable jobs wait: waiting_for), and duplicate/rejection events per task.';
