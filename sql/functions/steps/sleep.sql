-- idemq.sleep(job_id bigint, attempt int, name text, wake_at timestamptz,
--             lease_token uuid DEFAULT NULL)
--   RETURNS TABLE(parked boolean, run_at timestamptz)
--
-- A durable sleep of a held job: records the sleep `name` with its wake
-- time the first time, and ends the attempt (the job is parked, its attempt
-- not spent) until that time; once it has come, the sleep is over.
--
-- Guarantees:
--   * The first call for a name records wake_at; every later call (a replay
--     in a later attempt) keeps the recorded time, whatever wake_at it
--     passes, so a replay never pushes a sleep further.
--   * parked true: the recorded time is in the future. The job is back in
--     `scheduled` with run_at = that time, exactly as snooze() leaves it:
--     no attempt spent (uncounted), no error, backoff untouched, no worker
--     slot held. The caller's attempt is over: it must not complete or fail
--     the job (those raise IQ410 now).
--   * parked false: the time has come (on the database clock); the job is
--     still held; go on. run_at is the recorded wake time either way.
--   * Fenced like complete(), by (job_id, attempt, lease_token).
-- Concurrency: locks the job row (_lock_held), as snooze().
-- Errors: 22004 NULL job_id/attempt/name/wake_at; 22023 empty name or over
--   key_bytes, wake_at infinite, the name recorded as another kind of step;
--   IQ404; IQ410 not held.
-- Tests: test/sql/steps.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts,
--   test/worker/steps.test.ts, test/worker/steps-faults.test.ts, test/worker/steps-restart.test.ts,
--   test/worker/workflow-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.sleep(job_id bigint, attempt int, name text, wake_at timestamptz,
                                       lease_token uuid DEFAULT NULL)
RETURNS TABLE(parked boolean, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_step record;
BEGIN
  PERFORM idemq._check_step('sleep', sleep.job_id, sleep.name, NULL);
  IF sleep.wake_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('sleep: job %s, step "%s": wake_at must not be NULL', sleep.job_id, idemq._excerpt(sleep.name)),
      HINT = 'Pass when the sleep ends, e.g. now() + interval ''1 hour''.';
  END IF;
  PERFORM idemq._check_instant('sleep', 'wake_at', sleep.wake_at);
  PERFORM idemq._lock_held('sleep', sleep.job_id, sleep.attempt, sleep.lease_token);

  INSERT INTO idemq.job_steps AS s (job_id, name, kind, status, attempt, wake_at)
  VALUES (sleep.job_id, sleep.name, 'sleep', 'sleeping', sleep.attempt, sleep.wake_at)
  ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING;
  SELECT s.kind, s.wake_at INTO v_step FROM idemq.job_steps s
  WHERE s.job_id = sleep.job_id AND s.name = sleep.name;
  IF v_step.kind <> 'sleep' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('sleep: job %s recorded step "%s" as a %s, not a sleep', sleep.job_id,
                       idemq._excerpt(sleep.name), v_step.kind),
      HINT = 'The handler no longer takes its steps in the order its recorded ones were taken: name the sleep, '
             'or keep the old handler for jobs already running (docs/worker.md, "Changing a workflow").';
  END IF;
  run_at := v_step.wake_at;
  parked := v_step.wake_at > now();
  IF parked THEN
    PERFORM idemq.snooze(sleep.job_id, sleep.attempt, v_step.wake_at, sleep.lease_token);
  END IF;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.sleep(bigint, int, text, timestamptz, uuid) IS
  'Durable sleep of a held job: record the wake time once, park the job until then without spending an attempt, or say it is over.';
