-- idemq._lock_job(job_id bigint, operation text) RETURNS idemq.jobs
--
-- Locks one job for an operator's operation (cancel, retry, reschedule) and
-- returns its row.
--
-- Guarantees: returns the committed row, locked until the caller's
--   transaction ends; raises rather than return nothing.
-- Concurrency: FOR NO KEY UPDATE: waits for a worker completing the job.
-- Errors: 22004 NULL job_id; IQ404 no such job.
-- Tests: test/sql/admin.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._lock_job(job_id bigint, operation text)
RETURNS idemq.jobs
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
BEGIN
  IF _lock_job.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_id must not be NULL', operation),
      HINT = 'Pass the id enqueue() returned.';
  END IF;
  SELECT j.* INTO v_job FROM idemq.jobs j WHERE j.id = _lock_job.job_id FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('%s: job %s does not exist', operation, _lock_job.job_id),
      HINT = 'Check the id (idemq jobs lists jobs); finished jobs may have been purged.';
  END IF;
  RETURN v_job;
END;
$$;

COMMENT ON FUNCTION idemq._lock_job(bigint, text) IS
  'Lock and return one job for an operator''s operation; IQ404 if it does not exist.';
