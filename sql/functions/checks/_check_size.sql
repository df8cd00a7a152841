-- idemq._check_size(operation text, what text, value text, limit_name text, hint text) RETURNS void
--
-- Refuses a text argument longer, in bytes of UTF-8, than the limit
-- `limit_name` (idemq._limit): a key, an owner, a worker id.
--
-- Guarantees: returns only when value is NULL or at most the limit's bytes.
--   The message names the operation, the argument, its size and the limit,
--   and quotes only an excerpt (_excerpt) of the value.
-- Concurrency: none.
-- Errors: 22023 over the limit, with `hint` as its HINT.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_size(operation text, what text, value text, limit_name text, hint text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_limit bigint;
BEGIN
  IF value IS NULL THEN
    RETURN;
  END IF;
  v_limit := idemq._limit(limit_name);
  IF octet_length(value) > v_limit THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: %s is %s bytes, over the limit of %s bytes (%s %s)',
                       operation, what, octet_length(value), v_limit, limit_name, idemq._excerpt(value)),
      HINT = hint;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_size(text, text, text, text, text) IS
  'Raise 22023 when a text argument is over its byte limit (idemq._limit).';
