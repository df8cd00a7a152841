-- idemq._check_lease(lease interval, operation text) RETURNS void
--
-- Rejects a lease that is NULL, not positive, or longer than a day.
--
-- Guarantees: returns only for a usable lease.
-- Concurrency: none.
-- Errors: 22004 NULL; 22023 out of range.
-- Tests: test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._check_lease(lease interval, operation text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF lease IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: lease must not be NULL', operation),
      HINT = 'Leave it out for the default (30 seconds), or pass an interval like ''2 minutes''.';
  END IF;
  IF lease <= interval '0' OR lease > interval '1 day' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: lease must be between 0 and 1 day, not %s', operation, lease),
      HINT = 'A lease is how long a worker may hold a job between heartbeats; use seconds to minutes.';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_lease(interval, text) IS
  'Raise unless the lease is a positive interval of at most one day.';
