-- idemq._history_kept() RETURNS interval
--
-- How far back the dashboard's history (idemq.job_minutes) reaches: the
-- span roll_up() keeps, apply_retention()'s fold writes counts for, and
-- history() may be asked for. One definition, so the three cannot drift.
--
-- Guarantees: the same interval on every call (a day).
-- Concurrency: immutable.
-- Errors: none.
-- Tests: test/sql/history.test.ts
CREATE OR REPLACE FUNCTION idemq._history_kept()
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN interval '1 day';

COMMENT ON FUNCTION idemq._history_kept() IS
  'The span of the dashboard history (idemq.job_minutes): a day.';
