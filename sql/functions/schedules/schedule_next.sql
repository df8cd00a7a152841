-- idemq.schedule_next(cron text, timezone text DEFAULT 'UTC', after timestamptz DEFAULT now(),
--   count int DEFAULT 1) RETURNS SETOF timestamptz
--
-- The next `count` slots of a cron expression after an instant, so a user or
-- the CLI can check an expression before scheduling it.
--
-- Guarantees:
--   * The same slots tick() runs for a schedule with this cron and timezone,
--     in order, each strictly after the previous (and the first after
--     `after`). Fewer than count rows only when the expression stops firing
--     within 50 years of a slot.
--   * Validates as schedule() does (same errors, same messages).
-- Concurrency: none (reads nothing but its arguments and the time zone database).
-- Errors: 22004 a NULL argument; 22023 a bad cron or time zone, count outside 1..1000.
-- Tests: test/sql/schedules.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.schedule_next(cron text, timezone text DEFAULT 'UTC', after timestamptz DEFAULT now(),
                                               count int DEFAULT 1)
RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_spec jsonb;
  v_at timestamptz := schedule_next.after;
BEGIN
  IF schedule_next.after IS NULL OR schedule_next.count IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('schedule_next: %s must not be NULL', CASE WHEN schedule_next.after IS NULL THEN 'after' ELSE 'count' END),
      HINT = 'Leave the argument out to use its default.';
  END IF;
  IF schedule_next.count NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('schedule_next: count must be between 1 and 1000, not %s', schedule_next.count),
      HINT = 'Ask for a few slots, e.g. count => 5.';
  END IF;
  PERFORM idemq._check_timezone(schedule_next.timezone, 'schedule_next');
  v_spec := idemq._cron_parse(schedule_next.cron);
  FOR i IN 1 .. schedule_next.count LOOP
    v_at := idemq._cron_next(v_spec, schedule_next.timezone, v_at);
    EXIT WHEN v_at IS NULL;
    RETURN NEXT v_at;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.schedule_next(text, text, timestamptz, int) IS
  'The next slots of a cron expression in a time zone after an instant (to check an expression).';
