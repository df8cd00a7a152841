-- idemq._release_slots(job_ids bigint[], attempts int[], limit_ids bigint[], slots int[]) RETURNS void
--
-- Frees the concurrency slots (idemq.limit_slots) held by these attempts,
-- which have left processing: called by the trigger function _count_jobs
-- for every statement that moves jobs out of processing or deletes them,
-- whoever makes it (complete, complete_many, fail, snooze, rescue, cancel,
-- retention, an older version's function during an upgrade, an owner's
-- SQL), and by _repair_slots. One entry per (attempt, concurrency limit of
-- its scope): job_ids[i], attempts[i], limit_ids[i], and slots[i], the slot
-- of that limit the job says it took (jobs.queue_slot or task_slot, written
-- by claim()), or NULL when it names none. job_ids NULL: every held slot
-- (TRUNCATE of idemq.jobs).
--
-- Guarantees:
--   * Each slot of limit_ids[i] held by (job_ids[i], attempts[i]) is free
--     (job_id NULL) when this returns, in the caller's transaction; or
--     deleted, when its scope has more slot rows than its concurrency (a
--     lowered limit draining): then slot_rows is decremented, never below
--     concurrency. A slot is freed only if its row names that attempt, as
--     its newest version says once locked: slots[i] is where to look, not
--     proof. When slots[i] is NULL or its row names another holder (a job
--     processing when set_limit gave its scope slots, or a limit cleared
--     and set again), the limit's slots are searched for the attempt.
--   * Cost: a primary-key probe per entry to find and lock its slot, and a
--     fetch by TID to free it; a search reads the limit's slot rows. The slot
--     rows are in no index but their primary key, so freeing one is a HOT
--     update (bench/FINDINGS.md, "Flow control: what a limited claim
--     costs").
--   * Claims see the slot free only once this transaction commits.
-- Concurrency: locks the slots in (limit_id, slot) order before freeing
--   them, the order set_limit and clear_limit lock a scope's slots in, so
--   they wait for each other without a deadlock; then, only for a scope
--   whose slot_rows is over its concurrency, its limits row (a conditional
--   UPDATE re-checked on the row's newest version: two releases never take
--   slot_rows below the limit). Claims never wait here (SKIP LOCKED). One
--   exception to the order: when a slot a job names is not its attempt's
--   (its scope's limit was cleared and set again while it ran), the search
--   locks after the named slots already locked, and a set_limit or
--   clear_limit of that scope at that moment can deadlock with it
--   (PostgreSQL then cancels one of the two).
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts, test/sql/flow-control-concurrency.test.ts,
--   test/sql/flow-control-repair.test.ts
CREATE OR REPLACE FUNCTION idemq._release_slots(job_ids bigint[], attempts int[], limit_ids bigint[], slots int[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_lids bigint[];
  v_nos int[];
  v_tids tid[];
  v_found int;
  v_limits bigint[];
  v_slots int[];
BEGIN
  IF job_ids IS NULL THEN
    SELECT array_agg(s.ctid ORDER BY s.limit_id, s.slot) INTO v_tids
    FROM (SELECT s.ctid, s.limit_id, s.slot FROM idemq.limit_slots s
          WHERE s.job_id IS NOT NULL
          ORDER BY s.limit_id, s.slot
          FOR UPDATE) s;
  ELSIF array_position(slots, NULL) IS NULL THEN
    -- Every entry names its slot (the common case): lock the slots that
    -- still name their attempt, in order, judged on their newest versions.
    SELECT array_agg(l.ctid), count(*) INTO v_tids, v_found
    FROM (SELECT s.ctid FROM idemq.limit_slots s
          JOIN unnest(job_ids, attempts, limit_ids, slots) AS g(id, attempt, lid, slot)
            ON s.limit_id = g.lid AND s.slot = g.slot
          WHERE s.job_id = g.id AND s.attempt = g.attempt
          ORDER BY s.limit_id, s.slot
          FOR UPDATE OF s) l;
  END IF;
  IF job_ids IS NOT NULL AND coalesce(v_found, 0) < cardinality(job_ids) THEN
    -- Some entry names no slot, or one that is not its attempt's: find the
    -- attempts' slots by a search of their limits' slot rows (plain reads),
    -- then lock them all in order (out of order after the locks above: the
    -- header's Concurrency says when that can happen).
    WITH g AS MATERIALIZED (
      SELECT g.id, g.attempt, g.lid, s.slot
      FROM unnest(job_ids, attempts, limit_ids, slots) AS g(id, attempt, lid, slot)
      LEFT JOIN idemq.limit_slots s
        ON s.limit_id = g.lid AND s.slot = g.slot AND s.job_id = g.id AND s.attempt = g.attempt
    ),
    found AS (
      SELECT g.lid, g.slot FROM g WHERE g.slot IS NOT NULL
      UNION ALL
      SELECT s.limit_id, s.slot
      FROM g JOIN idemq.limit_slots s ON s.limit_id = g.lid AND s.job_id = g.id AND s.attempt = g.attempt
      WHERE g.slot IS NULL
    )
    SELECT array_agg(f.lid), array_agg(f.slot) INTO v_lids, v_nos FROM found f;
    IF v_lids IS NOT NULL THEN
      SELECT array_agg(l.ctid) INTO v_tids
      FROM (SELECT s.ctid FROM idemq.limit_slots s
            JOIN unnest(v_lids, v_nos) AS k(lid, slot) ON s.limit_id = k.lid AND s.slot = k.slot
            JOIN unnest(job_ids, attempts, limit_ids) AS g(id, attempt, lid)
              ON g.lid = s.limit_id AND g.id = s.job_id AND g.attempt = s.attempt
            ORDER BY s.limit_id, s.slot
            FOR UPDATE OF s) l;
    END IF;
  END IF;
  IF v_tids IS NULL THEN
    RETURN;
  END IF;
  -- Freed by the TIDs locked: those rows' newest versions, which no one
  -- else can change while this transaction holds their locks.
  WITH freed AS (
    UPDATE idemq.limit_slots AS s SET job_id = NULL, attempt = NULL
    WHERE s.ctid = ANY (v_tids)
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

COMMENT ON FUNCTION idemq._release_slots(bigint[], int[], bigint[], int[]) IS
  'Free the concurrency slots held by attempts that left processing (deleting them while a lowered limit drains); called by _count_jobs.';
