-- idemq._release_waiting(job_id bigint) RETURNS void
--
-- Ends a parked parent's wait for its children (wait_for_children, or a
-- batch's callback, enqueue_batch): removes its gate, the dependency row
-- (job_id, job_id) that keeps an awaiting job from being promoted, and
-- makes it runnable as a child whose parents all succeeded is: enqueued
-- (or scheduled, _initial_state) and its queue's waiting consumers woken,
-- or, with a concurrency key, left awaiting for its key (_key_promote).
--
-- Guarantees:
--   * Does nothing to a job that is not parked (no gate): one still
--     running, one cancelled or expired while it waited (the jobs trigger
--     removed its gate then), one already released.
--   * A job that also waits for `after` parents stays awaiting until they
--     succeeded (the continuations release it).
-- Concurrency: the caller holds the parent's child_waits row; this locks the
--   gate row and the job's row (in that order, as wait_for_children does).
-- Errors: none of its own.
-- Tests: test/sql/children.test.ts, test/sql/batches.test.ts
CREATE OR REPLACE FUNCTION idemq._release_waiting(job_id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_moved record;
  v_key text;
BEGIN
  DELETE FROM idemq.job_dependencies AS d
  WHERE d.parent_id = _release_waiting.job_id AND d.child_id = _release_waiting.job_id;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  UPDATE idemq.jobs AS j
  SET state = idemq._initial_state(j.run_at)
  WHERE j.id = _release_waiting.job_id AND j.state = 'awaiting' AND j.concurrency_key IS NULL
    AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id)
  RETURNING j.queue, j.state INTO v_moved;
  IF FOUND THEN
    IF v_moved.state = 'enqueued' THEN
      PERFORM idemq._notify_waiting(v_moved.queue);
    END IF;
    RETURN;
  END IF;
  SELECT j.concurrency_key INTO v_key
  FROM idemq.jobs j
  WHERE j.id = _release_waiting.job_id AND j.state = 'awaiting' AND j.concurrency_key IS NOT NULL;
  IF v_key IS NOT NULL THEN
    PERFORM idemq._key_promote(ARRAY[v_key]);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._release_waiting(bigint) IS
  'End a parked job''s wait for its children: remove its gate and make it runnable (or let its concurrency key admit it).';
