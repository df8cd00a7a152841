-- idemq._repair_slots(batch_size int) RETURNS int
--
-- Corrects the counts of concurrency limits whose stripes
-- (idemq.limit_slots) disagree with the jobs processing: a job moved on, or
-- was deleted or claimed, by a write the jobs trigger did not see (triggers
-- disabled, session_replication_role = replica, a restore) or anything else
-- that left a count off. Called by apply_retention, so every worker's
-- maintenance timer repairs such a count within a run; without it a slot
-- stays held and the scope runs one short for good (or, counted short, one
-- over).
--
-- Guarantees:
--   * A limit agrees when, in one snapshot, each stripe's held less its
--     releases not yet folded equals the jobs processing that name it (a
--     job naming an older stripe or none counts in first_slot, as the jobs
--     trigger releases it). In every snapshot the trigger keeps them equal
--     (a claim's stripe write and its jobs commit together, as a release's
--     row and its job do), so a disagreement is drift, never a claim in
--     flight.
--   * Each disagreeing limit, at most batch_size of them: its stripes are
--     locked, its releases deleted and each held set to the jobs processing
--     that name the stripe, in one statement (one snapshot), then its slots
--     are laid out again (_size_slots: a draining limit stays drained).
--     Returns the slots freed (held before less after, over the limits
--     repaired; 0 when none disagreed).
--   * Release rows naming a stripe that is gone (appended while clear_limit
--     removed the limit) are deleted.
--   * Never frees the slot of a job processing: the count is taken after
--     the stripes are locked, so a claim that took a slot and committed is
--     seen with its job processing, and one not committed holds its
--     stripe's lock (and the limit is skipped).
--   * Cost: one read of the processing jobs (jobs_leases) per concurrency
--     limit and of the stripes and releases; nothing is written when every
--     limit agrees.
-- Concurrency: FOR UPDATE SKIP LOCKED on the stripes: a limit one of whose
--   stripes a claim, set_limit or clear_limit holds is left for the next
--   call; it waits for no one. Releases are appended meanwhile without
--   waiting (those committed after the count's snapshot are folded later).
-- Errors: none.
-- Tests: test/sql/flow-control-repair.test.ts
CREATE OR REPLACE FUNCTION idemq._repair_slots(batch_size int)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_off bigint[];
  v_id bigint;
  v_concurrency int;
  v_stripes int;
  v_locked int;
  v_before int;
  v_after int;
  v_freed int := 0;
BEGIN
  DELETE FROM idemq.limit_releases r
  WHERE NOT EXISTS (SELECT FROM idemq.limit_slots s WHERE s.limit_id = r.limit_id AND s.slot = r.slot);

  WITH lim AS (
    SELECT l.id FROM idemq.limits l WHERE l.concurrency IS NOT NULL
  ),
  running AS (
    SELECT lim.id, c.slot, c.n FROM lim CROSS JOIN LATERAL idemq._stripe_counts(lim.id) c
  ),
  kept AS (
    SELECT s.limit_id AS id, s.slot,
           s.held - coalesce((SELECT sum(r.n) FROM idemq.limit_releases r
                              WHERE r.limit_id = s.limit_id AND r.slot = s.slot), 0)::int AS n
    FROM idemq.limit_slots s JOIN lim ON lim.id = s.limit_id
  )
  SELECT array_agg(DISTINCT coalesce(k.id, r.id)) INTO v_off
  FROM kept k FULL JOIN running r ON r.id = k.id AND r.slot = k.slot
  WHERE coalesce(k.n, 0) <> coalesce(r.n, 0);
  IF v_off IS NULL THEN
    RETURN 0;
  END IF;

  FOREACH v_id IN ARRAY v_off[1:batch_size] LOOP
    SELECT count(*)::int INTO v_stripes FROM idemq.limit_slots s WHERE s.limit_id = v_id;
    SELECT count(*)::int INTO v_locked
    FROM (SELECT FROM idemq.limit_slots s WHERE s.limit_id = v_id ORDER BY s.slot FOR UPDATE SKIP LOCKED) x;
    CONTINUE WHEN v_locked < v_stripes;
    SELECT l.concurrency INTO v_concurrency FROM idemq.limits l WHERE l.id = v_id;
    CONTINUE WHEN v_concurrency IS NULL;
    SELECT (SELECT coalesce(sum(s.held), 0) FROM idemq.limit_slots s WHERE s.limit_id = v_id)
           - (SELECT coalesce(sum(r.n), 0) FROM idemq.limit_releases r WHERE r.limit_id = v_id)
    INTO v_before;
    -- One statement, one snapshot: the releases deleted are those of the
    -- jobs this count no longer sees processing (a data-modifying WITH runs
    -- whether or not it is read).
    WITH gone AS (
      DELETE FROM idemq.limit_releases r WHERE r.limit_id = v_id RETURNING r.n
    )
    UPDATE idemq.limit_slots AS s
    SET held = coalesce((SELECT c.n FROM idemq._stripe_counts(v_id) c WHERE c.slot = s.slot), 0)
    WHERE s.limit_id = v_id;
    PERFORM idemq._size_slots(v_id, v_concurrency);
    SELECT coalesce(sum(s.held), 0)::int INTO v_after FROM idemq.limit_slots s WHERE s.limit_id = v_id;
    v_freed := v_freed + greatest(v_before - v_after, 0);
  END LOOP;
  RETURN v_freed;
END;
$$;

COMMENT ON FUNCTION idemq._repair_slots(int) IS
  'Correct the slot counts of at most batch_size concurrency limits that disagree with the jobs processing (a write the jobs trigger missed); called by apply_retention.';
