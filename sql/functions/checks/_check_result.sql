-- idemq._check_result(operation text, what text, value jsonb, hint text) RETURNS void
--
-- Refuses a JSON value whose text is over _result_limit() bytes: a job's
-- result (complete), a step's result (_check_step), an event's payload
-- (emit). `what` names the value in the message, its job or step included
-- ("job 5: the result").
--
-- Guarantees: returns only when value is NULL or its JSON text is at most
--   _result_limit() bytes. The message names the operation, the value, its
--   size and the limit; it never quotes the value.
-- Concurrency: none.
-- Errors: 22023 over the limit, with `hint` as its HINT.
-- Tests: test/sql/complete.test.ts, test/sql/steps.test.ts
CREATE OR REPLACE FUNCTION idemq._check_result(operation text, what text, value jsonb, hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_bytes int := octet_length(_check_result.value::text);
BEGIN
  IF v_bytes > idemq._result_limit() THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: %s is %s bytes of JSON, over the limit of %s bytes', operation, what, v_bytes, idemq._result_limit()),
      HINT = hint;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_result(text, text, jsonb, text) IS
  'Raise 22023 when a result or event payload is over _result_limit() bytes of JSON text.';
