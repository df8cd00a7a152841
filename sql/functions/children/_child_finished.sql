-- idemq._child_finished(child_id bigint, state idemq.job_state, result jsonb, errors jsonb) RETURNS void
--
-- Called by the jobs trigger (_on_job_finished) for a job entering a
-- terminal state that has has_children set: records the outcome of a child
-- in each of its unfinished links (job_children), counts it in its parent's
-- child_waits row, and releases the parent (_release_waiting) when this
-- was its last unfinished child, or its first unsuccessful one under
-- fail_fast. A job that is nobody's child costs one probe of the small
-- partial index job_children_active_child.
--
-- Guarantees:
--   * Each link is finished once (only links still unfinished are
--     updated): its state, its result when it succeeded, its latest error
--     entry otherwise, and finished_at.
--   * Exactly one finishing child of a parent sees pending reach 0 (the
--     count is updated in place under its row lock, so a second finisher
--     waits for the first to commit and counts on from its value); a
--     parent parked by wait_for_children is released then, whatever the
--     order its children finished in. Linear: one row of child_waits per
--     child finished, never a count of the siblings.
-- Concurrency: locks the link rows, then the parent's child_waits row
--   until the finishing transaction ends: the children of one parent finish
--   one at a time there (see docs/design.md, "Children and batches", for
--   what that costs); then the parent's row when it releases it.
-- Errors: none of its own.
-- Tests: test/sql/children.test.ts
CREATE OR REPLACE FUNCTION idemq._child_finished(child_id bigint, state idemq.job_state, result jsonb, errors jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_parent bigint;
  v_wait record;
  v_failed int := CASE WHEN _child_finished.state = 'succeeded' THEN 0 ELSE 1 END;
BEGIN
  FOR v_parent IN
    UPDATE idemq.job_children AS c
    SET state = _child_finished.state, finished_at = now(),
        result = CASE WHEN _child_finished.state = 'succeeded' THEN _child_finished.result END,
        last_error = CASE WHEN _child_finished.state <> 'succeeded' THEN _child_finished.errors -> -1 END
    WHERE c.child_id = _child_finished.child_id AND c.state IS NULL
    RETURNING c.parent_id
  LOOP
    UPDATE idemq.child_waits AS w
    SET pending = w.pending - 1, failed = w.failed + v_failed
    WHERE w.parent_id = v_parent
    RETURNING w.pending, w.failed, w.fail_fast INTO v_wait;
    IF FOUND AND (v_wait.pending = 0 OR (v_wait.fail_fast AND v_failed = 1)) THEN
      PERFORM idemq._release_waiting(v_parent);
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._child_finished(bigint, idemq.job_state, jsonb, jsonb) IS
  'Trigger helper: record a finished child''s outcome in its links, count it, and release a parent whose wait it ends.';
