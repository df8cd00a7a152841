-- idemq.run_jobs_now(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
--   RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
--
-- Brings every scheduled job a filter matches forward to now, one batch per
-- call: reschedule(job, now()) each, so it is enqueued and runs at once.
--
-- Guarantees:
--   * Each job goes through reschedule() itself: attempts, errors and key
--     untouched; waiting workers are notified. Only scheduled jobs are
--     taken: an enqueued job already runs now, and an awaiting one waits for
--     its parents or its concurrency key, not for its time.
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
CREATE OR REPLACE FUNCTION idemq.run_jobs_now(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
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
  SELECT * INTO v_batch FROM idemq._bulk_batch('run_jobs_now', filter, 'run_now', before_id, max_jobs);
  FOREACH v_id IN ARRAY v_batch.job_ids LOOP
    PERFORM idemq.reschedule(v_id, now());
  END LOOP;
  touched := cardinality(v_batch.job_ids);
  skipped := v_batch.batch - touched;
  more := v_batch.more;
  next_before_id := v_batch.next_before_id;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.run_jobs_now(jsonb, bigint, int) IS
  'Enqueue the scheduled jobs a filter matches now (reschedule() each), one batch of at most max_jobs per call.';
