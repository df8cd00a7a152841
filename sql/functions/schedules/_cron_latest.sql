-- idemq._cron_latest(spec jsonb, timezone text, lo timestamptz, hi timestamptz, n int) RETURNS timestamptz[]
--
-- The latest n slots of a parsed cron expression in [lo, hi], oldest first.
--
-- Guarantees:
--   * Exactly the slots s with lo <= s <= hi, the latest n of them, in order.
--   * Looks back from hi in windows that grow eightfold (1 minute, 8
--     minutes, ...) until it has n slots or reaches lo, so a long downtime
--     (lo far back) costs about as much as the slots it returns, not a walk
--     over every slot since lo.
-- Concurrency: none (stable).
-- Errors: none.
-- Tests: test/sql/schedules-tick.test.ts
CREATE OR REPLACE FUNCTION idemq._cron_latest(spec jsonb, timezone text, lo timestamptz, hi timestamptz, n int)
RETURNS timestamptz[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_width interval := interval '1 minute';
  v_from timestamptz;
  v_slot timestamptz;
  v_slots timestamptz[];
BEGIN
  IF _cron_latest.n < 1 OR _cron_latest.lo > _cron_latest.hi THEN
    RETURN '{}';
  END IF;
  LOOP
    v_from := greatest(_cron_latest.lo, _cron_latest.hi - v_width);
    v_slots := '{}';
    v_slot := idemq._cron_next(_cron_latest.spec, _cron_latest.timezone, v_from - interval '1 microsecond');
    WHILE v_slot IS NOT NULL AND v_slot <= _cron_latest.hi LOOP
      v_slots := v_slots || v_slot;
      IF cardinality(v_slots) > _cron_latest.n THEN
        v_slots := v_slots[2:];
      END IF;
      v_slot := idemq._cron_next(_cron_latest.spec, _cron_latest.timezone, v_slot);
    END LOOP;
    EXIT WHEN cardinality(v_slots) >= _cron_latest.n OR v_from = _cron_latest.lo;
    v_width := v_width * 8;
  END LOOP;
  RETURN v_slots;
END;
$$;

COMMENT ON FUNCTION idemq._cron_latest(jsonb, text, timestamptz, timestamptz, int) IS
  'The latest n slots of a parsed cron expression between two instants, oldest first.';
