-- idemq._backoff_problem(backoff jsonb) RETURNS text
--
-- Says what is wrong with a backoff specification, or NULL when it is valid.
--
-- Guarantees: a backoff accepted here never makes _backoff_delay() fail.
--   Accepted: NULL (the default, polynomial); {"kind":"polynomial"};
--   {"kind":"exponential","initial":I,"factor":F,"max":M,"jitter":J} with I a
--   positive interval (required), F a number >= 1 (default 2), M a positive
--   interval (optional), J a number in [0, 1) (default 0);
--   {"kind":"fixed","delays":[D, ...]} with at least one non-negative interval.
--   Intervals are PostgreSQL interval text ("2 seconds", "5 min", "1h").
-- Concurrency: none.
-- Errors: none (the caller raises, naming the job).
-- Tests: test/sql/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq._backoff_problem(backoff jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_field text;
  v_interval interval;
  v_allowed text[];
BEGIN
  IF backoff IS NULL OR jsonb_typeof(backoff) = 'null' THEN
    RETURN NULL;
  END IF;
  IF jsonb_typeof(backoff) <> 'object' THEN
    RETURN format('backoff must be a JSON object like {"kind":"fixed","delays":["2 seconds"]}, not %s', idemq._excerpt(backoff::text));
  END IF;
  v_kind := backoff->>'kind';
  v_allowed := CASE v_kind
    WHEN 'polynomial' THEN ARRAY['kind']
    WHEN 'exponential' THEN ARRAY['kind', 'initial', 'factor', 'max', 'jitter']
    WHEN 'fixed' THEN ARRAY['kind', 'delays']
  END;
  IF v_allowed IS NULL THEN
    -- ::text first: a bare 'missing' would be read as jsonb and fail to parse.
    RETURN format('backoff kind must be "polynomial", "exponential" or "fixed", not %s',
                  idemq._excerpt(coalesce((backoff->'kind')::text, 'missing')));
  END IF;
  SELECT k INTO v_field FROM jsonb_object_keys(backoff) k WHERE k <> ALL (v_allowed) LIMIT 1;
  IF v_field IS NOT NULL THEN
    RETURN format('backoff kind "%s" has no field "%s" (fields: %s)', v_kind, idemq._excerpt(v_field), array_to_string(v_allowed, ', '));
  END IF;

  BEGIN
    IF v_kind = 'exponential' THEN
      IF jsonb_typeof(backoff->'initial') IS DISTINCT FROM 'string' THEN
        RETURN 'exponential backoff needs "initial", an interval such as "2 seconds"';
      END IF;
      v_interval := (backoff->>'initial')::interval;
      IF v_interval <= interval '0' THEN
        RETURN format('exponential backoff "initial" must be positive, not %s', idemq._excerpt((backoff->'initial')::text));
      END IF;
      IF backoff ? 'factor' AND (jsonb_typeof(backoff->'factor') <> 'number' OR (backoff->>'factor')::numeric < 1) THEN
        RETURN format('exponential backoff "factor" must be a number >= 1, not %s', idemq._excerpt((backoff->'factor')::text));
      END IF;
      IF backoff ? 'jitter' AND (jsonb_typeof(backoff->'jitter') <> 'number'
          OR (backoff->>'jitter')::numeric < 0 OR (backoff->>'jitter')::numeric >= 1) THEN
        RETURN format('exponential backoff "jitter" must be a number in [0, 1), not %s', idemq._excerpt((backoff->'jitter')::text));
      END IF;
      IF backoff ? 'max' THEN
        IF jsonb_typeof(backoff->'max') <> 'string' OR (backoff->>'max')::interval <= interval '0' THEN
          RETURN format('exponential backoff "max" must be a positive interval, not %s', idemq._excerpt((backoff->'max')::text));
        END IF;
      END IF;
    ELSIF v_kind = 'fixed' THEN
      IF jsonb_typeof(backoff->'delays') IS DISTINCT FROM 'array' OR jsonb_array_length(backoff->'delays') = 0 THEN
        RETURN 'fixed backoff needs "delays", a non-empty array of intervals such as ["2 seconds", "5 seconds"]';
      END IF;
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(backoff->'delays') d
                 WHERE jsonb_typeof(d) <> 'string' OR (d #>> '{}')::interval < interval '0') THEN
        RETURN format('fixed backoff "delays" must be non-negative intervals, not %s', idemq._excerpt((backoff->'delays')::text));
      END IF;
    END IF;
  EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
                 OR invalid_text_representation OR numeric_value_out_of_range THEN
    RETURN format('backoff %s has a value that is not an interval (%s); write intervals like "2 seconds" or "5 min"',
                  idemq._excerpt(backoff::text), idemq._excerpt(SQLERRM));
  END;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._backoff_problem(jsonb) IS
  'What is wrong with a backoff specification, or NULL when it is valid.';
