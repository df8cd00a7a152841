-- idemq._limit(name text) RETURNS bigint
--
-- The value of one of idemq's limits, read from idemq.settings: the one place
-- each limit and its default is defined (the migration that adds a limit
-- inserts its row; docs/design.md, "Limits", lists them).
--
-- Guarantees: returns the row's value, within the row's [min_value,
--   max_value] (a CHECK holds it). An admin changes a limit with
--   UPDATE idemq.settings SET value = ... WHERE name = ...; the ranges keep
--   every limit where it cannot break storage (a btree entry, jsonb's 255 MB).
--   A name with no row raises: a misspelt limit never silently passes.
-- Concurrency: a plain read of a small table; a changed value applies to
--   statements that start after it commits.
-- Errors: 42704 no limit of that name (a schema older than its caller: run
--   idemq migrate).
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._limit(name text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_value bigint;
BEGIN
  SELECT s.value INTO v_value FROM idemq.settings s WHERE s.name = _limit.name;
  IF v_value IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '42704',
      MESSAGE = format('idemq: no limit named %s in idemq.settings', _limit.name),
      HINT = 'Run idemq migrate: the schema is older than the functions that use this limit.';
  END IF;
  RETURN v_value;
END;
$$;

COMMENT ON FUNCTION idemq._limit(text) IS
  'The value of the limit `name` (idemq.settings: one row per limit, admin-tunable within its range).';
