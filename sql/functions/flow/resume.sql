-- idemq.resume(queue text DEFAULT NULL, task text DEFAULT NULL) RETURNS boolean
--
-- Ends the pause of one queue or one task (pause()), and a hold of it
-- (hold(): a 429's Retry-After) still to come: claims that start after the
-- commit hand out its jobs again, within its limits.
--
-- Guarantees: true when the scope was paused or held, false otherwise
--   (nothing changes). The scope's limits stay; a row left without limit,
--   pause or hold is deleted. The jobs hold() snoozed keep their run_at.
-- Concurrency: an update (or delete) of the scope's limits row.
-- Errors: 22023 both or neither of queue and task, an empty or too long name.
-- Tests: test/sql/flow-control.test.ts
CREATE OR REPLACE FUNCTION idemq.resume(queue text DEFAULT NULL, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('resume', resume.queue, resume.task) s;
  DELETE FROM idemq.limits l
  WHERE l.kind = v_kind AND l.name = v_name AND (l.paused OR l.held_until > now())
    AND l.concurrency IS NULL AND l.rate IS NULL AND l.per_key IS NULL;
  IF FOUND THEN
    RETURN true;
  END IF;
  UPDATE idemq.limits l SET paused = false, held_until = NULL, updated_at = now()
  WHERE l.kind = v_kind AND l.name = v_name AND (l.paused OR l.held_until > now());
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.resume(text, text) IS
  'End the pause (and a hold) of one queue or task: claims hand out its jobs again, within its limits. True when it was paused.';
