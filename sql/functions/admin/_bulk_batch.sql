-- idemq._bulk_batch(operation text, filter jsonb, action text, before_id bigint, max_jobs int)
--   RETURNS TABLE(job_ids bigint[], more boolean, next_before_id bigint, batch int)
--
-- One batch of a bulk action: the newest max_jobs jobs below before_id that
-- the filter matches in the action's states (_matching_jobs,
-- _action_states), locked, and where the next batch starts.
--
-- Guarantees:
--   * job_ids are the batch's jobs this transaction now holds locked and
--     still in the action's states; a job of the batch that moved on (another
--     state, deleted) or that another transaction holds (a worker completing
--     it) is left out, not waited for. The caller counts those as skipped
--     (the batch's size less what it touched).
--   * more is true when jobs below the batch match (read with the batch:
--     max_jobs + 1 rows); next_before_id is then the batch's oldest id, to
--     pass as before_id; NULL when more is false. Walking down from the
--     newest, a bulk action never reaches jobs enqueued after it started.
--   * batch is how many jobs the batch had before locking (job_ids and the
--     jobs left out).
--   * Locks: FOR UPDATE for delete (the rows go), FOR NO KEY UPDATE for the
--     others (as _lock_job), newest first (the order the caller acts in);
--     for retry, the batch's concurrency keys first (_key_lock), the order
--     retry() takes them in.
-- Concurrency: SKIP LOCKED, so a batch never waits for a worker and never
--   deadlocks with one; its locks are held until the caller's transaction
--   (one call of the bulk action) ends.
-- Errors: _check_job_filter's; _action_states'; 22004 NULL max_jobs;
--   22023 max_jobs outside 1..10000.
-- Tests: test/sql/bulk-actions.test.ts
CREATE OR REPLACE FUNCTION idemq._bulk_batch(operation text, filter jsonb, action text, before_id bigint, max_jobs int)
RETURNS TABLE(job_ids bigint[], more boolean, next_before_id bigint, batch int)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_states idemq.job_state[];
  v_ids bigint[];
BEGIN
  IF max_jobs IS NULL OR max_jobs NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN max_jobs IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('%s: max_jobs must be between 1 and 10000, not %s', operation, coalesce(max_jobs::text, 'NULL')),
      HINT = 'Act in batches of a few thousand at most: call again with before_id => next_before_id while more is true.';
  END IF;
  v_states := idemq._action_states(operation, action);
  v_ids := ARRAY(SELECT m.id FROM idemq._matching_jobs(operation, filter, v_states, before_id, max_jobs + 1) AS m(id));
  more := cardinality(v_ids) > max_jobs;
  IF more THEN
    v_ids := v_ids[1:max_jobs];
    next_before_id := v_ids[max_jobs];
  END IF;
  batch := cardinality(v_ids);
  IF action = 'retry' THEN
    -- A concurrency key never changes: read it unlocked, lock the keys first.
    PERFORM idemq._key_lock(ARRAY(SELECT j.concurrency_key FROM idemq.jobs j WHERE j.id = ANY (v_ids)));
  END IF;
  IF action = 'delete' THEN
    job_ids := ARRAY(SELECT j.id FROM idemq.jobs j
                     WHERE j.id = ANY (v_ids) AND j.state = ANY (v_states)
                     ORDER BY j.id DESC FOR UPDATE SKIP LOCKED);
  ELSE
    job_ids := ARRAY(SELECT j.id FROM idemq.jobs j
                     WHERE j.id = ANY (v_ids) AND j.state = ANY (v_states)
                     ORDER BY j.id DESC FOR NO KEY UPDATE SKIP LOCKED);
  END IF;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq._bulk_batch(text, jsonb, text, bigint, int) IS
  'One batch of a bulk action: the matching jobs in the action''s states, locked SKIP LOCKED, and where the next batch starts.';
