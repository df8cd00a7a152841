-- idemq._size_slots(limit_id bigint, concurrency int) RETURNS void
--
-- Lays out the slots of a concurrency limit over its stripes
-- (idemq.limit_slots) for concurrency, from what its stripes hold now:
-- called by set_limit (a new, raised or lowered limit), by the jobs trigger
-- on TRUNCATE and by _repair_slots. The caller holds every stripe of the
-- limit locked (or the table locks that keep claims out).
--
-- Guarantees:
--   * The limit has least(concurrency, 8) stripes at least (new ones get
--     numbers from idemq.limit_slot_numbers; none is deleted while the
--     limit lasts: a stripe left with size 0 is passed over by claims).
--   * Every release of the limit committed so far is folded (its
--     limit_releases row deleted, its stripe's held less its n).
--   * With H slots held in all: when H < concurrency, each stripe's size is
--     its held plus an even share of the concurrency - H free slots, and
--     limits.slot_rows is concurrency; otherwise each size is its held (no
--     room anywhere) and slot_rows is H, over concurrency by what must
--     finish before a job starts (_lock_slots gives those slots up as their
--     releases are folded). So no claim ever finds room while concurrency or
--     more run.
-- Concurrency: writes the stripes and the limits row; see the callers.
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts, test/sql/flow-control-repair.test.ts
CREATE OR REPLACE FUNCTION idemq._size_slots(limit_id bigint, concurrency int)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_stripes int;
  v_held int;
BEGIN
  WITH gone AS (
    DELETE FROM idemq.limit_releases r WHERE r.limit_id = _size_slots.limit_id RETURNING r.slot, r.n
  ),
  per_slot AS (
    SELECT g.slot, sum(g.n)::int AS n FROM gone g GROUP BY g.slot
  )
  UPDATE idemq.limit_slots AS s SET held = greatest(s.held - p.n, 0)
  FROM per_slot p
  WHERE s.limit_id = _size_slots.limit_id AND s.slot = p.slot;

  SELECT count(*)::int INTO v_stripes FROM idemq.limit_slots s WHERE s.limit_id = _size_slots.limit_id;
  IF v_stripes < least(_size_slots.concurrency, 8) THEN
    INSERT INTO idemq.limit_slots (limit_id, slot, size)
    SELECT _size_slots.limit_id, nextval('idemq.limit_slot_numbers'), 0
    FROM generate_series(v_stripes + 1, least(_size_slots.concurrency, 8));
    v_stripes := least(_size_slots.concurrency, 8);
  END IF;

  SELECT coalesce(sum(s.held), 0)::int INTO v_held FROM idemq.limit_slots s WHERE s.limit_id = _size_slots.limit_id;
  -- The k-th stripe (in slot order) gets (free / stripes) more slots than it
  -- holds, and one more while k <= free % stripes.
  UPDATE idemq.limit_slots AS s
  SET size = s.held + CASE WHEN v_held >= _size_slots.concurrency THEN 0
                           ELSE (_size_slots.concurrency - v_held) / v_stripes
                                + CASE WHEN o.k <= (_size_slots.concurrency - v_held) % v_stripes THEN 1 ELSE 0 END END
  FROM (SELECT f.slot, row_number() OVER (ORDER BY f.slot) AS k
        FROM idemq.limit_slots f WHERE f.limit_id = _size_slots.limit_id) o
  WHERE s.limit_id = _size_slots.limit_id AND s.slot = o.slot;
  UPDATE idemq.limits AS l SET slot_rows = greatest(v_held, _size_slots.concurrency)
  WHERE l.id = _size_slots.limit_id;
END;
$$;

COMMENT ON FUNCTION idemq._size_slots(bigint, int) IS
  'Fold a concurrency limit''s releases and size its stripes for concurrency: room only while fewer than concurrency are held.';
