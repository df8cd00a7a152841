-- idemq.cancel_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
--   RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
--
-- cancel() of every active job a filter matches, one batch per call.
--
-- Guarantees:
--   * Each job goes through cancel() itself: a running attempt is fenced
--     out, its key finished, its awaiting children cancelled, its
--     flow-control slot and key place freed, as cancel() says. A job of the
--     batch cancelled with its parent earlier in the batch counts as touched.
--   * One batch per call, one short transaction: at most max_jobs jobs, the
--     newest that match below before_id (_bulk_batch). Call again with
--     before_id => next_before_id while more is true; the CLI does, and
--     count_jobs(filter, action => ...) says beforehand how many will be taken.
--   * skipped: jobs of the batch not touched because they moved on since
--     the filter matched them (another state, deleted), or another
--     transaction held them (a worker completing one).
-- Concurrency: the batch's rows locked SKIP LOCKED (_bulk_batch), so a
--   batch never waits for a worker; held until the call returns.
-- Errors: 22004 NULL filter or max_jobs; 22023 a bad filter (the HINT names
--   the field) or max_jobs outside 1..10000.
-- Tests: test/sql/bulk-actions.test.ts, test/sql/roles.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.cancel_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
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
  SELECT * INTO v_batch FROM idemq._bulk_batch('cancel_jobs', filter, 'cancel', before_id, max_jobs);
  FOREACH v_id IN ARRAY v_batch.job_ids LOOP
    -- Locked by this call, so only its own cancels (a parent's cascade) move it.
    IF (SELECT j.state FROM idemq.jobs j WHERE j.id = v_id) = ANY (idemq._action_states('cancel_jobs', 'cancel')) THEN
      PERFORM idemq.cancel(v_id);
    END IF;
  END LOOP;
  touched := cardinality(v_batch.job_ids);
  skipped := v_batch.batch - touched;
  more := v_batch.more;
  next_before_id := v_batch.next_before_id;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.cancel_jobs(jsonb, bigint, int) IS
  'Cancel the active jobs a filter matches, one batch of at most max_jobs per call (cancel() each).';
