-- idemq.schedule(name text, cron text, task text, payload jsonb DEFAULT NULL, queue text DEFAULT NULL,
--   timezone text DEFAULT 'UTC', overlap idemq.schedule_overlap DEFAULT 'skip',
--   misfire idemq.schedule_misfire DEFAULT 'once', misfire_grace interval DEFAULT '1 minute',
--   priority int DEFAULT NULL, max_attempts int DEFAULT NULL)
--   RETURNS timestamptz
--
-- Creates or replaces the recurring schedule `name`: tick() enqueues a job of
-- `task` for each of its cron slots. Returns the schedule's next slot.
--
-- Guarantees:
--   * Upsert by name. A schedule whose cron and timezone are unchanged keeps
--     its next_at, so re-declaring it (a worker at every start) loses no due
--     slot; a changed cron or timezone starts from the first slot after now().
--     Counters and the last job are kept. A definition equal to the stored
--     one writes nothing (updated_at stays: it is when the definition last
--     changed), so workers that declare their schedules at every start, any
--     number at once, change nothing.
--   * payload, queue, priority and max_attempts left NULL take enqueue()'s
--     defaults (idemq._job_defaults()), stored with the schedule.
--   * cron: see _cron_parse (5 or 6 fields, names, steps, @macros, @every);
--     timezone: an IANA name; slots are local times there (see _cron_instant
--     for DST). overlap and misfire: see _tick.
--   * Every argument is checked before anything is written: an error leaves
--     the schedules table as it was. The job its slots enqueue is checked by
--     enqueue's own rules (_job_problem, the limits of idemq.settings: task,
--     payload, and the slot's idempotency key against key_bytes), so tick()
--     does not meet a job enqueue refuses (unless an admin lowers a limit
--     later).
-- Concurrency: the upsert locks the schedule row; it waits for a tick() that
--   holds it, and a tick after it sees the new definition.
-- Errors: 22004 a required argument is NULL; 22023 a bad cron (naming the
--   field, e.g. cron field 2 (hour) "25" is out of range 0-23), an unknown
--   time zone, an empty name or task, a name over 200 characters, a payload
--   that is not an object, a bad queue, max_attempts < 1, misfire_grace
--   outside 1 second..1 day, a job over a limit (task_bytes, payload_bytes,
--   key_bytes for the slot key); each with a HINT.
-- Tests: test/sql/schedules.test.ts, test/sql/schedules-tick.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.schedule(
  name text,
  cron text,
  task text,
  payload jsonb DEFAULT NULL,
  queue text DEFAULT NULL,
  timezone text DEFAULT 'UTC',
  overlap idemq.schedule_overlap DEFAULT 'skip',
  misfire idemq.schedule_misfire DEFAULT 'once',
  misfire_grace interval DEFAULT '1 minute',
  priority int DEFAULT NULL,
  max_attempts int DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_defaults jsonb := idemq._job_defaults();
  v_null text;
  v_problem text;
  v_hint text;
  v_spec jsonb;
  v_next timestamptz;
  v_payload jsonb := coalesce(schedule.payload, v_defaults -> 'payload');
  v_queue text := coalesce(schedule.queue, v_defaults ->> 'queue');
  v_priority int := coalesce(schedule.priority, (v_defaults ->> 'priority')::int);
  v_max_attempts int := coalesce(schedule.max_attempts, (v_defaults ->> 'max_attempts')::int);
  v_job idemq._planned_job;
  v_limits idemq._enqueue_limits;
  v_job_problem text[];
BEGIN
  v_null := CASE
    WHEN schedule.name IS NULL THEN 'name'
    WHEN schedule.cron IS NULL THEN 'cron'
    WHEN schedule.task IS NULL THEN 'task'
    WHEN schedule.overlap IS NULL THEN 'overlap'
    WHEN schedule.misfire IS NULL THEN 'misfire'
    WHEN schedule.misfire_grace IS NULL THEN 'misfire_grace'
  END;
  IF v_null IS NOT NULL THEN
    PERFORM idemq._raise_null_argument('schedule', v_null);
  END IF;
  SELECT p.problem, p.hint INTO v_problem, v_hint FROM (VALUES
    (schedule.name = '', 'name must not be empty', 'Name the schedule, e.g. ''nightly-report''; it is part of each slot''s idempotency key.'),
    (length(schedule.name) > 200, 'name must be at most 200 characters', 'Use a shorter name; it is part of each slot''s idempotency key.'),
    (schedule.task = '', 'task must not be empty', 'Pass the task name a worker handles.'),
    (jsonb_typeof(v_payload) <> 'object', format('payload must be a JSON object, not %s', v_payload), 'Wrap the value in an object, e.g. {"value": ...}.'),
    (v_queue = '' OR length(v_queue) > idemq._queue_name_limit(),
     format('queue must be 1 to %s characters', idemq._queue_name_limit()), 'Leave queue out for the default queue, or pass a short name.'),
    (v_max_attempts < 1, format('max_attempts must be at least 1, not %s', v_max_attempts), 'Leave it out for the default, or pass 1 or more.'),
    (schedule.misfire_grace < interval '1 second' OR schedule.misfire_grace > interval '1 day',
     format('misfire_grace must be between 1 second and 1 day, not %s', schedule.misfire_grace),
     'misfire_grace is how late a slot may run and still count as on time; call tick() more often than that.')
  ) AS p(bad, problem, hint)
  WHERE p.bad
  LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'schedule: ' || v_problem, HINT = v_hint;
  END IF;
  -- The job a slot enqueues (_tick: key schedule:<name>:<UTC slot>, its
  -- timestamp always 20 characters), checked by enqueue's rules.
  v_job.task := schedule.task;
  v_job.payload := v_payload;
  v_job.queue := v_queue;
  v_job.run_at := now();
  v_job.priority := v_priority;
  v_job.max_attempts := v_max_attempts;
  v_job.idempotency_key := format('schedule:%s:%s', schedule.name, '0000-00-00T00:00:00Z');
  v_job.duplicate_policy := 'reject_always';
  v_job.key_retention := (v_defaults ->> 'key_retention')::interval;
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  v_job_problem := idemq._job_problem(v_job, v_limits);
  IF v_job_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'schedule: its jobs would be refused: ' || v_job_problem[1],
      HINT = coalesce(v_job_problem[2] || ' ', '') || 'Nothing was scheduled.';
  END IF;
  PERFORM idemq._check_timezone(schedule.timezone, 'schedule');
  v_spec := idemq._cron_parse(schedule.cron);
  v_next := idemq._cron_next(v_spec, schedule.timezone, now());
  IF v_next IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('schedule: cron "%s" does not fire within 50 years', schedule.cron),
      HINT = 'Check the day-of-month, month and day-of-week fields together.';
  END IF;

  INSERT INTO idemq.schedules AS s (name, cron, timezone, task, payload, queue, priority, max_attempts,
                                    overlap, misfire, misfire_grace, next_at)
  VALUES (schedule.name, schedule.cron, schedule.timezone, schedule.task, v_payload, v_queue, v_priority,
          v_max_attempts, schedule.overlap, schedule.misfire, schedule.misfire_grace, v_next)
  ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
  SET cron = excluded.cron, timezone = excluded.timezone, task = excluded.task, payload = excluded.payload,
      queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
      overlap = excluded.overlap, misfire = excluded.misfire, misfire_grace = excluded.misfire_grace,
      next_at = CASE WHEN s.cron = excluded.cron AND s.timezone = excluded.timezone THEN s.next_at
                     ELSE excluded.next_at END,
      updated_at = now()
  WHERE (s.cron, s.timezone, s.task, s.payload, s.queue, s.priority, s.max_attempts, s.overlap, s.misfire, s.misfire_grace)
        IS DISTINCT FROM (excluded.cron, excluded.timezone, excluded.task, excluded.payload, excluded.queue,
                          excluded.priority, excluded.max_attempts, excluded.overlap, excluded.misfire, excluded.misfire_grace)
  RETURNING s.next_at INTO v_next;
  IF NOT FOUND THEN
    -- The same definition: ON CONFLICT locked the row and left it as it was.
    SELECT s.next_at INTO v_next FROM idemq.schedules AS s WHERE s.name = schedule.name;
  END IF;
  RETURN v_next;
END;
$$;

COMMENT ON FUNCTION idemq.schedule(text, text, text, jsonb, text, text, idemq.schedule_overlap, idemq.schedule_misfire, interval, int, int) IS
  'Create or replace a recurring schedule (cron, time zone, overlap and misfire policies); returns its next slot.';
