-- idemq._runnable_jobs() RETURNS TABLE(queue text, task text, jobs bigint, oldest_seconds bigint)
--
-- The jobs claim() would hand out now, counted per queue and task, with the
-- age of the oldest: what unserved_jobs() reports. It reads every runnable
-- job; stats() and overview() take the age alone from _oldest_runnable(),
-- which reads a few index entries per queue and task (same predicate, same
-- capped age: test/sql/stats.test.ts holds the two equal).
--
-- Guarantees:
--   * Runnable: state enqueued or scheduled, run_at <= now(), not past
--     expires_at (claim()'s own predicate, which its partial index needs
--     spelt out there).
--   * oldest_seconds is whole epoch seconds since the oldest run_at, capped
--     at the largest bigint: now() - min(run_at) fails (22008) for a run_at
--     of -infinity or one far in the past, and one bad row must not take
--     every count away.
-- Concurrency: plain reads; no locks beyond the snapshot. PARALLEL SAFE, so
--   a caller's scan may run in parallel (as a parallel-unsafe function it
--   kept stats(), then its caller, from its parallel scan: 1.26x as long on
--   100,000 runnable of 150,000 jobs; PostgreSQL 15, a loaded 2-core machine).
-- Errors: none.
-- Tests: test/sql/stats.test.ts, test/sql/workers.test.ts
CREATE OR REPLACE FUNCTION idemq._runnable_jobs()
RETURNS TABLE(queue text, task text, jobs bigint, oldest_seconds bigint)
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
  SELECT j.queue, j.task, count(*),
         least(floor(extract(epoch FROM now()) - extract(epoch FROM min(j.run_at))),
               9223372036854775807)::bigint
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
    AND (j.expires_at IS NULL OR j.expires_at > now())
  GROUP BY j.queue, j.task;
END;

COMMENT ON FUNCTION idemq._runnable_jobs() IS
  'Runnable jobs (what claim() would hand out now) per queue and task: count and age of the oldest, in seconds.';
