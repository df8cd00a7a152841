-- idemq._lock_parents(jobs idemq._planned_job[]) RETURNS void
--
-- The parents named in `after` by a plan's elements: locks them, checks that
-- they exist, and marks them as having children.
--
-- Guarantees: every parent exists, or IQ404 names one that does not (nothing
--   written, as the caller's statement fails). After it, each parent's state
--   cannot change until the caller's transaction ends, so _insert_jobs reads
--   the state a child starts from, and a parent finishing later sees
--   has_children and releases (or cancels) the child. Each parent is looked
--   up by primary key: linear in the number of parents named.
-- Concurrency: parents are row-locked FOR NO KEY UPDATE, in id order (fewer
--   deadlocks between overlapping calls); a parent being finished
--   concurrently makes this wait for that transaction.
-- Errors: IQ404 a parent job that does not exist.
-- Tests: test/sql/continuations.test.ts, test/sql/enqueue-many.test.ts
CREATE OR REPLACE FUNCTION idemq._lock_parents(jobs idemq._planned_job[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_parents bigint[];
  v_missing bigint;
BEGIN
  v_parents := ARRAY(SELECT DISTINCT a FROM unnest(jobs) p, unnest(p.after) a ORDER BY a);
  IF cardinality(v_parents) = 0 THEN
    RETURN;
  END IF;
  PERFORM 1 FROM idemq.jobs j WHERE j.id = ANY (v_parents) ORDER BY j.id FOR NO KEY UPDATE;
  SELECT a INTO v_missing
  FROM unnest(v_parents) a
  WHERE NOT EXISTS (SELECT 1 FROM idemq.jobs j WHERE j.id = a)
  LIMIT 1;
  IF v_missing IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('parent job %s (named in after) does not exist', v_missing),
      HINT = 'Name existing job ids in after; nothing was enqueued.';
  END IF;
  UPDATE idemq.jobs AS j SET has_children = true WHERE j.id = ANY (v_parents) AND NOT j.has_children;
END;
$$;

COMMENT ON FUNCTION idemq._lock_parents(idemq._planned_job[]) IS
  'Lock the parents named in after (in id order), raise IQ404 for a missing one, and mark them as having children.';
