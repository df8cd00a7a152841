-- Migration 0010_schedules (issue 13): recurring schedules in SQL: the schedules table, cron evaluation with time zones, schedule/unschedule/schedules/schedule_next and tick().
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ (npm run migration:check compares them). Once released (listed
-- in sql/released.sha256) this file never changes again.
-- Up Migration

-- Hand-written schema changes (tables, columns, indexes) go here, before the
-- functions that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes
-- in a migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration commits
-- on its own, so the next migration can use it.

-- Recurring schedules (schedule(), tick()). The policies are enums, like
-- duplicate_policy: one definition, and the catalog lists them.
CREATE TYPE idemq.schedule_overlap AS ENUM ('skip', 'allow', 'queue_one');
CREATE TYPE idemq.schedule_misfire AS ENUM ('once', 'skip', 'all');

-- One row per schedule. next_at is the first slot tick() has not handled:
-- tick() locks the due rows FOR UPDATE SKIP LOCKED and advances next_at past
-- its clock before committing, so concurrent ticks handle each slot once.
-- The job fields are stored resolved (enqueue()'s defaults filled in by
-- schedule()), so a tick enqueues exactly what the schedule shows.
CREATE TABLE idemq.schedules (
  name           text PRIMARY KEY,
  cron           text NOT NULL,
  timezone       text NOT NULL,
  task           text NOT NULL,
  payload        jsonb NOT NULL,
  queue          text NOT NULL,
  priority       int NOT NULL,
  max_attempts   int NOT NULL,
  overlap        idemq.schedule_overlap NOT NULL,
  misfire        idemq.schedule_misfire NOT NULL,
  misfire_grace  interval NOT NULL,
  next_at        timestamptz NOT NULL,
  -- The latest slot that got a job, and that job (the overlap policies read its state).
  last_slot_at   timestamptz,
  last_job_id    bigint,
  -- Slots the overlap policy dropped because the previous job was still active.
  skipped        bigint NOT NULL DEFAULT 0,
  created_at     timestamptz NOT NULL DEFAULT now(),
  updated_at     timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT schedules_name_not_empty CHECK (name <> ''),
  CONSTRAINT schedules_name_length CHECK (length(name) <= 200),
  CONSTRAINT schedules_cron_not_empty CHECK (cron <> ''),
  CONSTRAINT schedules_task_not_empty CHECK (task <> ''),
  CONSTRAINT schedules_queue_not_empty CHECK (queue <> ''),
  CONSTRAINT schedules_payload_is_object CHECK (jsonb_typeof(payload) = 'object'),
  CONSTRAINT schedules_max_attempts_positive CHECK (max_attempts >= 1),
  CONSTRAINT schedules_misfire_grace_in_range
    CHECK (misfire_grace BETWEEN interval '1 second' AND interval '1 day'),
  CONSTRAINT schedules_skipped_not_negative CHECK (skipped >= 0),
  CONSTRAINT schedules_last_job_has_slot CHECK (last_job_id IS NULL OR last_slot_at IS NOT NULL)
);
-- tick(): the due schedules.
CREATE INDEX schedules_due ON idemq.schedules (next_at);

-- ---- sql/functions/_check_timezone.sql ----
-- idemq._check_timezone(timezone text, operation text) RETURNS void
--
-- Rejects a time zone that is NULL or not an IANA zone name PostgreSQL knows.
--
-- Guarantees: returns only for a name in pg_timezone_names (e.g. UTC,
--   Europe/Berlin, America/New_York). Abbreviations (CEST) and POSIX strings
--   (UTC+3, whose sign PostgreSQL inverts) are refused: they have no DST
--   rules, or surprising ones.
-- Concurrency: none.
-- Errors: 22004 NULL; 22023 unknown zone, with a HINT.
-- Tests: test/sql/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq._check_timezone(timezone text, operation text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_timezone.timezone IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: timezone must not be NULL', _check_timezone.operation),
      HINT = 'Leave it out for UTC, or pass an IANA zone name such as ''Europe/Berlin''.';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names z WHERE z.name = _check_timezone.timezone) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: timezone "%s" is not an IANA time zone name', _check_timezone.operation, _check_timezone.timezone),
      HINT = 'Use a name from pg_timezone_names, such as UTC, Europe/Berlin or America/New_York (not an abbreviation like CEST).';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_timezone(text, text) IS
  'Raise unless the time zone is an IANA name PostgreSQL knows.';

-- ---- sql/functions/_cron_field.sql ----
-- idemq._cron_field(field text, field_number int, label text, lo int, hi int, names text[] DEFAULT NULL)
--   RETURNS int[]
--
-- The values one cron field matches, sorted and without duplicates.
--
-- Guarantees:
--   * Accepts a comma-separated list of items, each `*`, a number, a name
--     (names[i] stands for lo + i - 1, case-insensitive) or a range `a-b`,
--     each optionally with a step: `*/7`, `1-10/2`, `5/15` (from 5 to hi).
--   * Every value is in lo..hi; a range's start is not after its end; a step
--     is at least 1.
--   * Returns the values as given: the caller maps day-of-week 7 to 0.
-- Concurrency: none (immutable).
-- Errors: 22023 naming the field by position and label, the bad item, and
--   the allowed range, e.g. cron field 2 (hour) "25" is out of range 0-23,
--   with a HINT that shows the accepted forms.
-- Tests: test/sql/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq._cron_field(field text, field_number int, label text, lo int, hi int, names text[] DEFAULT NULL)
RETURNS int[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_hint text;
  v_item text;
  v_parts text[];
  v_ends text[];
  v_token text;
  v_bounds int[];
  v_value int;
  v_step int;
  v_values int[] := '{}';
BEGIN
  v_hint := format('Field %s (%s) takes %s-%s%s: *, a value, a list (1,5), a range (1-5) or a step (*/7, 1-10/2).',
                   _cron_field.field_number, _cron_field.label, _cron_field.lo, _cron_field.hi,
                   CASE WHEN _cron_field.names IS NULL THEN ''
                        ELSE format(' or %s-%s', _cron_field.names[1], _cron_field.names[cardinality(_cron_field.names)]) END);
  FOREACH v_item IN ARRAY string_to_array(_cron_field.field, ',') LOOP
    v_parts := string_to_array(v_item, '/');
    IF v_item = '' OR cardinality(v_parts) > 2 OR v_parts[1] = '' THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('cron field %s (%s) "%s" is not a value, range or step', _cron_field.field_number, _cron_field.label, v_item),
        HINT = v_hint;
    END IF;
    v_step := 1;
    IF cardinality(v_parts) = 2 THEN
      IF v_parts[2] !~ '^[0-9]{1,9}$' OR v_parts[2]::int < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
          MESSAGE = format('cron field %s (%s) step "%s" is not a whole number of at least 1', _cron_field.field_number, _cron_field.label, v_parts[2]),
          HINT = v_hint;
      END IF;
      v_step := v_parts[2]::int;
    END IF;

    IF v_parts[1] = '*' THEN
      v_bounds := ARRAY[_cron_field.lo, _cron_field.hi];
    ELSE
      v_ends := string_to_array(v_parts[1], '-');
      IF cardinality(v_ends) > 2 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
          MESSAGE = format('cron field %s (%s) "%s" is not a value, range or step', _cron_field.field_number, _cron_field.label, v_item),
          HINT = v_hint;
      END IF;
      v_bounds := '{}';
      FOREACH v_token IN ARRAY v_ends LOOP
        IF v_token ~ '^[0-9]{1,9}$' THEN
          v_value := v_token::int;
        ELSE
          v_value := array_position(_cron_field.names, upper(v_token)) + _cron_field.lo - 1;
          IF v_value IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
              MESSAGE = format('cron field %s (%s) "%s" is not a number%s', _cron_field.field_number, _cron_field.label, v_token,
                               CASE WHEN _cron_field.names IS NULL THEN '' ELSE ' or a name' END),
              HINT = v_hint;
          END IF;
        END IF;
        IF v_value < _cron_field.lo OR v_value > _cron_field.hi THEN
          RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('cron field %s (%s) "%s" is out of range %s-%s', _cron_field.field_number, _cron_field.label, v_token,
                             _cron_field.lo, _cron_field.hi),
            HINT = v_hint;
        END IF;
        v_bounds := v_bounds || v_value;
      END LOOP;
      IF cardinality(v_ends) = 1 THEN
        -- `5/15` runs from 5 to the end of the range, as in Vixie cron.
        v_bounds := ARRAY[v_bounds[1], CASE WHEN cardinality(v_parts) = 2 THEN _cron_field.hi ELSE v_bounds[1] END];
      ELSIF v_bounds[1] > v_bounds[2] THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
          MESSAGE = format('cron field %s (%s) range "%s" starts after it ends', _cron_field.field_number, _cron_field.label, v_parts[1]),
          HINT = format('Write the smaller value first, or a list for a range that wraps (e.g. 22-23,0-2). %s', v_hint);
      END IF;
    END IF;
    v_values := v_values || ARRAY(SELECT generate_series(v_bounds[1], v_bounds[2], v_step));
  END LOOP;
  RETURN ARRAY(SELECT DISTINCT v FROM unnest(v_values) v ORDER BY v);
END;
$$;

COMMENT ON FUNCTION idemq._cron_field(text, int, text, int, int, text[]) IS
  'The sorted values one cron field matches; raises 22023 naming the field and the bad item.';

-- ---- sql/functions/_cron_instant.sql ----
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

-- ---- sql/functions/_grant_roles.sql ----
-- idemq._grant_roles() RETURNS TABLE(role text, privilege text)
--
-- Gives the idemq group roles that exist what their names say and nothing
-- more, and PUBLIC nothing; returns each privilege it granted. The one
-- definition of who may call what (docs/design.md, "Roles").
--
-- Guarantees:
--   * PUBLIC has EXECUTE on no function of idemq, public or private.
--   * idemq_producer: enqueue, enqueue_many. idemq_worker: claim, complete,
--     complete_many, fail, heartbeat, snooze, guard, effect_claim,
--     effect_done, effect_release, rescue, wait_for_jobs, stop_waiting,
--     prune_keys, tick (the workers' maintenance timer runs the schedules). idemq_admin: every public function, SELECT on the
--     tables of idemq (reading jobs), and UPDATE of idemq.settings.value
--     (the limits). All three: USAGE on schema idemq and the
--     constants active_states() and terminal_states().
--   * No other table privilege: the public functions are SECURITY DEFINER
--     (owned by the schema owner, search_path pinned), so a role needs only
--     EXECUTE; a worker reads payloads only through claim().
--   * A role that does not exist is skipped (`idemq roles sql` prints the
--     script a DBA runs to create the roles and call this again); running it
--     again grants the same and changes nothing.
-- Concurrency: GRANT updates the functions' catalog rows; migrations run it
--   under node-pg-migrate's lock, one per database.
-- Errors: 42501 when the caller neither owns the functions nor is a superuser.
-- Tests: test/sql/roles.test.ts, test/install/non-superuser.test.ts
CREATE OR REPLACE FUNCTION idemq._grant_roles()
RETURNS TABLE(role text, privilege text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_fn regprocedure;
  v_name text;
  v_role text;
  v_constants text[] := ARRAY['active_states', 'terminal_states'];
  v_producer text[] := ARRAY['enqueue', 'enqueue_many'];
  v_worker text[] := ARRAY['claim', 'complete', 'complete_many', 'fail', 'heartbeat', 'snooze',
                           'guard', 'effect_claim', 'effect_done', 'effect_release', 'rescue',
                           'wait_for_jobs', 'stop_waiting', 'prune_keys', 'tick'];
BEGIN
  FOR v_fn IN
    SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
  END LOOP;
  FOREACH v_role IN ARRAY ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'] LOOP
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    EXECUTE format('GRANT USAGE ON SCHEMA idemq TO %I', v_role);
    role := v_role;
    privilege := 'USAGE ON SCHEMA idemq';
    RETURN NEXT;
    FOR v_fn, v_name IN
      SELECT p.oid::regprocedure, p.proname FROM pg_proc p
      WHERE p.pronamespace = 'idemq'::regnamespace AND left(p.proname, 1) <> '_'
      ORDER BY p.proname
    LOOP
      CONTINUE WHEN NOT (v_name = ANY (v_constants)
                         OR (v_role = 'idemq_producer' AND v_name = ANY (v_producer))
                         OR (v_role = 'idemq_worker' AND v_name = ANY (v_worker))
                         OR v_role = 'idemq_admin');
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
      privilege := format('EXECUTE ON FUNCTION %s', v_fn);
      RETURN NEXT;
    END LOOP;
    IF v_role = 'idemq_admin' THEN
      EXECUTE 'GRANT SELECT ON ALL TABLES IN SCHEMA idemq TO idemq_admin';
      privilege := 'SELECT ON ALL TABLES IN SCHEMA idemq';
      RETURN NEXT;
      -- The limits are the admin's to change (their ranges are CHECKed).
      IF to_regclass('idemq.settings') IS NOT NULL THEN
        EXECUTE 'GRANT UPDATE (value) ON idemq.settings TO idemq_admin';
        privilege := 'UPDATE (value) ON idemq.settings';
        RETURN NEXT;
      END IF;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._grant_roles() IS
  'Grant idemq_producer, idemq_worker and idemq_admin (those that exist) what their names say, PUBLIC nothing; returns what it granted.';

-- ---- sql/functions/_cron_next.sql ----
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

-- ---- sql/functions/_cron_parse.sql ----
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

-- ---- sql/functions/_cron_latest.sql ----
-- idemq._cron_latest(spec jsonb, timezone text, lo timestamptz, hi timestamptz, n int) RETURNS timestamptz[]
--
-- The latest n slots of a parsed cron expression in [lo, hi], oldest first.
--
-- Guarantees:
--   * Exactly the slots s with lo <= s <= hi, the latest n of them, in order.
--   * Looks back from hi in windows that grow eightfold (1 minute, 8
--     minutes, ...) until it has n slots or reaches lo, so a long downtime
--     (lo far back) costs about as much as the slots it returns, not a walk
--     over every slot since lo.
-- Concurrency: none (stable).
-- Errors: none.
-- Tests: test/sql/schedules-tick.test.ts
CREATE OR REPLACE FUNCTION idemq._cron_latest(spec jsonb, timezone text, lo timestamptz, hi timestamptz, n int)
RETURNS timestamptz[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_width interval := interval '1 minute';
  v_from timestamptz;
  v_slot timestamptz;
  v_slots timestamptz[];
BEGIN
  IF _cron_latest.n < 1 OR _cron_latest.lo > _cron_latest.hi THEN
    RETURN '{}';
  END IF;
  LOOP
    v_from := greatest(_cron_latest.lo, _cron_latest.hi - v_width);
    v_slots := '{}';
    v_slot := idemq._cron_next(_cron_latest.spec, _cron_latest.timezone, v_from - interval '1 microsecond');
    WHILE v_slot IS NOT NULL AND v_slot <= _cron_latest.hi LOOP
      v_slots := v_slots || v_slot;
      IF cardinality(v_slots) > _cron_latest.n THEN
        v_slots := v_slots[2:];
      END IF;
      v_slot := idemq._cron_next(_cron_latest.spec, _cron_latest.timezone, v_slot);
    END LOOP;
    EXIT WHEN cardinality(v_slots) >= _cron_latest.n OR v_from = _cron_latest.lo;
    v_width := v_width * 8;
  END LOOP;
  RETURN v_slots;
END;
$$;

COMMENT ON FUNCTION idemq._cron_latest(jsonb, text, timestamptz, timestamptz, int) IS
  'The latest n slots of a parsed cron expression between two instants, oldest first.';

-- ---- sql/functions/_tick.sql ----
-- idemq._tick(at timestamptz) RETURNS int
--
-- tick() on a given clock: enqueues the due slots of every schedule whose
-- next_at is at or before `at`. Returns how many jobs it created. (Tests pass
-- a clock; everything else calls tick(), which passes now().)
--
-- Guarantees:
--   * A slot is late by at - slot. Slots late by less than the schedule's
--     misfire_grace are on time and each gets a run. Older due slots were
--     missed (the ticks stopped): misfire `once` gives the latest missed slot
--     one run when no slot is on time (one run stands for all of them),
--     `skip` gives them none, `all` runs each of them. At most 100 slots run
--     per schedule and call, the latest ones; older ones are dropped.
--   * A slot's job is enqueued with idempotency key
--     schedule:<name>:<slot instant in UTC, YYYY-MM-DDTHH:MI:SSZ> and
--     duplicate_policy reject_always, so a slot never gets a second job,
--     whoever replays it: a slot whose key is taken (IQ409, IQ422) or held by
--     an active job (deduplicated) creates nothing.
--   * Overlap, per slot, against the schedule's latest job (last_job_id):
--     while it is active, `skip` drops the slot and adds 1 to `skipped`;
--     `allow` runs it anyway; `queue_one` enqueues it after the latest job
--     (enqueue ... after: it waits, awaiting, until that job succeeded, and
--     is cancelled if it does not) when the latest job is processing, and
--     drops and counts it when the latest job has not started yet (that one
--     is the waiting run).
--   * Afterwards next_at is the first slot after `at`, last_slot_at the
--     latest slot run, last_job_id that slot's job.
-- Concurrency: locks each due schedule row FOR UPDATE SKIP LOCKED and holds
--   it to commit: a concurrent tick skips a schedule another is handling,
--   and once that one commits the row's next_at is past `at`. So any number
--   of callers need no leader, and a slot gets exactly one job (the key makes
--   that hold even when next_at is moved back). schedule()/unschedule() of a
--   schedule being ticked wait for the tick's commit.
-- Errors: those of enqueue() other than IQ409/IQ422 (e.g. a queue a later
--   validation refuses) abort the call.
-- Tests: test/sql/schedules-tick.test.ts, test/sql/schedules-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._tick(at timestamptz)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_created int := 0;
  v_s record;
  v_spec jsonb;
  v_on_time timestamptz[];
  v_missed timestamptz[];
  v_slot timestamptz;
  v_last_job bigint;
  v_last_slot timestamptz;
  v_last_state idemq.job_state;
  v_skipped int;
  v_after bigint[];
  v_job bigint;
  v_deduplicated boolean;
BEGIN
  FOR v_s IN
    SELECT s.name, s.cron, s.timezone, s.task, s.payload, s.queue, s.priority, s.max_attempts,
           s.overlap, s.misfire, s.misfire_grace, s.next_at, s.last_job_id, s.last_slot_at
    FROM idemq.schedules s
    WHERE s.next_at <= _tick.at
    ORDER BY s.next_at, s.name
    FOR UPDATE SKIP LOCKED
  LOOP
    v_spec := idemq._cron_parse(v_s.cron);
    v_on_time := idemq._cron_latest(v_spec, v_s.timezone,
                                    greatest(v_s.next_at, _tick.at - v_s.misfire_grace + interval '1 microsecond'),
                                    _tick.at, 100);
    v_missed := '{}';
    IF v_s.next_at <= _tick.at - v_s.misfire_grace THEN
      IF v_s.misfire = 'all' THEN
        v_missed := idemq._cron_latest(v_spec, v_s.timezone, v_s.next_at, _tick.at - v_s.misfire_grace,
                                       100 - cardinality(v_on_time));
      ELSIF v_s.misfire = 'once' AND cardinality(v_on_time) = 0 THEN
        v_missed := idemq._cron_latest(v_spec, v_s.timezone, v_s.next_at, _tick.at - v_s.misfire_grace, 1);
      END IF;
    END IF;

    v_last_job := v_s.last_job_id;
    v_last_slot := v_s.last_slot_at;
    v_skipped := 0;
    FOREACH v_slot IN ARRAY v_missed || v_on_time LOOP
      v_after := NULL;
      IF v_s.overlap <> 'allow' THEN
        SELECT j.state INTO v_last_state FROM idemq.jobs j WHERE j.id = v_last_job;
        IF v_last_state = ANY (idemq.active_states()) THEN
          IF v_s.overlap = 'skip' OR v_last_state <> 'processing' THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
          END IF;
          v_after := ARRAY[v_last_job];
        END IF;
      END IF;
      BEGIN
        SELECT e.job_id, e.deduplicated INTO v_job, v_deduplicated
        FROM idemq.enqueue(
          task => v_s.task, payload => v_s.payload, queue => v_s.queue, priority => v_s.priority,
          max_attempts => v_s.max_attempts,
          idempotency_key => format('schedule:%s:%s', v_s.name,
                                    to_char(v_slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
          duplicate_policy => 'reject_always', after => v_after) e;
      EXCEPTION WHEN SQLSTATE 'IQ409' OR SQLSTATE 'IQ422' THEN
        -- The slot's key was used already: the slot ran (or was replayed) before.
        CONTINUE;
      END;
      IF NOT v_deduplicated THEN
        v_created := v_created + 1;
      END IF;
      v_last_job := v_job;
      v_last_slot := v_slot;
    END LOOP;

    UPDATE idemq.schedules AS s
    SET next_at = coalesce(idemq._cron_next(v_spec, v_s.timezone, _tick.at), 'infinity'),
        last_slot_at = v_last_slot,
        last_job_id = v_last_job,
        skipped = s.skipped + v_skipped
    WHERE s.name = v_s.name;
  END LOOP;
  RETURN v_created;
END;
$$;

COMMENT ON FUNCTION idemq._tick(timestamptz) IS
  'tick() on a given clock: enqueue each due slot of every due schedule once, by its overlap and misfire policies.';

-- ---- sql/functions/schedule.sql ----
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
--     Counters and the last job are kept.
--   * payload, queue, priority and max_attempts left NULL take enqueue()'s
--     defaults (idemq._job_defaults()), stored with the schedule.
--   * cron: see _cron_parse (5 or 6 fields, names, steps, @macros, @every);
--     timezone: an IANA name; slots are local times there (see _cron_instant
--     for DST). overlap and misfire: see _tick.
--   * Every argument is checked before anything is written: an error leaves
--     the schedules table as it was.
-- Concurrency: the upsert locks the schedule row; it waits for a tick() that
--   holds it, and a tick after it sees the new definition.
-- Errors: 22004 a required argument is NULL; 22023 a bad cron (naming the
--   field, e.g. cron field 2 (hour) "25" is out of range 0-23), an unknown
--   time zone, an empty name or task, a name over 200 characters, a payload
--   that is not an object, a bad queue, max_attempts < 1, misfire_grace
--   outside 1 second..1 day; each with a HINT.
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
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('schedule: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
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
  RETURNING s.next_at INTO v_next;
  RETURN v_next;
END;
$$;

COMMENT ON FUNCTION idemq.schedule(text, text, text, jsonb, text, text, idemq.schedule_overlap, idemq.schedule_misfire, interval, int, int) IS
  'Create or replace a recurring schedule (cron, time zone, overlap and misfire policies); returns its next slot.';

-- ---- sql/functions/schedule_next.sql ----
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

-- ---- sql/functions/schedules.sql ----
-- idemq.schedules()
--   RETURNS TABLE(name text, cron text, timezone text, task text, queue text, payload jsonb,
--   priority int, max_attempts int, overlap idemq.schedule_overlap, misfire idemq.schedule_misfire,
--   misfire_grace interval, next_at timestamptz, last_slot_at timestamptz, last_job_id bigint,
--   last_job_state idemq.job_state, skipped bigint, created_at timestamptz, updated_at timestamptz)
--
-- Lists the schedules, by name, with the state of each one's latest job
-- (filter with WHERE name = ...).
--
-- Guarantees: one row per schedule; last_job_state is NULL when the schedule
--   has run no job yet or its job was purged; skipped counts the slots the
--   overlap policy dropped.
-- Concurrency: a plain read (no locks).
-- Errors: none.
-- Tests: test/sql/schedules.test.ts, test/sql/schedules-tick.test.ts
CREATE OR REPLACE FUNCTION idemq.schedules()
RETURNS TABLE(name text, cron text, timezone text, task text, queue text, payload jsonb,
              priority int, max_attempts int, overlap idemq.schedule_overlap, misfire idemq.schedule_misfire,
              misfire_grace interval, next_at timestamptz, last_slot_at timestamptz, last_job_id bigint,
              last_job_state idemq.job_state, skipped bigint, created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT s.name, s.cron, s.timezone, s.task, s.queue, s.payload, s.priority, s.max_attempts, s.overlap,
         s.misfire, s.misfire_grace, s.next_at, s.last_slot_at, s.last_job_id, j.state, s.skipped,
         s.created_at, s.updated_at
  FROM idemq.schedules s
  LEFT JOIN idemq.jobs j ON j.id = s.last_job_id
  ORDER BY s.name;
$$;

COMMENT ON FUNCTION idemq.schedules() IS
  'List the recurring schedules, with the state of each one''s latest job.';

-- ---- sql/functions/tick.sql ----
-- idemq.tick() RETURNS int
--
-- Enqueues every due slot of every schedule once (see _tick for the
-- overlap and misfire rules), on the database clock. Returns how many jobs
-- it created.
--
-- Guarantees:
--   * Each slot gets at most one job, with idempotency key
--     schedule:<name>:<slot instant in UTC, YYYY-MM-DDTHH:MI:SSZ>.
--   * Idempotent: any number of workers, or pg_cron, may call it at any
--     time; no leader is needed. Call it more often than misfire_grace
--     (default 1 minute), or on-time slots count as missed.
-- Concurrency: schedule rows are locked FOR UPDATE SKIP LOCKED until
--   commit: concurrent callers split the due schedules between them, and a
--   slot gets exactly one job however many call at once.
-- Errors: none of its own (see _tick).
-- Tests: test/sql/schedules-tick.test.ts, test/sql/schedules-concurrency.test.ts,
--   test/worker/ticker.test.ts
CREATE OR REPLACE FUNCTION idemq.tick()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN idemq._tick(now());
END;
$$;

COMMENT ON FUNCTION idemq.tick() IS
  'Enqueue every due schedule slot once; safe to call from any number of workers or pg_cron.';

-- ---- sql/functions/unschedule.sql ----
-- idemq.unschedule(name text) RETURNS boolean
--
-- Removes the schedule `name`. Returns whether it existed.
--
-- Guarantees: no slot of it is enqueued afterwards; jobs it already
--   enqueued stay (cancel them if they should not run). Removing a name that
--   does not exist returns false and changes nothing.
-- Concurrency: waits for a tick() that holds the schedule row.
-- Errors: 22004 name is NULL.
-- Tests: test/sql/schedules.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.unschedule(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_found boolean;
BEGIN
  IF unschedule.name IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'unschedule: name must not be NULL',
      HINT = 'Pass the name the schedule was created with; idemq.schedules() lists them.';
  END IF;
  DELETE FROM idemq.schedules AS s WHERE s.name = unschedule.name;
  GET DIAGNOSTICS v_found = ROW_COUNT;
  RETURN v_found;
END;
$$;

COMMENT ON FUNCTION idemq.unschedule(text) IS
  'Remove a recurring schedule; jobs it already enqueued stay.';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._check_timezone FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._cron_field FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._cron_instant FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._cron_latest FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._cron_next FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._cron_parse FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._tick FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- sql/functions/_grant_roles.sql as of 0007_limits
-- idemq._grant_roles() RETURNS TABLE(role text, privilege text)
--
-- Gives the idemq group roles that exist what their names say and nothing
-- more, and PUBLIC nothing; returns each privilege it granted. The one
-- definition of who may call what (docs/design.md, "Roles").
--
-- Guarantees:
--   * PUBLIC has EXECUTE on no function of idemq, public or private.
--   * idemq_producer: enqueue, enqueue_many. idemq_worker: claim, complete,
--     complete_many, fail, heartbeat, snooze, guard, effect_claim,
--     effect_done, effect_release, rescue, wait_for_jobs, stop_waiting,
--     prune_keys. idemq_admin: every public function, SELECT on the
--     tables of idemq (reading jobs), and UPDATE of idemq.settings.value
--     (the limits). All three: USAGE on schema idemq and the
--     constants active_states() and terminal_states().
--   * No other table privilege: the public functions are SECURITY DEFINER
--     (owned by the schema owner, search_path pinned), so a role needs only
--     EXECUTE; a worker reads payloads only through claim().
--   * A role that does not exist is skipped (`idemq roles sql` prints the
--     script a DBA runs to create the roles and call this again); running it
--     again grants the same and changes nothing.
-- Concurrency: GRANT updates the functions' catalog rows; migrations run it
--   under node-pg-migrate's lock, one per database.
-- Errors: 42501 when the caller neither owns the functions nor is a superuser.
-- Tests: test/sql/roles.test.ts, test/install/non-superuser.test.ts
CREATE OR REPLACE FUNCTION idemq._grant_roles()
RETURNS TABLE(role text, privilege text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_fn regprocedure;
  v_name text;
  v_role text;
  v_constants text[] := ARRAY['active_states', 'terminal_states'];
  v_producer text[] := ARRAY['enqueue', 'enqueue_many'];
  v_worker text[] := ARRAY['claim', 'complete', 'complete_many', 'fail', 'heartbeat', 'snooze',
                           'guard', 'effect_claim', 'effect_done', 'effect_release', 'rescue',
                           'wait_for_jobs', 'stop_waiting', 'prune_keys'];
BEGIN
  FOR v_fn IN
    SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
  END LOOP;
  FOREACH v_role IN ARRAY ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'] LOOP
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    EXECUTE format('GRANT USAGE ON SCHEMA idemq TO %I', v_role);
    role := v_role;
    privilege := 'USAGE ON SCHEMA idemq';
    RETURN NEXT;
    FOR v_fn, v_name IN
      SELECT p.oid::regprocedure, p.proname FROM pg_proc p
      WHERE p.pronamespace = 'idemq'::regnamespace AND left(p.proname, 1) <> '_'
      ORDER BY p.proname
    LOOP
      CONTINUE WHEN NOT (v_name = ANY (v_constants)
                         OR (v_role = 'idemq_producer' AND v_name = ANY (v_producer))
                         OR (v_role = 'idemq_worker' AND v_name = ANY (v_worker))
                         OR v_role = 'idemq_admin');
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
      privilege := format('EXECUTE ON FUNCTION %s', v_fn);
      RETURN NEXT;
    END LOOP;
    IF v_role = 'idemq_admin' THEN
      EXECUTE 'GRANT SELECT ON ALL TABLES IN SCHEMA idemq TO idemq_admin';
      privilege := 'SELECT ON ALL TABLES IN SCHEMA idemq';
      RETURN NEXT;
      -- The limits are the admin's to change (their ranges are CHECKed).
      IF to_regclass('idemq.settings') IS NOT NULL THEN
        EXECUTE 'GRANT UPDATE (value) ON idemq.settings TO idemq_admin';
        privilege := 'UPDATE (value) ON idemq.settings';
        RETURN NEXT;
      END IF;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._grant_roles() IS
  'Grant idemq_producer, idemq_worker and idemq_admin (those that exist) what their names say, PUBLIC nothing; returns what it granted.';

DROP FUNCTION idemq.unschedule;
DROP FUNCTION idemq.tick;
DROP FUNCTION idemq.schedules;
DROP FUNCTION idemq.schedule_next;
DROP FUNCTION idemq.schedule;
DROP FUNCTION idemq._tick;
DROP FUNCTION idemq._cron_latest;
DROP FUNCTION idemq._cron_parse;
DROP FUNCTION idemq._cron_next;
DROP FUNCTION idemq._cron_instant;
DROP FUNCTION idemq._cron_field;
DROP FUNCTION idemq._check_timezone;

-- Hand-written reversal of the schema changes above goes here, after the functions.

DROP TABLE idemq.schedules;
DROP TYPE idemq.schedule_misfire;
DROP TYPE idemq.schedule_overlap;
