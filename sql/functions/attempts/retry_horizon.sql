-- idemq.retry_horizon(backoff jsonb, counted_attempts int, max_attempts int) RETURNS interval
--
-- The longest the remaining retries of a job can take: the sum of the
-- longest backoff delays after each failure still possible.
--
-- Guarantees:
--   * A delay follows every failure but the last: failures
--     max(counted_attempts, 1) .. max_attempts - 1, each delay
--     _backoff_delay(backoff, failure, draw => 1), the top of its random range
--     and capped as fail() caps it. NULL backoff is the default (polynomial).
--   * At most 36500 days (100 years): a longer horizon is reported as that.
--     A delay that stops changing (a fixed schedule's last delay, a capped
--     exponential) is multiplied out, so even max_attempts = 2^31-1 answers at once.
--   * Deterministic (draw => 1 takes no random number), hence STABLE though
--     _backoff_delay is VOLATILE for its random().
--   `idemq doctor` compares it with the key retention: a key pruned before its
--   job's last retry no longer deduplicates a replayed enqueue.
-- Concurrency: none (reads nothing).
-- Errors: 22004 NULL counted_attempts or max_attempts; 22023 a malformed
--   backoff, counted_attempts < 0 or max_attempts < 1 (no job has those: the
--   HINT says what to pass), each before any arithmetic on them.
-- Tests: test/sql/retry-horizon.test.ts, test/cli/doctor.test.ts
CREATE OR REPLACE FUNCTION idemq.retry_horizon(backoff jsonb, counted_attempts int, max_attempts int)
RETURNS interval
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_cap constant numeric := 36500 * 86400::numeric; -- 100 years of 365 days, in seconds
  v_last int;
  v_problem text := idemq._backoff_problem(backoff);
  v_total numeric := 0;
  v_delay numeric;
  v_previous numeric;
BEGIN
  IF counted_attempts IS NULL OR max_attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'retry_horizon: counted_attempts and max_attempts must not be NULL',
      HINT = 'Pass the job''s attempt - uncounted (0 before its first attempt) and its max_attempts.';
  END IF;
  IF counted_attempts < 0 OR max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_horizon: counted_attempts must be at least 0 and max_attempts at least 1, not %s and %s',
                       counted_attempts, max_attempts),
      HINT = 'Pass the job''s attempt - uncounted (0 before its first attempt) and its max_attempts.';
  END IF;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_horizon: %s', v_problem),
      HINT = 'Pass a job''s backoff column, or NULL for the default.';
  END IF;
  v_last := max_attempts - 1;
  FOR v_failure IN greatest(counted_attempts, 1) .. v_last LOOP
    v_delay := extract(epoch FROM idemq._backoff_delay(backoff, v_failure, draw => 1));
    IF v_delay = v_previous THEN
      -- Constant from here on: multiply.
      v_total := v_total + v_delay * (v_last - v_failure + 1);
      EXIT;
    END IF;
    v_total := v_total + v_delay;
    v_previous := v_delay;
    -- A slowly growing exponential (factor near 1) reaches neither the cap nor
    -- a constant delay: 100,000 delays are plenty for a diagnosis.
    EXIT WHEN v_total >= v_cap OR v_failure - counted_attempts > 100000;
  END LOOP;
  RETURN make_interval(secs => least(v_total, v_cap)::float8);
END;
$$;

COMMENT ON FUNCTION idemq.retry_horizon(jsonb, int, int) IS
  'Longest time the remaining retries of a job can take (the worst-case backoff delays summed, at most 100 years).';
