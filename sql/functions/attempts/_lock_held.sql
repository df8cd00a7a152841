-- idemq._lock_held(operation text, job_id bigint, attempt int, lease_token uuid,
--                  OUT queue text, OUT created_at timestamptz)
--
-- Locks the job an attempt holds (the fencing of complete(): same attempt,
-- same lease token, lease set), for the functions that act for a held job
-- in more than one statement: the step functions that write its ledger,
-- spawn and wait_for_children.
--
-- Guarantees: returns the job's queue and created_at only while
--   (job_id, attempt, lease_token) holds it, and keeps it so until the
--   caller's transaction ends: a rescue, cancel or newer claim waits.
-- Concurrency: FOR NO KEY UPDATE on the job row; a concurrent rescue() or
--   cancel() either commits first (then this raises IQ410) or waits.
-- Errors: 22004 NULL job_id/attempt; IQ404 no such job; IQ410 not held.
-- Tests: test/sql/steps.test.ts, test/sql/children.test.ts
CREATE OR REPLACE FUNCTION idemq._lock_held(operation text, job_id bigint, attempt int, lease_token uuid,
                                            OUT queue text, OUT created_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  SELECT j.queue, j.created_at INTO _lock_held.queue, _lock_held.created_at
  FROM idemq.jobs j
  WHERE j.id = _lock_held.job_id AND j.attempt = _lock_held.attempt
    AND j.lease_token IS NOT DISTINCT FROM _lock_held.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(_lock_held.job_id, _lock_held.attempt, operation);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._lock_held(text, bigint, int, uuid) IS
  'Lock the job (job_id, attempt, lease_token) holds, or raise IQ410/IQ404: the fencing of the step functions, spawn and wait_for_children.';
