-- idemq._cron_parse(cron text) RETURNS jsonb
--
-- Parses and validates a cron expression into the sets of values its slots
-- match, so _cron_next iterates over candidates instead of scanning time.
--
-- Guarantees:
--   * Five fields (minute hour day-of-month month day-of-week) or six (a
--     seconds field first); each as _cron_field accepts; months may be
--     JAN-DEC, weekdays SUN-SAT, and weekday 7 is Sunday.
--   * Macros: @yearly (@annually) 0 0 1 1 *, @monthly 0 0 1 * *, @weekly
--     0 0 * * 0, @daily (@midnight) 0 0 * * *, @hourly 0 * * * *, and
--     @every <interval>: a fixed period of whole seconds (at least 1 second,
--     no months or years), its slots the multiples of the period since the
--     Unix epoch, so every caller computes the same slots.
--   * Returns {"every": seconds} or {"second", "minute", "hour", "day",
--     "month", "weekday": sorted int arrays, "day_or_weekday": boolean}.
--     day_or_weekday is true when both day fields are restricted (neither
--     starts with *): a day then matches when either field does (Vixie cron).
--   * An expression that can never fire (e.g. 0 0 31 2 *) is rejected;
--     Feb 29 is accepted (it fires in leap years).
-- Concurrency: none (immutable).
-- Errors: 22004 cron is NULL; 22023 a wrong number of fields, an unknown
--   macro, a bad @every interval, a bad field (see _cron_field), or an
--   expression that never fires; each with a HINT.
-- Tests: test/sql/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq._cron_parse(cron text)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_text text := btrim(_cron_parse.cron);
  v_fields text[];
  v_every interval;
  v_seconds numeric;
  v_offset int;
  v_second int[];
  v_minute int[];
  v_hour int[];
  v_day int[];
  v_month int[];
  v_weekday int[];
  v_or boolean;
BEGIN
  IF _cron_parse.cron IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'cron must not be NULL',
      HINT = 'Pass a cron expression such as ''0 3 * * *'' (03:00 every day) or ''@every 10 minutes''.';
  END IF;

  IF v_text ~* '^@every\s' THEN
    BEGIN
      v_every := btrim(substr(v_text, 7))::interval;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('cron "%s": "%s" is not an interval', v_text, btrim(substr(v_text, 7))),
        HINT = 'Write @every followed by a PostgreSQL interval, e.g. @every 10 minutes or @every 1 hour 30 minutes.';
    END;
    v_seconds := extract(epoch FROM v_every);
    IF extract(year FROM v_every) <> 0 OR extract(month FROM v_every) <> 0
       OR v_seconds < 1 OR v_seconds <> trunc(v_seconds) THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('cron "%s": the period must be a whole number of seconds, at least 1, without months or years', v_text),
        HINT = 'Use seconds to days (e.g. @every 90 seconds, @every 7 days); for calendar periods use @monthly, @yearly or a cron expression.';
    END IF;
    RETURN jsonb_build_object('every', v_seconds::bigint);
  END IF;

  v_text := CASE lower(v_text)
    WHEN '@yearly' THEN '0 0 1 1 *'
    WHEN '@annually' THEN '0 0 1 1 *'
    WHEN '@monthly' THEN '0 0 1 * *'
    WHEN '@weekly' THEN '0 0 * * 0'
    WHEN '@daily' THEN '0 0 * * *'
    WHEN '@midnight' THEN '0 0 * * *'
    WHEN '@hourly' THEN '0 * * * *'
    ELSE v_text END;
  IF v_text LIKE '@%' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('cron "%s" is not a known macro', v_text),
      HINT = 'The macros are @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly and @every <interval>.';
  END IF;

  v_fields := regexp_split_to_array(v_text, '\s+');
  IF cardinality(v_fields) NOT IN (5, 6) OR v_text = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('cron "%s" has %s fields, not 5 or 6', v_text, CASE WHEN v_text = '' THEN 0 ELSE cardinality(v_fields) END),
      HINT = 'Write minute hour day-of-month month day-of-week (e.g. 30 2 * * MON-FRI), with an optional seconds field first.';
  END IF;
  v_offset := cardinality(v_fields) - 5;
  v_second := CASE WHEN v_offset = 1 THEN idemq._cron_field(v_fields[1], 1, 'second', 0, 59) ELSE '{0}' END;
  v_minute := idemq._cron_field(v_fields[v_offset + 1], v_offset + 1, 'minute', 0, 59);
  v_hour := idemq._cron_field(v_fields[v_offset + 2], v_offset + 2, 'hour', 0, 23);
  v_day := idemq._cron_field(v_fields[v_offset + 3], v_offset + 3, 'day of month', 1, 31);
  v_month := idemq._cron_field(v_fields[v_offset + 4], v_offset + 4, 'month', 1, 12,
    '{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}');
  v_weekday := idemq._cron_field(v_fields[v_offset + 5], v_offset + 5, 'day of week', 0, 7,
    '{SUN,MON,TUE,WED,THU,FRI,SAT}');
  v_weekday := ARRAY(SELECT DISTINCT w % 7 FROM unnest(v_weekday) w ORDER BY 1);
  v_or := v_fields[v_offset + 3] NOT LIKE '*%' AND v_fields[v_offset + 5] NOT LIKE '*%';

  -- With the OR rule any listed weekday fires; otherwise some listed day
  -- must exist in some listed month (a weekday restriction alone always meets one).
  IF NOT v_or AND NOT EXISTS (
    SELECT 1 FROM unnest(v_month) m, unnest(v_day) d
    WHERE d <= CASE WHEN m = 2 THEN 29 WHEN m IN (4, 6, 9, 11) THEN 30 ELSE 31 END) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('cron "%s" never fires: no month in field %s (month) has a day in field %s (day of month)',
                       v_text, v_offset + 4, v_offset + 3),
      HINT = 'Check the day of month against the months (February has at most 29 days; April, June, September and November 30).';
  END IF;

  RETURN jsonb_build_object('second', v_second, 'minute', v_minute, 'hour', v_hour, 'day', v_day,
                            'month', v_month, 'weekday', v_weekday, 'day_or_weekday', v_or);
END;
$$;

COMMENT ON FUNCTION idemq._cron_parse(text) IS
  'Parse and validate a cron expression (5 or 6 fields, names, steps, @macros, @every) into its value sets.';
