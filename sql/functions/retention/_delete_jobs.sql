-- idemq._delete_jobs(job_ids bigint[]) RETURNS int
--
-- Deletes finished jobs the caller has already locked (purge,
-- apply_retention), with the dependency rows that name them as a parent
-- and, for a parent of spawned children, its links and count.
-- Returns how many jobs it deleted.
--
-- Guarantees:
--   * Deletes only terminal jobs, whatever ids it is given.
--   * Never touches idemq.keys: a deleted job's key still deduplicates or
--     rejects until prune_keys() releases it.
-- Concurrency: the callers lock the rows first (FOR UPDATE SKIP LOCKED), so
--   this waits for nothing.
-- Errors: none of its own.
-- Tests: test/sql/retention.test.ts, test/sql/retention-policy.test.ts, test/sql/children.test.ts
CREATE OR REPLACE FUNCTION idemq._delete_jobs(job_ids bigint[])
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  WITH gone AS (
    DELETE FROM idemq.jobs AS j
    WHERE j.id = ANY (_delete_jobs.job_ids) AND j.finished_at IS NOT NULL
    RETURNING j.id
  ), deps AS (
    DELETE FROM idemq.job_dependencies AS dep USING gone g WHERE dep.parent_id = g.id
  ), links AS (
    -- A parent's children links and count go with it (the children stay).
    DELETE FROM idemq.job_children AS c USING gone g WHERE c.parent_id = g.id
  ), waits AS (
    DELETE FROM idemq.child_waits AS w USING gone g WHERE w.parent_id = g.id
  )
  SELECT count(*) INTO v_count FROM gone;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq._delete_jobs(bigint[]) IS
  'Delete locked finished jobs and their dependency rows (never their keys); returns how many.';
