-- idemq._repair_slots(batch_size int) RETURNS int
--
-- Frees concurrency slots (idemq.limit_slots) whose holder is not processing
-- at the attempt the slot names: the job moved on, or was deleted, by a write
-- the jobs trigger did not see (triggers disabled, session_replication_role =
-- replica, a restore) or anything else that left a slot held. Called by
-- apply_retention, so every worker's maintenance timer repairs such a slot
-- within a run; without it the slot stays held and the scope runs one short
-- for good.
--
-- Guarantees:
--   * Frees at most batch_size slots; returns how many it freed (deleted
--     instead, while a lowered limit drains, by _release_slots).
--   * Never frees a slot whose (job_id, attempt) is processing: the holders
--     are judged by a statement that starts after the slots are locked, so
--     a claim that wrote a slot and committed before the lock is seen with
--     its job processing, and one not committed holds the slot's lock (and
--     is skipped). A lease that ran out is rescue's, not this function's.
--   * Cost: one read of the slot rows (no index holds the holder, so that
--     claims and releases are HOT updates: _release_slots), a primary-key
--     probe of idemq.jobs per held slot, stopping at batch_size orphans;
--     nothing is written when none is orphaned.
-- Concurrency: FOR UPDATE SKIP LOCKED on the slots: a slot being taken by a
--   claim, released by a completion or reshaped by set_limit is left for the
--   next call; it waits for no one, and a release of the same slot waits for
--   it (and then finds the slot free).
-- Errors: none.
-- Tests: test/sql/flow-control-repair.test.ts
CREATE OR REPLACE FUNCTION idemq._repair_slots(batch_size int)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_lids bigint[];
  v_slots int[];
  v_ids bigint[];
  v_attempts int[];
  v_freed int;
BEGIN
  -- Candidates, locked: the holder as this statement's snapshot sees it.
  -- FOR UPDATE returns each slot's newest version, which no one can change
  -- while this transaction holds its lock.
  SELECT array_agg(c.limit_id), array_agg(c.slot), array_agg(c.job_id), array_agg(c.attempt)
  INTO v_lids, v_slots, v_ids, v_attempts
  FROM (
    SELECT s.limit_id, s.slot, s.job_id, s.attempt
    FROM idemq.limit_slots s
    WHERE s.job_id IS NOT NULL
      AND NOT EXISTS (SELECT FROM idemq.jobs j
                      WHERE j.id = s.job_id AND j.state = 'processing' AND j.attempt = s.attempt)
    ORDER BY s.limit_id, s.slot
    LIMIT batch_size
    FOR UPDATE OF s SKIP LOCKED
  ) c;
  IF v_ids IS NULL THEN
    RETURN 0;
  END IF;
  -- Judged again by a new statement (a new snapshot in READ COMMITTED): a
  -- locked slot changed after the first snapshot was re-checked there on its
  -- own columns only, against jobs as that older snapshot saw them.
  SELECT array_agg(c.job_id), array_agg(c.attempt), array_agg(c.limit_id), array_agg(c.slot)
  INTO v_ids, v_attempts, v_lids, v_slots
  FROM unnest(v_lids, v_slots, v_ids, v_attempts) AS c(limit_id, slot, job_id, attempt)
  WHERE NOT EXISTS (SELECT FROM idemq.jobs j
                    WHERE j.id = c.job_id AND j.state = 'processing' AND j.attempt = c.attempt);
  v_freed := coalesce(cardinality(v_ids), 0);
  IF v_freed > 0 THEN
    PERFORM idemq._release_slots(v_ids, v_attempts, v_lids, v_slots);
  END IF;
  RETURN v_freed;
END;
$$;

COMMENT ON FUNCTION idemq._repair_slots(int) IS
  'Free at most batch_size concurrency slots whose holder is not processing at that attempt (a write the jobs trigger missed); called by apply_retention.';
