-- idemq._raise_bad_names(operation text, what text, names text[], null_means text, hint text,
--   max_length int DEFAULT NULL) RETURNS void
--
-- Raises 22023 for a list of queue or task names (`what`: 'queues' or
-- 'tasks') that `operation` refuses: callers test the list with _names_valid
-- (and worker_seen the length of queue names as well) and call this only
-- when it fails, so a valid call costs no function call.
--
-- Guarantees: always raises; the one wording of the error: the message names
--   `operation`, the function the user called, says what NULL stands for
--   (`null_means`, e.g. 'all queues'), the longest name with max_length, and
--   quotes an excerpt (_excerpt) of the list; `hint` is its HINT.
-- Concurrency: none.
-- Errors: always 22023.
-- Tests: test/sql/bad-input.test.ts, test/sql/workers.test.ts, test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_bad_names(operation text, what text, names text[], null_means text, hint text,
                                                  max_length int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22023',
    -- left(what, -1): 'queues' -> 'queue names'.
    MESSAGE = format('%s: %s must be NULL (%s) or a non-empty list of %s names%s, not %s',
                     operation, what, null_means, left(what, -1),
                     CASE WHEN max_length IS NOT NULL THEN format(' of 1 to %s characters', max_length) END,
                     idemq._excerpt(names::text)),
    HINT = hint;
END;
$$;

COMMENT ON FUNCTION idemq._raise_bad_names(text, text, text[], text, text, int) IS
  'Raise 22023 for a queue or task filter that is neither NULL nor a non-empty list of non-empty names.';
