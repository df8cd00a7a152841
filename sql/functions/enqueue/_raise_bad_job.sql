-- idemq._raise_bad_job(problem text, ordinal int, hint text DEFAULT NULL) RETURNS void
--
-- Raises 22023 for a job an enqueue refuses: `problem` (from _job_problem,
-- _backoff_problem or _parse_jobs' decoding) names what is wrong; `ordinal`
-- names the element of enqueue_many's array (NULL: enqueue's arguments);
-- `hint` (from _job_problem) says how to fix it.
--
-- Guarantees: the one wording of a refused job: "jobs[N] <problem>" with a
--   HINT naming element N, or the bare problem for enqueue; the HINT starts
--   with `hint` when given and always says that nothing was enqueued (the
--   caller raises before it writes).
-- Concurrency: none.
-- Errors: always 22023.
-- Tests: test/sql/bad-input.test.ts, test/sql/enqueue-many.test.ts, test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_bad_job(problem text, ordinal int, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22023',
    MESSAGE = CASE WHEN ordinal IS NULL THEN problem ELSE format('jobs[%s] %s', ordinal, problem) END,
    HINT = coalesce(hint || ' ', '')
           || CASE WHEN ordinal IS NULL THEN 'Fix the argument; nothing was enqueued.'
                   ELSE format('Fix element %s (1-based) of the jobs array; nothing was enqueued.', ordinal) END;
END;
$$;

COMMENT ON FUNCTION idemq._raise_bad_job(text, int, text) IS
  'Raise 22023 for a refused job, naming jobs[N] for an enqueue_many element, with the fix; nothing was enqueued.';
