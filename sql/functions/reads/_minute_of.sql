-- idemq._minute_of(at timestamptz) RETURNS timestamptz
--
-- The minute of idemq.job_minutes a time falls in: at, rounded down to a
-- whole minute of UTC.
--
-- Guarantees: the same minute for every caller (roll_up(), history(),
--   apply_retention()'s fold), whatever the session's time zone, so their
--   rows meet on (minute, queue, task). NULL for NULL.
-- Concurrency: immutable.
-- Errors: none.
-- Tests: test/sql/history.test.ts
CREATE OR REPLACE FUNCTION idemq._minute_of(at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN date_bin('1 minute', at, '2000-01-01 00:00:00+00');

COMMENT ON FUNCTION idemq._minute_of(timestamptz) IS
  'The job_minutes minute a time falls in (rounded down to a whole UTC minute).';
