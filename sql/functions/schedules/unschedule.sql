-- idemq.unschedule(name text) RETURNS boolean
--
-- Removes the schedule `name`. Returns whether it existed.
--
-- Guarantees: no slot of it is enqueued afterwards; jobs it already
--   enqueued stay (cancel them if they should not run). Removing a name that
--   does not exist returns false and changes nothing.
-- Concurrency: waits for a tick() that holds the schedule row.
-- Errors: 22004 name is NULL.
-- Tests: test/sql/schedules.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.unschedule(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_found boolean;
BEGIN
  IF unschedule.name IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'unschedule: name must not be NULL',
      HINT = 'Pass the name the schedule was created with; idemq.schedules() lists them.';
  END IF;
  DELETE FROM idemq.schedules AS s WHERE s.name = unschedule.name;
  GET DIAGNOSTICS v_found = ROW_COUNT;
  RETURN v_found;
END;
$$;

COMMENT ON FUNCTION idemq.unschedule(text) IS
  'Remove a recurring schedule; jobs it already enqueued stay.';
