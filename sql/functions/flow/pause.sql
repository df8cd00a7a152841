-- idemq.pause(queue text DEFAULT NULL, task text DEFAULT NULL) RETURNS boolean
--
-- Pauses one queue or one task: claim() hands out none of its jobs until
-- resume(). Jobs already processing run on and finish as usual; enqueue
-- keeps working (the jobs wait).
--
-- Guarantees:
--   * Every claim that starts after the commit skips the scope's jobs (a job
--     is held back when its queue or its task is paused); a claim already
--     running when it commits may still hand one out.
--   * Stored in idemq.limits: it survives sessions and restarts, and limits
--     set or cleared meanwhile keep it.
--   * true when it paused the scope, false when it was paused already.
-- Concurrency: an upsert of the scope's limits row; takes no lock a claim
--   waits for.
-- Errors: 22023 both or neither of queue and task, an empty or too long name.
-- Tests: test/sql/flow-control.test.ts
CREATE OR REPLACE FUNCTION idemq.pause(queue text DEFAULT NULL, task text DEFAULT NULL)
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
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('pause', pause.queue, pause.task) s;
  INSERT INTO idemq.limits AS l (kind, name, paused)
  VALUES (v_kind, v_name, true)
  ON CONFLICT ON CONSTRAINT limits_scope DO UPDATE SET paused = true, updated_at = now()
  WHERE NOT l.paused;
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.pause(text, text) IS
  'Pause one queue or task: claims hand out none of its jobs until resume(); running jobs finish, enqueue works. True when it was not paused.';
