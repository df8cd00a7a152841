-- idemq._oldest_runnable() RETURNS TABLE(queue text, task text, oldest_seconds bigint)
--
-- The age of the oldest job claim() would hand out now, per queue and task,
-- read through the runnable index without visiting the rest of the backlog:
-- stats()'s and overview()'s oldest_runnable_seconds.
--
-- Guarantees:
--   * Runnable as claim() and _runnable_jobs() define it: state enqueued or
--     scheduled, run_at <= now(), not past expires_at. A (queue, task) with
--     no runnable job has no row.
--   * oldest_seconds is whole epoch seconds since the oldest run_at, capped
--     at the largest bigint (a run_at of -infinity, or one far in the past,
--     must not take every count away), as _runnable_jobs() computes it.
--   * Cost: per (queue, task) with enqueued or scheduled jobs (from
--     _job_counts()), one index descent per distinct priority present plus
--     one to end the walk, and per priority one walk of
--     jobs_runnable_by_task_queue (key, priority, run_at order) that stops
--     at the first job not past its expires_at (the expired ones rescue()
--     has not reached yet are stepped over). So it does not grow with the
--     backlog: _runnable_jobs() reads every runnable job.
-- Concurrency: plain reads; no locks beyond the snapshot.
-- Errors: none.
-- Tests: test/sql/stats.test.ts, test/sql/job-counts.test.ts, test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._oldest_runnable()
RETURNS TABLE(queue text, task text, oldest_seconds bigint)
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
  -- The index is (_name_key(task), _name_key(queue), priority DESC, run_at,
  -- id) over enqueued and scheduled rows. Each walk names the key and then
  -- the names (a Filter, so names that share a key never mix), as claim()
  -- does. The priorities present are found by a loose scan (the next lower
  -- priority after this one: one descent each); within one priority the
  -- entries are in run_at order, so the first one not past its deadline is
  -- the oldest, and "run_at <= now()" bounds the walk.
  WITH RECURSIVE pairs AS (
    SELECT DISTINCT c.queue, c.task
    FROM idemq._job_counts() c
    WHERE c.state IN ('enqueued', 'scheduled')
  ), levels(queue, task, priority) AS (
    SELECT p.queue, p.task, f.priority
    FROM pairs p
    CROSS JOIN LATERAL (
      SELECT j.priority
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND idemq._name_key(j.task) = idemq._name_key(p.task)
        AND idemq._name_key(j.queue) = idemq._name_key(p.queue)
        AND j.task = p.task AND j.queue = p.queue
      ORDER BY j.priority DESC
      LIMIT 1
    ) f
    UNION ALL
    SELECT l.queue, l.task, f.priority
    FROM levels l
    CROSS JOIN LATERAL (
      SELECT j.priority
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND idemq._name_key(j.task) = idemq._name_key(l.task)
        AND idemq._name_key(j.queue) = idemq._name_key(l.queue)
        AND j.priority < l.priority
        AND j.task = l.task AND j.queue = l.queue
      ORDER BY j.priority DESC
      LIMIT 1
    ) f
  )
  SELECT l.queue, l.task,
         least(floor(extract(epoch FROM now()) - extract(epoch FROM min(o.run_at))),
               9223372036854775807)::bigint
  FROM levels l
  CROSS JOIN LATERAL (
    SELECT j.run_at
    FROM idemq.jobs j
    WHERE j.state IN ('enqueued', 'scheduled')
      AND idemq._name_key(j.task) = idemq._name_key(l.task)
      AND idemq._name_key(j.queue) = idemq._name_key(l.queue)
      AND j.priority = l.priority
      AND j.run_at <= now()
      AND j.task = l.task AND j.queue = l.queue
      AND (j.expires_at IS NULL OR j.expires_at > now())
    ORDER BY j.run_at
    LIMIT 1
  ) o
  GROUP BY l.queue, l.task;
END;

COMMENT ON FUNCTION idemq._oldest_runnable() IS
  'Age in seconds of the oldest runnable job per queue and task, found by index descents (never a scan of the backlog).';
