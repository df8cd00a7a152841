-- idemq.await_event(job_id bigint, attempt int, name text, event text, key text,
--                   timeout interval, lease_token uuid DEFAULT NULL)
--   RETURNS TABLE(status text, payload jsonb)
--
-- The wait `name` of a held job for the event (event, key): answers with the
-- event's payload when it has been emitted, else parks the job until it is
-- or until the timeout, without holding a worker.
--
-- Guarantees:
--   * The first call for a name records the wait (event, key, and its
--     deadline: now() + timeout); later calls (replays) keep them.
--   * Matching (docs/design.md, "Durable steps"): the wait takes the first
--     event, by emit order, with the same event name and key (NULL matches
--     only NULL) emitted no earlier than the job was created (created_at,
--     its enqueue's transaction time), still kept (event_retention_seconds),
--     and after every event an earlier wait of the job on the same (event,
--     key) took; or, when none is stored yet, the first such emit() to come.
--   * status `received`: payload is the event's; recorded, so every replay
--     gets the same payload. The job is still held; go on.
--   * status `timed_out`: the deadline passed with no event; recorded (a
--     later event does not undo it). The job is still held.
--   * status `waiting`: the job is parked, as snooze() parks it (no attempt
--     spent), with run_at its deadline; emit() of a matching event records
--     the payload and makes it runnable at once. The caller's attempt is
--     over: it must not complete or fail the job.
--   * Fenced like complete(), by (job_id, attempt, lease_token).
-- Concurrency: _event_lock(event, key) first, then the job row
--   (_lock_held), so an emit() and a wait on one pair never miss each other
--   (at READ COMMITTED: an emitter at REPEATABLE READ or SERIALIZABLE may not
--   see a wait that parked after its snapshot; that wait finds the event at
--   its deadline instead).
-- Errors: 22004 NULL job_id/attempt/name/event/timeout; 22023 empty name,
--   event or key, any over key_bytes, timeout <= 0 or over duration_days,
--   the name recorded as another kind of step or a wait on another event;
--   IQ404; IQ410 not held.
-- Tests: test/sql/steps.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts,
--   test/worker/steps.test.ts, test/worker/steps-faults.test.ts, test/worker/steps-restart.test.ts,
--   test/worker/workflow-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.await_event(job_id bigint, attempt int, name text, event text, key text,
                                             timeout interval, lease_token uuid DEFAULT NULL)
RETURNS TABLE(status text, payload jsonb)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job record;
  v_step record;
  v_event record;
BEGIN
  PERFORM idemq._check_step('await_event', await_event.job_id, await_event.name, NULL);
  PERFORM idemq._check_event('await_event', await_event.event, await_event.key);
  IF await_event.timeout IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('await_event: job %s, step "%s": timeout must not be NULL', await_event.job_id,
                       idemq._excerpt(await_event.name)),
      HINT = 'Pass how long to wait for the event at most, e.g. interval ''3 days''.';
  END IF;
  IF await_event.timeout <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('await_event: job %s, step "%s": timeout must be positive, not %s', await_event.job_id,
                       idemq._excerpt(await_event.name), await_event.timeout),
      HINT = 'Pass how long to wait for the event at most, e.g. interval ''3 days''.';
  END IF;
  PERFORM idemq._check_duration('await_event', 'timeout', await_event.timeout);
  -- The event's lock before the job's, in emit()'s order: no deadlock.
  PERFORM idemq._event_lock(await_event.event, await_event.key);
  SELECT * INTO v_job FROM idemq._lock_held('await_event', await_event.job_id, await_event.attempt,
                                            await_event.lease_token);

  INSERT INTO idemq.job_steps AS s (job_id, name, kind, status, attempt, wake_at, event, event_key)
  VALUES (await_event.job_id, await_event.name, 'wait', 'waiting', await_event.attempt,
          now() + await_event.timeout, await_event.event, await_event.key)
  ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING;
  SELECT s.kind, s.status, s.result, s.wake_at, s.event, s.event_key INTO v_step FROM idemq.job_steps s
  WHERE s.job_id = await_event.job_id AND s.name = await_event.name
  FOR UPDATE;
  IF v_step.kind <> 'wait' OR v_step.event <> await_event.event
     OR v_step.event_key IS DISTINCT FROM await_event.key THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('await_event: job %s recorded step "%s" as %s, not a wait for (%s, %s)', await_event.job_id,
                       idemq._excerpt(await_event.name),
                       CASE WHEN v_step.kind = 'wait'
                            THEN format('a wait for (%s, %s)', idemq._excerpt(v_step.event), idemq._excerpt(v_step.event_key))
                            ELSE 'a ' || v_step.kind END,
                       idemq._excerpt(await_event.event), idemq._excerpt(await_event.key)),
      HINT = 'The handler no longer takes its steps in the order its recorded ones were taken: name the wait, '
             'or keep the old handler for jobs already running (docs/worker.md, "Changing a workflow").';
  END IF;
  IF v_step.status = 'received' OR v_step.status = 'timed_out' THEN
    status := v_step.status;
    payload := v_step.result;
    RETURN NEXT;
    RETURN;
  END IF;

  -- An event emitted before the wait was reached.
  SELECT e.id, e.payload INTO v_event FROM idemq.events e
  WHERE e.event = await_event.event AND coalesce(e.key, '') = coalesce(await_event.key, '')
    AND e.emitted_at >= v_job.created_at
    AND e.id > coalesce((SELECT max(t.event_id) FROM idemq.job_steps t
                         WHERE t.job_id = await_event.job_id AND t.event = await_event.event
                           AND coalesce(t.event_key, '') = coalesce(await_event.key, '')), 0)
  ORDER BY e.id
  LIMIT 1;
  IF FOUND THEN
    UPDATE idemq.job_steps AS s SET status = 'received', result = v_event.payload, event_id = v_event.id
    WHERE s.job_id = await_event.job_id AND s.name = await_event.name;
    status := 'received';
    payload := v_event.payload;
  ELSIF v_step.wake_at <= now() THEN
    UPDATE idemq.job_steps AS s SET status = 'timed_out'
    WHERE s.job_id = await_event.job_id AND s.name = await_event.name;
    status := 'timed_out';
    payload := NULL;
  ELSE
    PERFORM idemq.snooze(await_event.job_id, await_event.attempt, v_step.wake_at, await_event.lease_token);
    status := 'waiting';
    payload := NULL;
  END IF;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.await_event(bigint, int, text, text, text, interval, uuid) IS
  'A held job''s wait for (event, key): the payload when emitted (now or before), timed_out past the deadline, else park the job until either.';
