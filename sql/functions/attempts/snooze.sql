-- idemq.snooze(job_id bigint, attempt int, run_at timestamptz, lease_token uuid DEFAULT NULL)
--   RETURNS void
--
-- Puts a held job back to `scheduled` at run_at without spending an attempt.
--
-- Guarantees:
--   * Waiting on a rate limit or a dependency is not a failure: no error is
--     recorded and the snoozed attempt does not count against max_attempts
--     (attempt still advances on the next claim, since it is the fencing token).
--   * Fenced like complete(), by (job_id, attempt, lease_token).
--   * A run_at not in the future NOTIFYs idemq_jobs when a listener waits
--     (_notify_waiting).
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL arguments; 22023 run_at infinity or -infinity.
-- Tests: test/sql/snooze.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.snooze(job_id bigint, attempt int, run_at timestamptz, lease_token uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_queue text;
BEGIN
  IF snooze.run_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'snooze: run_at must not be NULL',
      HINT = 'Pass when the job should run again, e.g. now() + interval ''1 minute''.';
  END IF;
  PERFORM idemq._check_instant('snooze', 'run_at', snooze.run_at);
  UPDATE idemq.jobs AS j
  SET state = 'scheduled', run_at = snooze.run_at, uncounted = j.uncounted + 1,
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = snooze.job_id AND j.attempt = snooze.attempt
    AND j.lease_token IS NOT DISTINCT FROM snooze.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.queue INTO v_queue;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(snooze.job_id, snooze.attempt, 'snooze');
  END IF;
  IF snooze.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_queue);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.snooze(bigint, int, timestamptz, uuid) IS
  'Reschedule a held job without spending an attempt (rate limits, dependencies).';
