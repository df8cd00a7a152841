-- idemq.step_record(job_id bigint, attempt int, name text, result jsonb DEFAULT NULL,
--                   lease_token uuid DEFAULT NULL) RETURNS void
--
-- Records that the step `name` of a held job completed, with its result, in
-- the caller's transaction: every later attempt of the job reads it (steps())
-- instead of running the step again.
--
-- Guarantees:
--   * Fenced like complete(), by (job_id, attempt, lease_token): a stale
--     attempt raises IQ410 and, called in the transaction that made the
--     step's writes, rolls them back with it, so a transactional step's
--     writes commit exactly once, together with its record.
--   * A step is recorded once: recording a name the job already has raises
--     23505 (read steps() first and skip a recorded step).
--   * result NULL means the step returned nothing; its size is at most
--     _result_limit bytes of JSON text.
--   * The record is deleted with its job (retention, purge, delete_jobs).
-- Concurrency: locks the job row (_lock_held) until the caller's
--   transaction ends: a rescue or cancel waits for it, or commits first and
--   this raises IQ410.
-- Errors: 22004 NULL job_id/attempt/name; 22023 empty name, name over
--   key_bytes, result over the limit (the message names the job and the
--   step); IQ404 no such job; IQ410 not held; 23505 step already recorded.
-- Tests: test/sql/steps.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts,
--   test/worker/steps.test.ts, test/worker/steps-faults.test.ts, test/worker/steps-restart.test.ts,
--   test/worker/workflow-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.step_record(job_id bigint, attempt int, name text, result jsonb DEFAULT NULL,
                                             lease_token uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM idemq._check_step('step_record', step_record.job_id, step_record.name, step_record.result);
  PERFORM idemq._lock_held('step_record', step_record.job_id, step_record.attempt, step_record.lease_token);
  INSERT INTO idemq.job_steps AS s (job_id, name, kind, status, result, attempt)
  VALUES (step_record.job_id, step_record.name, 'step', 'done', step_record.result, step_record.attempt)
  ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '23505',
      MESSAGE = format('step_record: job %s already recorded step "%s"', step_record.job_id,
                       idemq._excerpt(step_record.name)),
      DETAIL = jsonb_build_object('job_id', step_record.job_id, 'name', step_record.name)::text,
      HINT = 'A step is recorded once: read the job''s steps (idemq.steps) first and use the recorded result.';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.step_record(bigint, int, text, jsonb, uuid) IS
  'Record a held job''s completed step with its result, fenced like complete(); in the transaction of the step''s writes.';
