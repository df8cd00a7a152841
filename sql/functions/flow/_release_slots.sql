-- idemq._release_slots(job_ids bigint[], attempts int[]) RETURNS void
--
-- Frees the concurrency slots (idemq.limit_slots) held by these attempts,
-- which have left processing: called by the trigger function _count_jobs
-- for every statement that moves jobs out of processing or deletes them,
-- whoever makes it (complete, complete_many, fail, snooze, rescue, cancel,
-- retention, an older version's function during an upgrade, an owner's
-- SQL). job_ids NULL: every held slot (TRUNCATE of idemq.jobs).
--
-- Guarantees:
--   * Each slot held by (job_id, attempt) of the arguments is free (job_id
--     NULL) when this returns, in the caller's transaction; or deleted, when
--     its scope has more slot rows than its concurrency (a lowered limit
--     draining): then slot_rows is decremented, never below concurrency.
--   * Claims see the slot free only once this transaction commits.
-- Concurrency: locks the slots in (limit_id, slot) order before freeing them,
--   the order set_limit and clear_limit lock a scope's slots in, so they
--   wait for each other without a deadlock; then, only for a scope whose
--   slot_rows is over its concurrency, its limits row (a conditional UPDATE
--   re-checked on the row's newest version: two releases never take slot_rows
--   below the limit). Claims never wait here (SKIP LOCKED).
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts, test/sql/flow-control-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._release_slots(job_ids bigint[], attempts int[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_limits bigint[];
  v_slots int[];
BEGIN
  PERFORM FROM idemq.limit_slots s
  WHERE s.job_id IS NOT NULL
    AND (job_ids IS NULL OR (s.job_id, s.attempt) IN (SELECT g.id, g.attempt FROM unnest(job_ids, attempts) AS g(id, attempt)))
  ORDER BY s.limit_id, s.slot
  FOR UPDATE;
  WITH freed AS (
    UPDATE idemq.limit_slots AS s SET job_id = NULL, attempt = NULL
    WHERE s.job_id IS NOT NULL
      AND (job_ids IS NULL OR (s.job_id, s.attempt) IN (SELECT g.id, g.attempt FROM unnest(job_ids, attempts) AS g(id, attempt)))
    RETURNING s.limit_id, s.slot
  )
  SELECT array_agg(f.limit_id ORDER BY f.limit_id, f.slot), array_agg(f.slot ORDER BY f.limit_id, f.slot)
  INTO v_limits, v_slots
  FROM freed f;
  IF v_limits IS NULL THEN
    RETURN;
  END IF;
  -- Read after the slots are locked (a set_limit that lowered the limit has
  -- committed, or waits for this transaction): a draining scope deletes the
  -- slots its jobs free, one at a time, down to its concurrency.
  IF EXISTS (SELECT FROM idemq.limits l WHERE l.id = ANY (v_limits) AND l.slot_rows > l.concurrency) THEN
    FOR i IN 1 .. cardinality(v_limits) LOOP
      UPDATE idemq.limits AS l SET slot_rows = l.slot_rows - 1
      WHERE l.id = v_limits[i] AND l.slot_rows > l.concurrency;
      IF FOUND THEN
        DELETE FROM idemq.limit_slots AS s WHERE s.limit_id = v_limits[i] AND s.slot = v_slots[i];
      END IF;
    END LOOP;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._release_slots(bigint[], int[]) IS
  'Free the concurrency slots held by attempts that left processing (deleting them while a lowered limit drains); called by _count_jobs.';
