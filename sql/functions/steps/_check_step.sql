-- idemq._check_step(operation text, job_id bigint, name text, result jsonb) RETURNS void
--
-- Refuses a bad step name or a step result (an event payload) over
-- _result_limit, naming the job and the step.
--
-- Guarantees: returns only when name is non-empty and at most key_bytes
--   bytes (idemq._limit), and result is NULL or at most _result_limit
--   bytes of JSON text.
-- Concurrency: none.
-- Errors: 22004 NULL name; 22023 empty name, name over key_bytes, result over
--   the limit.
-- Tests: test/sql/steps.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._check_step(operation text, job_id bigint, name text, result jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_step.name IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job %s: the step name must not be NULL', operation, _check_step.job_id),
      HINT = 'Name each step of a job once, e.g. ''charge-card''.';
  END IF;
  IF _check_step.name = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: job %s: the step name must not be empty', operation, _check_step.job_id),
      HINT = 'Name each step of a job once, e.g. ''charge-card''.';
  END IF;
  PERFORM idemq._check_size(operation, 'the step name', _check_step.name, 'key_bytes',
                            'Use a shorter step name: it identifies the step within its job.');
  PERFORM idemq._check_result(operation, format('job %s, step "%s": the result', _check_step.job_id, idemq._excerpt(_check_step.name)),
    _check_step.result, 'Keep a step''s result small (ids, amounts, statuses); store bulky data in a table and return its key.');
END;
$$;

COMMENT ON FUNCTION idemq._check_step(text, bigint, text, jsonb) IS
  'Raise 22004/22023 for a bad step name or a step result over _result_limit, naming the job and step.';
