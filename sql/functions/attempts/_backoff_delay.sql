-- idemq._backoff_delay(backoff jsonb, failed_attempt int, draw float8 DEFAULT NULL) RETURNS interval
--
-- How long a job waits before its next attempt, after attempt `failed_attempt`
-- (1 for the first failure) failed: the one backoff model (fail() schedules
-- by it, retry_horizon() adds it up; the worker has no copy).
--
-- Guarantees (backoff already accepted by _backoff_problem()):
--   NULL or polynomial: (a-1)^4 + 15 + k*a seconds, k = floor(draw * 30)
--     in 0..29, 29 for draw = 1 (Hangfire/Sidekiq);
--   exponential: initial * factor^(a-1), capped at max, then scaled by
--     1 + jitter * (2 * draw - 1), a factor in [1 - jitter, 1 + jitter];
--   fixed: delays[a], the last delay repeating.
--   draw is a number in [0, 1] standing for the random part; NULL (the
--   default) draws random(); 1 gives the longest delay the kind can take.
--   Whatever the kind, the delay is at most 10^9 seconds (about 31.7 years),
--   so no attempt number (up to max_attempts = 2^31-1) and no accepted
--   specification overflows a float8, an interval or now() + the delay.
-- Concurrency: none (volatile only because of random()).
-- Errors: none for a valid backoff.
-- Tests: test/sql/backoff.test.ts, test/worker/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq._backoff_delay(backoff jsonb, failed_attempt int, draw float8 DEFAULT NULL)
RETURNS interval
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text := coalesce(backoff->>'kind', 'polynomial');
  v_draw numeric := coalesce(draw, random());
  v_ceiling constant numeric := 1e9;
  v_secs numeric;
  v_initial numeric;
  v_factor numeric;
  v_cap numeric;
  v_n int;
BEGIN
  -- Seconds are computed as numeric: float8 overflows at factor^(a-1) for a
  -- few hundred attempts and cannot even read a factor like 1e400.
  IF v_kind = 'polynomial' THEN
    v_secs := power((failed_attempt - 1)::numeric, 4) + 15 + least(floor(v_draw * 30), 29) * failed_attempt;
  ELSIF v_kind = 'exponential' THEN
    v_initial := extract(epoch FROM (backoff->>'initial')::interval);
    v_factor := coalesce((backoff->>'factor')::numeric, 2);
    v_cap := least(coalesce(extract(epoch FROM (backoff->>'max')::interval), v_ceiling), v_ceiling);
    -- Compare logarithms first so factor^(a-1) is only computed when it is
    -- below cap / initial (a large attempt would overflow even numeric).
    IF (failed_attempt - 1) * ln(v_factor) < ln(v_cap / v_initial) THEN
      v_secs := least(v_initial * power(v_factor, failed_attempt - 1), v_cap);
    ELSE
      v_secs := v_cap;
    END IF;
    IF coalesce((backoff->>'jitter')::numeric, 0) > 0 THEN
      v_secs := v_secs * (1 + (backoff->>'jitter')::numeric * (2 * v_draw - 1));
    END IF;
  ELSE
    -- Kept as an interval, so "1 mon" means a calendar month from now.
    v_n := jsonb_array_length(backoff->'delays');
    RETURN least((backoff->'delays'->>(least(failed_attempt, v_n) - 1))::interval,
                 make_interval(secs => v_ceiling::float8));
  END IF;
  RETURN make_interval(secs => least(v_secs, v_ceiling)::float8);
END;
$$;

COMMENT ON FUNCTION idemq._backoff_delay(jsonb, int, float8) IS
  'Delay before the next attempt after attempt failed_attempt failed, by the job''s backoff (NULL = polynomial).';
