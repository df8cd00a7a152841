-- idemq.steps(job_id bigint)
--   RETURNS TABLE(name text, kind text, status text, result jsonb, attempt int,
--                 recorded_at timestamptz, wake_at timestamptz, event text,
--                 event_key text, over boolean)
--
-- A job's step ledger, oldest first: what a replaying attempt reads before
-- it runs, and what a job's timeline shows.
--
-- Guarantees:
--   * One row per recorded step name: kind `step` (status `done`, its
--     result), `sleep` (status `sleeping`, until wake_at), or `wait` (status
--     `waiting` until wake_at, its timeout; `received` with the event's
--     payload as result; or `timed_out`), with the attempt that recorded it.
--   * over: the step needs nothing more (a done step, a received or
--     timed-out wait, a sleep whose wake_at has passed on the database
--     clock); a replay runs past it without a call.
--   * No rows for a job without steps or a job that does not exist.
-- Concurrency: a plain read: rows committed before the statement started.
-- Errors: 22004 NULL job_id.
-- Tests: test/sql/steps.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts,
--   test/worker/workflow-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.steps(job_id bigint)
RETURNS TABLE(name text, kind text, status text, result jsonb, attempt int, recorded_at timestamptz,
              wake_at timestamptz, event text, event_key text, over boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF steps.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'steps: job_id must not be NULL',
      HINT = 'Pass the id of the job whose steps to read.';
  END IF;
  RETURN QUERY
  SELECT s.name, s.kind, s.status, s.result, s.attempt, s.recorded_at, s.wake_at, s.event, s.event_key,
         s.status IN ('done', 'received', 'timed_out') OR (s.status = 'sleeping' AND s.wake_at <= now())
  FROM idemq.job_steps s
  WHERE s.job_id = steps.job_id
  ORDER BY s.recorded_at, s.name;
END;
$$;

COMMENT ON FUNCTION idemq.steps(bigint) IS
  'A job''s step ledger (steps, sleeps, event waits) with results, oldest first; over: a replay passes it without a call.';
