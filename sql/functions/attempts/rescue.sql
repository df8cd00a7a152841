-- idemq.rescue() RETURNS int
--
-- Takes jobs away from workers whose lease ran out, and expires jobs past
-- their deadline. Returns how many jobs it changed.
--
-- Guarantees:
--   * A job in processing whose lease_expires_at has passed (a crashed or
--     partitioned worker) goes back to enqueued, runnable now, or to failed
--     when that was its last counted attempt, or to expired when it is past
--     its expires_at (it could never be claimed again). It keeps its run_at,
--     so it is claimed ahead of the jobs that became due after it. Its errors record
--     {"class": "LeaseExpired", "message": "lease expired", ...}, and the next
--     claim reports reclaimed = true. The old attempt is fenced out from then on.
--   * Every active job that is not processing and is past its expires_at
--     (never started, or a retry waiting past its deadline) becomes expired.
--   * Each job changed counts once in the result.
--   * Idempotent: any number of workers, or pg_cron, may call it at any time;
--     no leader is needed. Waiting workers are notified (_notify_waiting)
--     of jobs it put back to enqueued.
-- Concurrency: FOR UPDATE SKIP LOCKED: rows another transaction holds (a
--   completing worker, a concurrent rescue) are left for the next call.
-- Errors: none.
-- Tests: test/sql/rescue.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.rescue()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_rescued int;
  v_expired int;
  v_queues text[];
BEGIN
  WITH lost AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.state = 'processing' AND j.lease_expires_at < now()
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), moved AS (
    UPDATE idemq.jobs AS j
    -- Straight to expired rather than enqueued-then-expired below, so the
    -- job counts once and no worker is woken for it.
    SET state = CASE WHEN j.attempt - j.uncounted >= j.max_attempts THEN 'failed'
                     WHEN j.expires_at <= now() THEN 'expired'
                     ELSE 'enqueued' END::idemq.job_state,
        finished_at = CASE WHEN j.attempt - j.uncounted >= j.max_attempts OR j.expires_at <= now()
                           THEN now() END,
        -- run_at stays: the job was due before the backlog behind it, and
        -- keeps its place in line (claim orders by priority, run_at, id).
        lease_lost = true,
        errors = idemq._append_error(j.errors, jsonb_build_object(
          'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by,
          'class', 'LeaseExpired',
          'message', format('lease expired at %s while %s held the job', j.lease_expires_at, j.locked_by))),
        locked_by = NULL, lease_expires_at = NULL
    FROM lost l
    WHERE j.id = l.id
    RETURNING j.queue, j.state
  )
  SELECT count(*), array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued')
  INTO v_rescued, v_queues
  FROM moved m;
  PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;

  WITH late AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.expires_at <= now() AND j.state IN ('enqueued', 'scheduled', 'awaiting')
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), expired AS (
    UPDATE idemq.jobs AS j
    SET state = 'expired', finished_at = now()
    FROM late l
    WHERE j.id = l.id
    RETURNING j.id
  )
  SELECT count(*) INTO v_expired FROM expired;

  RETURN v_rescued + v_expired;
END;
$$;

COMMENT ON FUNCTION idemq.rescue() IS
  'Return jobs with expired leases to enqueued (or failed on their last attempt) and expire jobs past expires_at.';
