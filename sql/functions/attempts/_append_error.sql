-- idemq._append_error(errors jsonb, entry jsonb) RETURNS jsonb
--
-- A job's error history with `entry` appended, keeping only the latest
-- error_history entries (idemq._limit): the history of a job with many
-- attempts stays bounded, so the next failure can always be recorded.
--
-- Guarantees: the result is the last error_history elements of
--   errors || [entry], in order (NULL errors counts as []). Every function
--   that appends to jobs.errors appends through this one.
-- Concurrency: none.
-- Errors: none.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._append_error(errors jsonb, entry jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_all jsonb := coalesce(errors, '[]') || jsonb_build_array(entry);
  v_keep constant bigint := idemq._limit('error_history');
  v_len int;
BEGIN
  v_len := jsonb_array_length(v_all);
  IF v_len <= v_keep THEN
    RETURN v_all;
  END IF;
  RETURN (SELECT jsonb_agg(e.value ORDER BY e.ordinality)
          FROM jsonb_array_elements(v_all) WITH ORDINALITY e
          WHERE e.ordinality > v_len - v_keep);
END;
$$;

COMMENT ON FUNCTION idemq._append_error(jsonb, jsonb) IS
  'A job''s error history with one entry appended, keeping the latest error_history entries.';
