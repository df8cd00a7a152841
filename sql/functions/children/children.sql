-- idemq.children(job_id bigint)
--   RETURNS TABLE(name text, child_job_id bigint, state idemq.job_state, result jsonb,
--                 last_error jsonb, finished_at timestamptz)
--
-- The children of a job (spawn's, or a batch's jobs for its callback,
-- enqueue_batch), with their names: each one's state (its live state while it runs,
-- its terminal state once it finished), its result once it succeeded, its
-- latest error entry once it failed, expired or was cancelled.
--
-- Guarantees:
--   * One row per child, in the order they were linked (by id within one
--     spawn or batch; by name between links to one child, a twin
--     deduplicated onto another in one spawn or batch): the same order on
--     every call. No row for a job without children (or no such job).
--   * A finished child's outcome is the copy its finish wrote into its
--     link: still there after retention deleted the child's own row, for as
--     long as the parent is kept (its links go with it).
--   * Any idemq role may read it, as job(): keep secrets out of results and
--     error messages.
-- Concurrency: a plain read.
-- Errors: 22004 job_id NULL.
-- Tests: test/sql/children.test.ts, test/sql/batches.test.ts, test/sql/bad-input.test.ts,
--   test/worker/workflow-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.children(job_id bigint)
RETURNS TABLE(name text, child_job_id bigint, state idemq.job_state, result jsonb, last_error jsonb, finished_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF children.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'children: job_id must not be NULL',
      HINT = 'Pass the id of the job that spawned them (or of a batch''s callback).';
  END IF;
  RETURN QUERY
  SELECT c.name, c.child_id, coalesce(c.state, j.state), c.result, c.last_error, c.finished_at
  FROM idemq.job_children c
  LEFT JOIN idemq.jobs j ON j.id = c.child_id AND c.state IS NULL
  WHERE c.parent_id = children.job_id
  -- name last: two links to one child share created_at and child_id.
  ORDER BY c.created_at, c.child_id, c.name;
END;
$$;

COMMENT ON FUNCTION idemq.children(bigint) IS
  'A job''s children by name (spawn, enqueue_batch): state, result or latest error, finished_at.';
