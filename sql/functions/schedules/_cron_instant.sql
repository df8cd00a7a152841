-- idemq._cron_instant(local_time timestamp, timezone text) RETURNS timestamptz
--
-- The instant a schedule's local wall-clock slot fires at in a time zone,
-- across DST changes.
--
-- Guarantees:
--   * A local time that occurs once: that instant.
--   * A local time that occurs twice (the hour repeated when clocks go back):
--     its first occurrence, so the slot fires once, before the change. (PostgreSQL's
--     AT TIME ZONE picks the second one.)
--   * A local time that does not exist (skipped when clocks go forward): the
--     instant of the change, the next valid instant; every skipped local time
--     maps to it, so they fire once between them. (PostgreSQL's AT TIME ZONE
--     would shift it by the offset change instead.)
--   * Non-decreasing in local_time, which _cron_next relies on.
-- Concurrency: none (stable: reads the time zone database).
-- Errors: 22023 an unknown time zone (callers check it first with _check_timezone).
-- Tests: test/sql/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq._cron_instant(local_time timestamp, timezone text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_at timestamptz := _cron_instant.local_time AT TIME ZONE _cron_instant.timezone;
  v_day_before timestamptz;
  v_offset_before interval;
  v_offset_after interval;
  v_first timestamptz;
  v_lo timestamptz;
  v_hi timestamptz;
  v_mid timestamptz;
BEGIN
  -- UTC offsets a day earlier and at v_at: a DST change lies between them
  -- when they differ (changes are months apart).
  v_day_before := v_at - interval '1 day';
  v_offset_before := (v_day_before AT TIME ZONE _cron_instant.timezone) - (v_day_before AT TIME ZONE 'UTC');
  v_first := (_cron_instant.local_time - v_offset_before) AT TIME ZONE 'UTC';
  IF v_first < v_at AND (v_first AT TIME ZONE _cron_instant.timezone) = _cron_instant.local_time THEN
    RETURN v_first;
  END IF;
  IF (v_at AT TIME ZONE _cron_instant.timezone) = _cron_instant.local_time THEN
    RETURN v_at;
  END IF;
  -- A gap: v_at is past the change by the offset difference; bisect for the
  -- change itself (the first instant with the new offset), to the second.
  v_offset_after := (v_at AT TIME ZONE _cron_instant.timezone) - (v_at AT TIME ZONE 'UTC');
  IF v_offset_after <= v_offset_before THEN
    RETURN v_at;
  END IF;
  v_lo := v_at - (v_offset_after - v_offset_before);
  v_hi := v_at;
  WHILE v_hi - v_lo > interval '1 second' LOOP
    v_mid := v_lo + (v_hi - v_lo) / 2;
    IF (v_mid AT TIME ZONE _cron_instant.timezone) - (v_mid AT TIME ZONE 'UTC') = v_offset_after THEN
      v_hi := v_mid;
    ELSE
      v_lo := v_mid;
    END IF;
  END LOOP;
  -- Changes happen on whole seconds: the second after v_lo.
  RETURN date_trunc('second', v_lo) + interval '1 second';
END;
$$;

COMMENT ON FUNCTION idemq._cron_instant(timestamp, text) IS
  'The instant a local slot fires at: the first occurrence of a repeated time, the change instant for a skipped one.';
