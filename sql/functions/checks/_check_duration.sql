-- idemq._check_duration(operation text, what text, value interval) RETURNS void
--
-- Refuses a duration longer than the limit duration_days (idemq._limit),
-- before now() plus or minus it can overflow a timestamp: a retention, a
-- staleness. (Whether it may be zero or negative is the caller's check.)
--
-- Guarantees: returns only when value is NULL or at most duration_days days
--   (an infinite interval, PostgreSQL 17 and later, is refused too).
-- Concurrency: none.
-- Errors: 22023 too long.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_duration(operation text, what text, value interval)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_days bigint := idemq._limit('duration_days');
BEGIN
  IF value > make_interval(days => v_days::int) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: %s must be at most %s days, not %s', operation, what, v_days, value),
      HINT = format('Use a duration of at most %s days (duration_days in idemq.settings).', v_days);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_duration(text, text, interval) IS
  'Raise 22023 when a duration is over the limit duration_days (so now() +/- it cannot overflow).';
