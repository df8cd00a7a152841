-- idemq._initial_state(run_at timestamptz) RETURNS idemq.job_state
--
-- The state of a job that becomes runnable at `run_at`: a new job, a child
-- whose parents all succeeded, a rescheduled job.
--
-- Guarantees: scheduled when run_at is after now() (the transaction's
--   clock), else enqueued: a job due exactly now, or with a NULL run_at
--   (the default: now), is enqueued.
-- Concurrency: none (stable: reads now()).
-- Errors: none.
-- Tests: test/sql/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._initial_state(run_at timestamptz)
RETURNS idemq.job_state
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN run_at > now() THEN 'scheduled' ELSE 'enqueued' END::idemq.job_state;

COMMENT ON FUNCTION idemq._initial_state(timestamptz) IS
  'scheduled when run_at is after now(), else enqueued: the state of a job that becomes runnable at run_at.';
