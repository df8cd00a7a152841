-- idemq.emit(event text, key text DEFAULT NULL, payload jsonb DEFAULT '{}') RETURNS int
--
-- Emits the event (event, key) with its payload, in the caller's
-- transaction: every job waiting for it (await_event) gets the payload and
-- runs at once; a job that reaches its wait later finds it. Returns how many
-- waiting jobs it woke.
--
-- Guarantees:
--   * Nothing happens unless the caller's transaction commits: the event,
--     the waits it answers and the wake-ups commit or roll back with it.
--   * Every wait in status `waiting` on the same event name and key (NULL
--     matches only NULL) records the payload (status `received`); its job,
--     parked in `scheduled`, gets run_at now() and a NOTIFY (_notify_waiting)
--     when a worker listens to its queue.
--   * The event is kept event_retention_seconds (idemq.settings, default 7
--     days; apply_retention deletes older ones) for waits reached later, by
--     the rule of await_event (docs/design.md, "Durable steps").
--   * The payload is at most _result_limit bytes of JSON text.
-- Concurrency: _event_lock(event, key) until the caller's transaction ends
--   (emits of one pair queue behind each other, and behind a wait parking on
--   it); then the waiting steps' rows and their jobs' rows. Call it at READ
--   COMMITTED (see await_event).
-- Errors: 22004 NULL event or payload; 22023 empty event or key, either over
--   key_bytes, payload over the limit.
-- Tests: test/sql/steps.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts,
--   test/worker/steps.test.ts, test/worker/steps-faults.test.ts, test/worker/steps-restart.test.ts,
--   test/worker/workflow-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.emit(event text, key text DEFAULT NULL, payload jsonb DEFAULT '{}')
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_id bigint;
  v_woken int;
  v_queues text[];
  v_queue text;
BEGIN
  PERFORM idemq._check_event('emit', emit.event, emit.key);
  IF emit.payload IS NULL THEN
    PERFORM idemq._raise_null_argument('emit', 'payload');
  END IF;
  PERFORM idemq._check_result('emit', format('the payload of event %s', idemq._excerpt(emit.event)), emit.payload,
    'Keep an event''s payload small (ids, statuses); store bulky data in a table and send its key.');
  PERFORM idemq._event_lock(emit.event, emit.key);
  INSERT INTO idemq.events (event, key, payload)
  VALUES (emit.event, emit.key, emit.payload)
  RETURNING id INTO v_id;

  WITH woken AS (
    UPDATE idemq.job_steps AS s SET status = 'received', result = emit.payload, event_id = v_id
    WHERE s.status = 'waiting' AND s.event = emit.event
      AND coalesce(s.event_key, '') = coalesce(emit.key, '')
    RETURNING s.job_id
  ), moved AS (
    UPDATE idemq.jobs AS j SET run_at = now()
    FROM woken w
    WHERE j.id = w.job_id AND j.state = 'scheduled' AND j.run_at > now()
    RETURNING j.queue
  )
  SELECT (SELECT count(*) FROM woken), (SELECT array_agg(DISTINCT m.queue) FROM moved m)
  INTO v_woken, v_queues;
  FOREACH v_queue IN ARRAY coalesce(v_queues, '{}') LOOP
    PERFORM idemq._notify_waiting(v_queue);
  END LOOP;
  RETURN v_woken;
END;
$$;

COMMENT ON FUNCTION idemq.emit(text, text, jsonb) IS
  'Emit (event, key) with a payload in the caller''s transaction: wakes the jobs waiting for it; kept for waits reached later.';
