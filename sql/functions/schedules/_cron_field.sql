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
