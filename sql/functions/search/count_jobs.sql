-- idemq.count_jobs(filter jsonb DEFAULT '{}', action text DEFAULT NULL, at_most int DEFAULT 10000)
--   RETURNS TABLE(jobs int, exact boolean)
--
-- How many jobs a filter matches, counting no further than at_most: the
-- number a bulk action's confirmation states. With an action ('retry',
-- 'cancel', 'delete', 'run_now'), only the jobs that action would touch
-- (its states: _action_states), so the number is the one it will act on.
--
-- Guarantees:
--   * jobs is exact (exact true) when at most at_most match; otherwise
--     jobs = at_most and exact false. At most at_most + 1 rows are read
--     after the filter, so counting 1,000,000 costs what at_most allows.
--   * The same filter and the same query as find_jobs and the bulk actions
--     (_matching_jobs): what is counted is what they would see now. Jobs
--     may move on before an action; the action's result says how many it
--     touched.
-- Concurrency: a plain read; no locks.
-- Errors: 22004 NULL filter or at_most; 22023 a bad filter (the HINT names
--   the field), an unknown action, at_most outside 0..1000000.
-- Tests: test/sql/find-jobs.test.ts, test/sql/bulk-actions.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.count_jobs(filter jsonb DEFAULT '{}', action text DEFAULT NULL,
                                            at_most int DEFAULT 10000)
RETURNS TABLE(jobs int, exact boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_states idemq.job_state[];
  v_n int;
BEGIN
  IF at_most IS NULL OR at_most NOT BETWEEN 0 AND 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN at_most IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('count_jobs: at_most must be between 0 and 1000000, not %s', coalesce(at_most::text, 'NULL')),
      HINT = 'It bounds the rows a count reads: e.g. 10000, and "10,000+" when it is reached.';
  END IF;
  IF action IS NOT NULL THEN
    v_states := idemq._action_states('count_jobs', action);
  END IF;
  SELECT count(*) INTO v_n FROM idemq._matching_jobs('count_jobs', filter, v_states, NULL, at_most + 1);
  jobs := least(v_n, at_most);
  exact := v_n <= at_most;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.count_jobs(jsonb, text, int) IS
  'How many jobs a filter matches (those an action would touch, with action), counted up to at_most.';
