-- idemq.retry_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
--   RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
--
-- retry() of every failed, cancelled or expired job a filter matches, one
-- batch per call: each runs again with fresh attempts, as retry() says.
--
-- Guarantees:
--   * Each job goes through retry() itself: its rules (the states it takes,
--     its key taken again, a concurrency key waited for) are retry()'s.
--   * One batch per call, one short transaction: at most max_jobs jobs, the
--     newest that match below before_id (_bulk_batch). Call again with
--     before_id => next_before_id while more is true; the CLI does, and
--     count_jobs(filter, action => ...) says beforehand how many will be taken.
--   * skipped: jobs of the batch not touched because they moved on since
--     the filter matched them (another state, deleted), or another
--     transaction held them (a worker completing one),
--     and jobs whose idempotency key another active job holds (retry()'s
--     IQ409: a job of the same key retried earlier in the batch included),
--     which stay as they are.
-- Concurrency: the batch's rows locked SKIP LOCKED (_bulk_batch), so a
--   batch never waits for a worker; held until the call returns.
--   Each retry() runs in a subtransaction (to leave an IQ409 job as it is):
--   up to max_jobs of them in one transaction. Concurrency keys are locked
--   before the rows (_key_lock), as retry() does.
-- Errors: 22004 NULL filter or max_jobs; 22023 a bad filter (the HINT names
--   the field) or max_jobs outside 1..10000.
-- Tests: test/sql/bulk-actions.test.ts, test/sql/roles.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.retry_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_batch record;
  v_id bigint;
BEGIN
  SELECT * INTO v_batch FROM idemq._bulk_batch('retry_jobs', filter, 'retry', before_id, max_jobs);
  touched := 0;
  FOREACH v_id IN ARRAY v_batch.job_ids LOOP
    BEGIN
      PERFORM idemq.retry(v_id);
      touched := touched + 1;
    EXCEPTION WHEN SQLSTATE 'IQ409' THEN
      NULL; -- its key is held by another active job: retry() changed nothing
    END;
  END LOOP;
  skipped := v_batch.batch - touched;
  more := v_batch.more;
  next_before_id := v_batch.next_before_id;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.retry_jobs(jsonb, bigint, int) IS
  'Retry the failed, cancelled or expired jobs a filter matches, one batch of at most max_jobs per call (retry() each).';
