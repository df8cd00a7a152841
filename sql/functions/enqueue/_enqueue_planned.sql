-- idemq._enqueue_planned(jobs idemq._planned_job[], keyed boolean, parents boolean,
--   as_children boolean DEFAULT false) RETURNS idemq._planned_job[]
--
-- The pipeline shared by enqueue and enqueue_many (and spawn and
-- enqueue_batch), after parse and check: resolve keys (_resolve_keys), lock
-- parents (_lock_parents), insert (_insert_jobs). Returns the plan with
-- every element decided. `keyed`: some element has an idempotency key;
-- `parents`: some element names parents in `after` (from _parse_jobs, or
-- enqueue's arguments); without them the steps that would find nothing to
-- do are skipped. `as_children`: the created jobs are written with
-- has_children (_insert_jobs), as the children of spawn and enqueue_batch
-- must be.
--
-- Guarantees: those of its parts. The input is checked (_job_problem and
--   _backoff_problem passed), in ordinal order, with planned ids; the output
--   has one element per input element, in the same order, outcome one of created,
--   deduplicated, rejected, conflict. Rejections and conflicts do not raise
--   here (enqueue raises them).
-- Concurrency: see _resolve_keys (key rows in key order) and _lock_parents
--   (parents in id order).
-- Errors: IQ404 a parent in `after` does not exist; 40001 keys kept
--   changing under the call.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/enqueue-policies.test.ts, test/sql/enqueue-concurrency.test.ts,
--   test/sql/continuations.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_planned(jobs idemq._planned_job[], keyed boolean, parents boolean,
                                                  as_children boolean DEFAULT false)
RETURNS idemq._planned_job[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans: with a custom plan (the first five calls of a session, and
-- after them whenever its estimate wins) each statement that reads the
-- jobs array took the whole array into its plan as a constant, copied it
-- and planned around it at every call, a cost per job of the array
-- (measured: bench/FINDINGS.md, "Why the SQL is written as it is").
-- enqueue_many, _parse_jobs and _insert_jobs are set the same way, for the
-- same reason.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_planned idemq._planned_job[] := CASE WHEN keyed THEN idemq._resolve_keys(jobs) ELSE jobs END;
BEGIN
  IF parents THEN
    PERFORM idemq._lock_parents(v_planned);
  END IF;
  PERFORM idemq._insert_jobs(v_planned, keyed, parents, _enqueue_planned.as_children);
  RETURN v_planned;
END;
$$;

COMMENT ON FUNCTION idemq._enqueue_planned(idemq._planned_job[], boolean, boolean, boolean) IS
  'Resolve keys, lock parents and insert a checked plan of jobs: the pipeline enqueue and enqueue_many share.';
