-- idemq._check_timezone(timezone text, operation text) RETURNS void
--
-- Rejects a time zone that is NULL or not an IANA zone name PostgreSQL knows.
--
-- Guarantees: returns only for a name in pg_timezone_names (e.g. UTC,
--   Europe/Berlin, America/New_York). Abbreviations (CEST) and POSIX strings
--   (UTC+3, whose sign PostgreSQL inverts) are refused: they have no DST
--   rules, or surprising ones.
-- Concurrency: none.
-- Errors: 22004 NULL; 22023 unknown zone, with a HINT.
-- Tests: test/sql/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq._check_timezone(timezone text, operation text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_timezone.timezone IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: timezone must not be NULL', _check_timezone.operation),
      HINT = 'Leave it out for UTC, or pass an IANA zone name such as ''Europe/Berlin''.';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names z WHERE z.name = _check_timezone.timezone) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: timezone "%s" is not an IANA time zone name', _check_timezone.operation, _check_timezone.timezone),
      HINT = 'Use a name from pg_timezone_names, such as UTC, Europe/Berlin or America/New_York (not an abbreviation like CEST).';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_timezone(text, text) IS
  'Raise unless the time zone is an IANA name PostgreSQL knows.';
