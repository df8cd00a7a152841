-- idemq._error_entry(reported jsonb) RETURNS jsonb
--
-- The error a worker reports, as fail() stores it in the job's history: a
-- JSON object, cut to a bounded size so a failure can always be recorded.
--
-- Guarantees:
--   * An object stays an object; a JSON string becomes {"class": "Error",
--     "message": <the string>}; anything else gives NULL (the caller raises).
--   * "class" and "message" are cut to error_message_chars characters and
--     "stack" to error_stack_chars (idemq._limit); a value that is not a
--     string and is over its cap is replaced by its JSON text, cut.
--   * The other fields are kept while their JSON text totals at most
--     error_message_chars characters; otherwise they are dropped.
--   * Anything cut or dropped sets "truncated": true; an entry within every
--     cap is returned unchanged.
-- Concurrency: none.
-- Errors: none.
-- Tests: test/sql/limits.test.ts, test/sql/fail.test.ts
CREATE OR REPLACE FUNCTION idemq._error_entry(reported jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_entry jsonb;
  v_rest jsonb;
  v_field text;
  v_text text;
  v_cap bigint;
  v_cut boolean := false;
  v_message_chars constant bigint := idemq._limit('error_message_chars');
  v_stack_chars constant bigint := idemq._limit('error_stack_chars');
BEGIN
  v_entry := CASE jsonb_typeof(reported)
    WHEN 'object' THEN reported
    WHEN 'string' THEN jsonb_build_object('class', 'Error', 'message', reported #>> '{}')
  END;
  IF v_entry IS NULL THEN
    RETURN NULL;
  END IF;
  v_rest := v_entry - 'class' - 'message' - 'stack';
  IF v_rest <> '{}' AND length(v_rest::text) > v_message_chars THEN
    v_rest := '{}';
    v_cut := true;
  END IF;
  FOREACH v_field IN ARRAY ARRAY['class', 'message', 'stack'] LOOP
    CONTINUE WHEN NOT v_entry ? v_field;
    v_text := CASE WHEN jsonb_typeof(v_entry->v_field) = 'string' THEN v_entry->>v_field
                   ELSE (v_entry->v_field)::text END;
    v_cap := CASE WHEN v_field = 'stack' THEN v_stack_chars ELSE v_message_chars END;
    IF length(v_text) > v_cap THEN
      v_rest := v_rest || jsonb_build_object(v_field, left(v_text, v_cap::int));
      v_cut := true;
    ELSE
      v_rest := v_rest || jsonb_build_object(v_field, v_entry->v_field);
    END IF;
  END LOOP;
  IF v_cut THEN
    v_rest := v_rest || '{"truncated": true}';
  END IF;
  RETURN v_rest;
END;
$$;

COMMENT ON FUNCTION idemq._error_entry(jsonb) IS
  'An error as fail() stores it: an object with class, message and stack cut to their limits (truncated: true when cut).';
