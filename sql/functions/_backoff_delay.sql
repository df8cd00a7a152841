-- idemq._backoff_delay(backoff jsonb, failed_attempt int) RETURNS interval
--
-- How long a job waits before its next attempt, after attempt `failed_attempt`
-- (1 for the first failure) failed.
--
-- Guarantees (backoff already accepted by _backoff_problem()):
--   NULL or polynomial: (a-1)^4 + 15 + random(0..29)*a seconds (Hangfire/Sidekiq);
--   exponential: initial * factor^(a-1), capped at max, then scaled by a
--     uniform factor in [1 - jitter, 1 + jitter];
--   fixed: delays[a], the last delay repeating.
-- Concurrency: none (volatile only because of random()).
-- Errors: none for a valid backoff.
-- Tests: test/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq._backoff_delay(backoff jsonb, failed_attempt int)
RETURNS interval
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_kind text := coalesce(backoff->>'kind', 'polynomial');
  v_delay interval;
  v_jitter float8;
  v_n int;
BEGIN
  IF v_kind = 'polynomial' THEN
    RETURN make_interval(secs => power(failed_attempt - 1, 4) + 15 + floor(random() * 30) * failed_attempt);
  ELSIF v_kind = 'exponential' THEN
    -- Computed in seconds as float8 so a large attempt cannot overflow an interval.
    v_delay := make_interval(secs => least(
      extract(epoch FROM (backoff->>'initial')::interval)::float8
        * power(coalesce((backoff->>'factor')::float8, 2), failed_attempt - 1),
      coalesce(extract(epoch FROM (backoff->>'max')::interval)::float8, 1e9)));
    v_jitter := coalesce((backoff->>'jitter')::float8, 0);
    IF v_jitter > 0 THEN
      v_delay := v_delay * (1 + v_jitter * (2 * random() - 1));
    END IF;
    RETURN v_delay;
  ELSE
    v_n := jsonb_array_length(backoff->'delays');
    RETURN (backoff->'delays'->>(least(failed_attempt, v_n) - 1))::interval;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._backoff_delay(jsonb, int) IS
  'Delay before the next attempt after attempt failed_attempt failed, by the job''s backoff (NULL = polynomial).';
