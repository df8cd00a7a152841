-- idemq.clear_limit(queue text DEFAULT NULL, task text DEFAULT NULL) RETURNS boolean
--
-- Removes every limit (concurrency, rate, per_key) of one queue or one task;
-- a pause or a hold stays (resume() ends them).
--
-- Guarantees: true when the scope had a limit, false when it had none (then
--   nothing changes). Its stripes, releases and start rows go with it: the
--   jobs of the scope still running finish without a slot (a release
--   appended for a stripe gone is deleted by the next set_limit of the
--   scope or by _repair_slots), and claims take its jobs without a limit
--   from the commit on.
-- Concurrency: locks the scope's stripes and start rows, then its limits row,
--   as set_limit does; claims skip the locked rows meanwhile.
-- Errors: 22023 both or neither of queue and task, an empty or too long name.
-- Tests: test/sql/flow-control.test.ts
CREATE OR REPLACE FUNCTION idemq.clear_limit(queue text DEFAULT NULL, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
  v_id bigint;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('clear_limit', clear_limit.queue, clear_limit.task) s;
  SELECT l.id INTO v_id FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name;
  IF v_id IS NULL THEN
    RETURN false;
  END IF;
  PERFORM FROM idemq.limit_slots s WHERE s.limit_id = v_id ORDER BY s.slot FOR UPDATE;
  PERFORM FROM idemq.limit_starts r WHERE r.limit_id = v_id ORDER BY r.n FOR UPDATE;
  PERFORM FROM idemq.limits l WHERE l.id = v_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  DELETE FROM idemq.limit_slots s WHERE s.limit_id = v_id;
  DELETE FROM idemq.limit_releases r WHERE r.limit_id = v_id;
  DELETE FROM idemq.limit_starts r WHERE r.limit_id = v_id;
  DELETE FROM idemq.limits l WHERE l.id = v_id AND NOT l.paused AND NOT coalesce(l.held_until > now(), false);
  IF FOUND THEN
    RETURN true;
  END IF;
  UPDATE idemq.limits l
  SET concurrency = NULL, rate = NULL, per = NULL, per_key = NULL, slot_rows = 0, first_slot = NULL, updated_at = now()
  WHERE l.id = v_id AND (l.concurrency IS NOT NULL OR l.rate IS NOT NULL OR l.per_key IS NOT NULL);
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.clear_limit(text, text) IS
  'Remove the limits (concurrency, rate, per_key) of one queue or task; a pause or a hold stays. True when there was one.';
