-- idemq._enqueue_limits() RETURNS idemq._enqueue_limits
--
-- The limits an enqueue checks, read from idemq.settings in one query, once
-- per enqueue or enqueue_many call: payload_bytes, key_bytes (the
-- idempotency key), task_bytes, parents_per_job (after) and jobs_per_call.
--
-- Guarantees: every field is the value of the settings row of its name, as
--   _limit() reads it (so a limit still has one definition: its row); a row
--   missing raises as _limit() does. _job_problem takes the result as an
--   argument, so a batch reads each limit once, not once per element (called
--   per element, _limit costs a query each; inlined, a field of a parameter
--   is read in nanoseconds).
-- Concurrency: a plain read of idemq.settings; a changed value applies to
--   statements that start after it commits.
-- Errors: 42704 a limit row is missing (a schema older than its caller: run
--   idemq migrate).
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_limits()
RETURNS idemq._enqueue_limits
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_limits idemq._enqueue_limits;
BEGIN
  SELECT max(s.value) FILTER (WHERE s.name = 'payload_bytes'),
         max(s.value) FILTER (WHERE s.name = 'key_bytes'),
         max(s.value) FILTER (WHERE s.name = 'task_bytes'),
         max(s.value) FILTER (WHERE s.name = 'parents_per_job'),
         max(s.value) FILTER (WHERE s.name = 'jobs_per_call')
  INTO v_limits
  FROM idemq.settings s
  WHERE s.name IN ('payload_bytes', 'key_bytes', 'task_bytes', 'parents_per_job', 'jobs_per_call');
  IF NOT (v_limits IS NOT NULL) THEN
    -- A row is missing: _limit names it in its 42704.
    PERFORM idemq._limit('payload_bytes'), idemq._limit('key_bytes'), idemq._limit('task_bytes'),
            idemq._limit('parents_per_job'), idemq._limit('jobs_per_call');
  END IF;
  RETURN v_limits;
END;
$$;

COMMENT ON FUNCTION idemq._enqueue_limits() IS
  'The limits an enqueue checks (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call), read once per call.';
