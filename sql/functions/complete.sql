-- idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL) RETURNS void
--
-- Marks a job succeeded, fenced by (job_id, attempt).
--
-- Guarantees:
--   * locked_by keeps the worker whose attempt succeeded (for the job's timeline).
--   * Succeeds only while that attempt holds the job (state processing,
--     same attempt); otherwise raises IQ410 and changes nothing. Called in the
--     transaction that wrote the job's effect, a lost lease rolls the effect
--     back with it: a stale worker can never commit.
--   * Holding includes a lease that ran out but was not yet rescued.
--   * The job's idempotency key is marked finished (the policy now applies)
--     and jobs waiting on it (after) are released when all their parents succeeded.
-- Concurrency: row lock on the job; a concurrent rescue() or cancel() either
--   commits first (then this raises IQ410) or waits for this transaction.
-- Errors: IQ404 no such job; IQ410 lease lost (DETAIL {"job_id","attempt",
--   "current_state"}); 22004 NULL job_id/attempt.
-- Tests: test/sql/complete.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  UPDATE idemq.jobs AS j
  SET state = 'succeeded', result = complete.result, finished_at = now(),
      lease_expires_at = NULL
  WHERE j.id = complete.job_id AND j.attempt = complete.attempt AND idemq._held(j.lease_expires_at, j.locked_by);
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(complete.job_id, complete.attempt, 'complete');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.complete(bigint, int, jsonb) IS
  'Mark a job succeeded if attempt still holds it; IQ410 (lease lost) otherwise, so the caller''s transaction rolls back.';
