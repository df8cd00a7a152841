-- idemq.unserved_jobs(seen_within interval) RETURNS TABLE(queue text, task text,
--   jobs bigint, oldest_runnable_seconds bigint, last_seen_at timestamptz)
--
-- Runnable jobs that no live worker claims, per queue and task: no worker
-- seen (worker_seen) within seen_within has their queue and their task.
--
-- Guarantees:
--   * Runnable as idemq._runnable_jobs counts it (what claim() would hand
--     out now; stats() reports the same age through _oldest_runnable); jobs
--     and oldest_runnable_seconds are that group's.
--   * A worker covers a job when its queues are NULL or hold the job's
--     queue, and its tasks are NULL or hold the job's task (as claim()
--     filters), its last_seen_at is within seen_within of now(), and it
--     has not stopped (a row worker_stopped kept covers nothing).
--   * last_seen_at: when the most recently seen worker that would cover the
--     group was seen (older than seen_within: stale), NULL when none ever
--     registered with it.
--   * Consumers that never call worker_seen() (a plain SQL client calling
--     claim()) are not seen: their groups are reported too.
-- Concurrency: plain reads.
-- Errors: 22004 NULL seen_within; 22023 seen_within not positive or over
--   duration_days.
-- Tests: test/sql/workers.test.ts, test/cli/doctor.test.ts
CREATE OR REPLACE FUNCTION idemq.unserved_jobs(seen_within interval)
RETURNS TABLE(queue text, task text, jobs bigint, oldest_runnable_seconds bigint, last_seen_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_since timestamptz;
BEGIN
  IF seen_within IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'unserved_jobs: seen_within must not be NULL',
      HINT = 'Pass how recently a worker must have been seen to count, e.g. ''2 minutes''.';
  END IF;
  IF seen_within <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('unserved_jobs: seen_within must be positive, not %s', seen_within),
      HINT = 'Workers refresh their row every 15 seconds by default: pass a few times that, e.g. ''2 minutes''.';
  END IF;
  PERFORM idemq._check_duration('unserved_jobs', 'seen_within', seen_within);
  v_since := now() - seen_within;

  RETURN QUERY
  SELECT r.queue, r.task, r.jobs, r.oldest_seconds, c.last_seen_at
  FROM idemq._runnable_jobs() r
  LEFT JOIN LATERAL (
    SELECT max(w.last_seen_at) AS last_seen_at
    FROM idemq.workers w
    -- A stopped worker's row is kept for the dashboard (worker_stopped): it serves nothing.
    WHERE w.stopped_at IS NULL
      AND (w.queues IS NULL OR r.queue = ANY (w.queues))
      AND (w.tasks IS NULL OR r.task = ANY (w.tasks))) c ON true
  WHERE c.last_seen_at IS NULL OR c.last_seen_at < v_since
  ORDER BY r.oldest_seconds DESC, r.queue, r.task;
END;
$$;

COMMENT ON FUNCTION idemq.unserved_jobs(interval) IS
  'Runnable jobs per queue and task that no worker seen within seen_within claims (count, oldest age, last seen).';
