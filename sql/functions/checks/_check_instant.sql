-- idemq._check_instant(operation text, what text, value timestamptz) RETURNS void
--
-- Refuses an instant that is infinity or -infinity where a job needs a real
-- time (a run_at, a retry_at): such a job would run never, or sort before
-- every other and break the age arithmetic of stats().
--
-- Guarantees: returns only when value is NULL or finite.
-- Concurrency: none.
-- Errors: 22023 infinite.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_instant(operation text, what text, value timestamptz)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF NOT isfinite(value) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: %s must be a finite time, not %s', operation, what, value),
      HINT = 'Pass a real time, e.g. now() + interval ''1 hour'' (or now() to run at once).';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_instant(text, text, timestamptz) IS
  'Raise 22023 when an instant is infinity or -infinity.';
