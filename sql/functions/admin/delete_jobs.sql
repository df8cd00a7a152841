-- idemq.delete_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
--   RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
--
-- Deletes the finished jobs a filter matches, one batch per call, as
-- purge() deletes them (_delete_jobs).
--
-- Guarantees:
--   * Only terminal jobs are deleted (active ones match no batch: cancel
--     them first), with the dependency rows naming them as a parent; their
--     idempotency keys stay in the ledger until prune_keys(), as after purge().
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
CREATE OR REPLACE FUNCTION idemq.delete_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
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
  SELECT * INTO v_batch FROM idemq._bulk_batch('delete_jobs', filter, 'delete', before_id, max_jobs);
  touched := idemq._delete_jobs(v_batch.job_ids);
  skipped := v_batch.batch - touched;
  more := v_batch.more;
  next_before_id := v_batch.next_before_id;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.delete_jobs(jsonb, bigint, int) IS
  'Delete the finished jobs a filter matches (keys stay until prune_keys), one batch of at most max_jobs per call.';
