-- idemq._link_children(parent_id bigint, children idemq._planned_job[], names text[], fail_fast boolean,
--   OUT pending int, OUT failed int) RETURNS record
--
-- The part spawn and enqueue_batch share after their children went through
-- the enqueue pipeline (_enqueue_planned with as_children): links each
-- created or deduplicated element of `children` to `parent_id` under the
-- name names[ordinal] (job_children), records the outcome of those already
-- finished, and adds them to the parent's count (child_waits).
--
-- Guarantees:
--   * Elements whose outcome is rejected or conflict are not linked.
--   * A child that finished before its link was written counts as
--     finished, its outcome copied into its link: one deduplicated onto a
--     job that finished, or one created and cancelled at once because a
--     parent in its `after` had not succeeded (_insert_jobs). Every other
--     child finishes later and finds its link (_child_finished).
--   * Deduplicated children are existing jobs: they get has_children here
--     (created ones were written with it); nothing else rewrites a child.
--   * The count row is created, or added to with fail_fast replaced (a
--     replay's spawn); OUT pending, failed: the row's values after it.
--   * Linear in the number of children: one INSERT of links, one upsert of
--     the count; the statements over deduplicated or `after` children run
--     only when there are some, and touch only those.
-- Concurrency: locks the deduplicated children's rows (FOR NO KEY UPDATE, in
--   id order) before it reads their state, in a statement of its own, so
--   one finishing at the same time either finished before (read so) or
--   finds its link; then the parent's child_waits row until the caller's
--   transaction ends.
-- Errors: none of its own (the callers checked the names and the children).
-- Tests: test/sql/children.test.ts, test/sql/batches.test.ts
CREATE OR REPLACE FUNCTION idemq._link_children(parent_id bigint, children idemq._planned_job[], names text[],
                                                fail_fast boolean, OUT pending int, OUT failed int)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the children array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_linked int;
  v_existing bigint[];
  v_finished int := 0;
  v_unsuccessful int := 0;
BEGIN
  INSERT INTO idemq.job_children (parent_id, name, child_id)
  SELECT _link_children.parent_id, _link_children.names[p.ordinal], p.job_id
  FROM unnest(_link_children.children) p
  WHERE p.outcome IN ('created', 'deduplicated');
  GET DIAGNOSTICS v_linked = ROW_COUNT;

  v_existing := ARRAY(SELECT p.job_id FROM unnest(_link_children.children) p
                      WHERE p.outcome = 'deduplicated' ORDER BY p.job_id);
  IF cardinality(v_existing) > 0 THEN
    -- `id = ANY (array)` on the primary key is an index condition: one
    -- probe per element of the array (EXPLAIN: Index Cond), not a filter
    -- that compares every row with the whole list.
    PERFORM 1 FROM idemq.jobs j WHERE j.id = ANY (v_existing) ORDER BY j.id FOR NO KEY UPDATE;
    UPDATE idemq.jobs AS j SET has_children = true WHERE j.id = ANY (v_existing) AND NOT j.has_children;
  END IF;
  IF cardinality(v_existing) > 0
     OR EXISTS (SELECT FROM unnest(_link_children.children) p WHERE p.outcome = 'created' AND p.after IS NOT NULL) THEN
    WITH copied AS (
      UPDATE idemq.job_children AS c
      SET state = j.state, finished_at = j.finished_at,
          result = CASE WHEN j.state = 'succeeded' THEN j.result END,
          last_error = CASE WHEN j.state <> 'succeeded' THEN j.errors -> -1 END
      FROM unnest(_link_children.children) p
      JOIN idemq.jobs j ON j.id = p.job_id
      WHERE (p.outcome = 'deduplicated' OR (p.outcome = 'created' AND p.after IS NOT NULL))
        AND j.finished_at IS NOT NULL
        AND c.parent_id = _link_children.parent_id AND c.name = _link_children.names[p.ordinal]
      RETURNING c.state
    )
    SELECT count(*), count(*) FILTER (WHERE x.state <> 'succeeded') INTO v_finished, v_unsuccessful
    FROM copied x;
  END IF;

  INSERT INTO idemq.child_waits AS w (parent_id, pending, failed, fail_fast)
  VALUES (_link_children.parent_id, v_linked - v_finished, v_unsuccessful, _link_children.fail_fast)
  -- By constraint name: the parameter parent_id would make `(parent_id)` ambiguous.
  ON CONFLICT ON CONSTRAINT child_waits_pkey DO UPDATE
    SET pending = w.pending + EXCLUDED.pending, failed = w.failed + EXCLUDED.failed, fail_fast = EXCLUDED.fail_fast
  RETURNING w.pending, w.failed INTO _link_children.pending, _link_children.failed;
END;
$$;

COMMENT ON FUNCTION idemq._link_children(bigint, idemq._planned_job[], text[], boolean) IS
  'Link enqueued children to their parent (job_children), record those already finished, and add them to its child_waits count.';
