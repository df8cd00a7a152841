-- idemq._raise_null_argument(operation text, argument text) RETURNS void
--
-- Raises 22004 for an argument of `operation` passed as NULL where it has a
-- default: enqueue's and schedule's optional arguments.
--
-- Guarantees: always raises; the one wording of that error, naming the
--   argument in the message and the HINT. Callers pick the first NULL
--   argument themselves and call this only then, so a valid call costs
--   nothing.
-- Concurrency: none.
-- Errors: always 22004.
-- Tests: test/sql/bad-input.test.ts, test/sql/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_null_argument(operation text, argument text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22004',
    MESSAGE = format('%s: %s must not be NULL', operation, argument),
    HINT = format('Pass a value for %s, or leave the argument out to use its default.', argument);
END;
$$;

COMMENT ON FUNCTION idemq._raise_null_argument(text, text) IS
  'Raise 22004 for an argument passed as NULL where it has a default, with a HINT to leave it out.';
