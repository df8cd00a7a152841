-- idemq._cron_next(spec jsonb, timezone text, after timestamptz) RETURNS timestamptz
--
-- The first slot of a parsed cron expression (_cron_parse) strictly after
-- `after`, in a time zone; NULL when none falls within 50 years.
--
-- Guarantees:
--   * Iterates over candidate days (months and days from the parsed sets,
--     the day-of-month/day-of-week rule applied), then over the listed hours,
--     minutes and seconds of a matching day, starting at the local time of
--     `after`: the work is proportional to the candidates skipped, never a
--     minute-by-minute scan.
--   * Local times become instants by _cron_instant: a repeated local time
--     fires once (its first occurrence), a skipped one at the change
--     instant. That mapping never decreases, so no candidate before the local
--     time of `after` can be later than `after`, and the first candidate later
--     than `after` is the answer.
--   * {"every": s}: the next multiple of s seconds since the Unix epoch (the
--     time zone plays no part).
-- Concurrency: none (stable).
-- Errors: none for a spec from _cron_parse and a known time zone.
-- Tests: test/sql/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq._cron_next(spec jsonb, timezone text, after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_every numeric := (_cron_next.spec ->> 'every')::numeric;
  v_start timestamp;
  v_year int;
  v_month0 int;
  v_day0 int;
  v_hour0 int;
  v_minute0 int;
  v_second0 int;
  v_seconds int[];
  v_minutes int[];
  v_hours int[];
  v_days int[];
  v_months int[];
  v_weekdays int[];
  v_or boolean;
  v_y int;
  v_m int;
  v_d int;
  v_h int;
  v_mi int;
  v_s int;
  v_date date;
  v_last_day int;
  v_today boolean;
  v_this_hour boolean;
  v_this_minute boolean;
  v_at timestamptz;
BEGIN
  IF v_every IS NOT NULL THEN
    RETURN to_timestamp(((floor(extract(epoch FROM _cron_next.after) / v_every) + 1) * v_every)::float8);
  END IF;
  v_seconds := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'second')::int);
  v_minutes := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'minute')::int);
  v_hours := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'hour')::int);
  v_days := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'day')::int);
  v_months := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'month')::int);
  v_weekdays := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'weekday')::int);
  v_or := (_cron_next.spec ->> 'day_or_weekday')::boolean;

  v_start := date_trunc('second', _cron_next.after AT TIME ZONE _cron_next.timezone);
  v_year := extract(year FROM v_start)::int;
  v_month0 := extract(month FROM v_start)::int;
  v_day0 := extract(day FROM v_start)::int;
  v_hour0 := extract(hour FROM v_start)::int;
  v_minute0 := extract(minute FROM v_start)::int;
  v_second0 := extract(second FROM v_start)::int;

  FOR v_y IN v_year .. v_year + 50 LOOP
    FOREACH v_m IN ARRAY v_months LOOP
      CONTINUE WHEN v_y = v_year AND v_m < v_month0;
      v_last_day := extract(day FROM make_date(v_y, v_m, 1) + interval '1 month' - interval '1 day')::int;
      FOR v_d IN CASE WHEN v_y = v_year AND v_m = v_month0 THEN v_day0 ELSE 1 END .. v_last_day LOOP
        v_date := make_date(v_y, v_m, v_d);
        IF v_or THEN
          CONTINUE WHEN NOT (v_d = ANY (v_days) OR extract(dow FROM v_date)::int = ANY (v_weekdays));
        ELSE
          CONTINUE WHEN NOT (v_d = ANY (v_days) AND extract(dow FROM v_date)::int = ANY (v_weekdays));
        END IF;
        v_today := v_date = v_start::date;
        FOREACH v_h IN ARRAY v_hours LOOP
          CONTINUE WHEN v_today AND v_h < v_hour0;
          v_this_hour := v_today AND v_h = v_hour0;
          FOREACH v_mi IN ARRAY v_minutes LOOP
            CONTINUE WHEN v_this_hour AND v_mi < v_minute0;
            v_this_minute := v_this_hour AND v_mi = v_minute0;
            FOREACH v_s IN ARRAY v_seconds LOOP
              CONTINUE WHEN v_this_minute AND v_s < v_second0;
              v_at := idemq._cron_instant(v_date + make_interval(hours => v_h, mins => v_mi, secs => v_s),
                                          _cron_next.timezone);
              IF v_at > _cron_next.after THEN
                RETURN v_at;
              END IF;
            END LOOP;
          END LOOP;
        END LOOP;
      END LOOP;
    END LOOP;
  END LOOP;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._cron_next(jsonb, text, timestamptz) IS
  'The first slot of a parsed cron expression after an instant, in a time zone (DST-aware); NULL within 50 years none.';
