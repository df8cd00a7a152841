-- idemq.fail(job_id bigint, attempt int, error jsonb, retryable boolean DEFAULT true,
--   retry_at timestamptz DEFAULT NULL, backoff jsonb DEFAULT NULL,
--   max_attempts int DEFAULT NULL, counted boolean DEFAULT true,
--   lease_token uuid DEFAULT NULL)
--   RETURNS TABLE(state idemq.job_state, run_at timestamptz)
--
-- Records a failed attempt; schedules a retry or fails the job for good.
-- Returns one row: the job's new state and the run_at of its retry (NULL
-- when it failed), exactly as stored.
--
-- Guarantees:
--   * Appends to errors one entry: the fields of `error` (by convention
--     class, message and stack; a JSON string is taken as the message, with
--     class "Error"), cut to their limits (_error_entry), with
--     attempt, started_at (the claim), failed_at, worker and max_attempts
--     (the limit this attempt counted against: the lower of the job's and
--     the argument) set by fail() over any fields of the same names. The history keeps the latest
--     error_history entries (_append_error), so a failure can always be
--     recorded, whatever the size of the errors before it.
--   * The job goes to `scheduled` at retry_at, or after the job's backoff
--     (_backoff_delay with the number of counted attempts so far, 1 for the
--     first failure); or to `failed` when the error is not retryable or the
--     counted attempts reached max_attempts. Snoozes do not count.
--   * backoff and max_attempts override the job's for this decision (a
--     worker's task settings): the delay is _backoff_delay(backoff, counted
--     attempts) on the database clock, and the job fails once the counted
--     attempts reach the lower of the two limits.
--   * counted = false records the error without spending the attempt (a
--     worker handing a job back at shutdown: the attempt was cut short, it
--     did not fail): it does not count against max_attempts, like a snooze,
--     and the retry runs at retry_at or at once, with no backoff.
--   * A retry already due (retry_at not in the future) NOTIFYs idemq_jobs
--     when a listener waits (_notify_waiting).
--   * Fenced like complete(), by (job_id, attempt, lease_token): a stale
--     attempt, or another worker without the attempt's token, changes nothing.
--   * The returned run_at is the one source of the retry time: a worker reports
--     it instead of computing the backoff again.
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id/attempt/error/retryable/counted;
--   22023 error is not a JSON object or string, a malformed backoff,
--   max_attempts < 1, retry_at infinity or -infinity.
-- Tests: test/sql/fail.test.ts, test/sql/backoff.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.fail(
  job_id bigint,
  attempt int,
  error jsonb,
  retryable boolean DEFAULT true,
  retry_at timestamptz DEFAULT NULL,
  backoff jsonb DEFAULT NULL,
  max_attempts int DEFAULT NULL,
  counted boolean DEFAULT true,
  lease_token uuid DEFAULT NULL)
RETURNS TABLE(state idemq.job_state, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No "#variable_conflict error" line: the parameter named "error" (fixed by
-- the contract) would be read there as the variable; nor SET
-- plpgsql.variable_conflict, which only a superuser may set (it kept anyone
-- else from installing idemq). Every name in the body is qualified, so it
-- means the same under any setting (the default is error).
AS $$
DECLARE
  v_error jsonb;
  v_job record;
  v_state idemq.job_state;
  v_due record;
  v_problem text;
BEGIN
  IF fail.error IS NULL OR fail.retryable IS NULL OR fail.counted IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'fail: error, retryable and counted must not be NULL',
      HINT = 'Pass the error as {"class": "TimeoutError", "message": "..."}.';
  END IF;
  v_error := idemq._error_entry(fail.error);
  IF v_error IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: error must be a JSON object or string, not %s', idemq._excerpt(fail.error::text)),
      HINT = 'Pass {"class": "TimeoutError", "message": "...", "stack": "..."}.';
  END IF;
  v_problem := idemq._backoff_problem(fail.backoff);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: %s', v_problem),
      HINT = 'Pass NULL to use the job''s own backoff.';
  END IF;
  IF fail.max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: max_attempts must be NULL or >= 1, not %s', fail.max_attempts),
      HINT = 'Pass NULL to use the job''s own max_attempts.';
  END IF;
  PERFORM idemq._check_instant('fail', 'retry_at', fail.retry_at);

  SELECT j.attempt, j.uncounted, j.max_attempts, j.backoff INTO v_job
  FROM idemq.jobs j
  WHERE j.id = fail.job_id AND j.attempt = fail.attempt
    AND j.lease_token IS NOT DISTINCT FROM fail.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(fail.job_id, fail.attempt, 'fail');
  END IF;
  v_state := CASE WHEN NOT fail.retryable THEN 'failed'
                  WHEN NOT fail.counted THEN 'scheduled'
                  WHEN v_job.attempt - v_job.uncounted >= least(v_job.max_attempts, fail.max_attempts) THEN 'failed'
                  ELSE 'scheduled' END;

  UPDATE idemq.jobs AS j
  SET state = v_state,
      run_at = CASE WHEN v_state <> 'scheduled' THEN j.run_at
                    WHEN NOT fail.counted THEN coalesce(fail.retry_at, now())
                    ELSE coalesce(fail.retry_at, now() + idemq._backoff_delay(coalesce(nullif(fail.backoff, 'null'), v_job.backoff),
                                                                  v_job.attempt - v_job.uncounted)) END,
      uncounted = j.uncounted + CASE WHEN fail.counted THEN 0 ELSE 1 END,
      finished_at = CASE WHEN v_state = 'failed' THEN now() END,
      errors = idemq._append_error(j.errors, v_error || jsonb_build_object(
        'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by,
        'max_attempts', least(v_job.max_attempts, fail.max_attempts))),
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = fail.job_id
  RETURNING j.run_at, j.queue INTO v_due;
  -- A retry due at once (retry_at in the past, a zero delay) must not wait
  -- for a worker's fallback poll.
  IF v_state = 'scheduled' AND v_due.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_due.queue);
  END IF;
  state := v_state;
  run_at := CASE WHEN v_state = 'scheduled' THEN v_due.run_at END;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int, boolean, uuid) IS
  'Record a failed attempt; scheduled for a retry by backoff (or retry_at), or failed when not retryable or out of attempts.';
