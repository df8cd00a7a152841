-- idemq._action_states(operation text, action text) RETURNS idemq.job_state[]
--
-- The states of the jobs a bulk action acts on, named by the sets its
-- single-job function checks: retry (retry(): _unsuccessful_states), cancel
-- (cancel(): active_states), delete (purge: terminal_states), run_now
-- (reschedule() to now: scheduled; an enqueued job already runs now, an
-- awaiting one waits for its parents or its key whatever its run_at).
--
-- Guarantees: count_jobs(action => ...) and the bulk actions read the same
--   set, so a confirmation counts the jobs the action will take.
-- Concurrency: none.
-- Errors: 22023 an unknown action (22004 NULL).
-- Tests: test/sql/bulk-actions.test.ts
CREATE OR REPLACE FUNCTION idemq._action_states(operation text, action text)
RETURNS idemq.job_state[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  CASE action
    WHEN 'retry' THEN RETURN idemq._unsuccessful_states();
    WHEN 'cancel' THEN RETURN idemq.active_states();
    WHEN 'delete' THEN RETURN idemq.terminal_states();
    WHEN 'run_now' THEN RETURN ARRAY['scheduled']::idemq.job_state[];
    ELSE
      RAISE EXCEPTION USING ERRCODE = CASE WHEN action IS NULL THEN '22004' ELSE '22023' END,
        MESSAGE = format('%s: action must be retry, cancel, delete or run_now, not %s', operation,
                         CASE WHEN action IS NULL THEN 'NULL' ELSE idemq._excerpt(action) END),
        HINT = 'Name the bulk action whose jobs to count, or leave action out to count every match.';
  END CASE;
END;
$$;

COMMENT ON FUNCTION idemq._action_states(text, text) IS
  'The states a bulk action (retry, cancel, delete, run_now) takes jobs in.';
