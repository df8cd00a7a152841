-- idemq._lock_slots(limit_id bigint, need int,
--   OUT slots int[], OUT rooms int[], OUT folded int[], OUT shrunk int[])
--
-- A claim's share of one concurrency limit: locks stripes of the limit
-- (idemq.limit_slots) with room, in stripe order, until they hold need free
-- slots or none is left, and says what the caller must write on each.
-- Writes nothing to the stripes itself: the caller (_claim_take) writes
-- each locked stripe once, with the jobs it took there.
--
-- Guarantees:
--   * slots: the stripes locked, in order; rooms[i]: how many of need the
--     caller may take from slots[i] (the sum is at most need); folded[i]:
--     the releases of slots[i] folded here (their limit_releases rows are
--     deleted; the caller subtracts them from held); shrunk[i]: how many
--     slots slots[i] gives up to a lowered limit draining (the caller
--     subtracts them from size; limits.slot_rows is already lowered).
--   * Room is exact: a stripe is locked FOR UPDATE SKIP LOCKED, so its row
--     is its newest version and no other claim changes it before this
--     transaction ends; the releases folded are those committed before the
--     fold (a new statement), each folded once (deleted by the one
--     transaction holding the stripe). A release not yet committed is still
--     held. So the jobs taken never make a stripe's held exceed its size,
--     and the sizes never sum over the limit while a claim finds room
--     (_size_slots, set_limit): never more than concurrency run.
--   * Draining (slot_rows > concurrency, after set_limit lowered the limit
--     below what ran): each release folded gives up its slot instead of
--     freeing it (size and slot_rows one less, under the limits row's
--     lock) until slot_rows is the limit; only then is there room.
--   * Cost: one locked probe per stripe visited (at most 8) and one
--     delete-probe of limit_releases per stripe locked; the limits row is
--     read only when releases were folded, and written only while draining.
-- Concurrency: SKIP LOCKED on the stripes: a claim never waits for another
--   claim; a stripe locked by another claim (or by set_limit, clear_limit,
--   repair) is passed over. Locks the limits row after a stripe while
--   draining (set_limit and clear_limit lock stripes first too).
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts, test/sql/flow-control-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._lock_slots(limit_id bigint, need int,
                                             OUT slots int[], OUT rooms int[], OUT folded int[], OUT shrunk int[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_last int := -2147483648;
  v_slot int;
  v_size int;
  v_held int;
  v_fold int;
  v_shrink int;
  v_debt int;
  v_room int;
  v_got int := 0;
BEGIN
  slots := '{}';
  rooms := '{}';
  folded := '{}';
  shrunk := '{}';
  WHILE v_got < need LOOP
    -- One stripe at a time (LIMIT 1), so a claim locks only the stripes it
    -- needs. A full stripe with releases waiting is locked too: its room
    -- shows once they are folded.
    SELECT s.slot, s.size, s.held INTO v_slot, v_size, v_held
    FROM idemq.limit_slots s
    WHERE s.limit_id = _lock_slots.limit_id AND s.slot > v_last
      AND (s.held < s.size
           OR EXISTS (SELECT FROM idemq.limit_releases r WHERE r.limit_id = s.limit_id AND r.slot = s.slot))
    ORDER BY s.slot
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED;
    EXIT WHEN NOT FOUND;
    v_last := v_slot;
    WITH gone AS (
      DELETE FROM idemq.limit_releases r
      WHERE r.limit_id = _lock_slots.limit_id AND r.slot = v_slot
      RETURNING r.n
    )
    SELECT coalesce(sum(g.n), 0)::int INTO v_fold FROM gone g;
    -- Never below zero: a count the trigger did not keep (a write with
    -- triggers off) is _repair_slots' to correct, not a claim's to fail on.
    v_fold := least(v_fold, v_held);
    v_shrink := 0;
    IF v_fold > 0 THEN
      SELECT l.slot_rows - l.concurrency INTO v_debt
      FROM idemq.limits l
      WHERE l.id = _lock_slots.limit_id AND l.slot_rows > l.concurrency
      FOR UPDATE;
      IF FOUND THEN
        v_shrink := least(v_debt, v_fold, v_size);
        UPDATE idemq.limits AS l SET slot_rows = l.slot_rows - v_shrink WHERE l.id = _lock_slots.limit_id;
      END IF;
    END IF;
    v_room := least(greatest(v_size - v_shrink - (v_held - v_fold), 0), need - v_got);
    slots := slots || v_slot;
    rooms := rooms || v_room;
    folded := folded || v_fold;
    shrunk := shrunk || v_shrink;
    v_got := v_got + v_room;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._lock_slots(bigint, int) IS
  'claim() under a concurrency limit: lock the stripes holding up to need free slots (SKIP LOCKED), folding their releases; the caller writes them.';
