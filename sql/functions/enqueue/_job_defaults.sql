-- idemq._job_defaults() RETURNS jsonb
--
-- The defaults of a job's optional fields in an enqueue_many element.
--
-- Guarantees: the same values as the DEFAULTs in enqueue()'s signature
--   (test/contract/contract.test.ts compares them), so a job means the same thing
--   whichever function enqueued it.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq._job_defaults()
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{"payload": {}, "queue": "default", "priority": 0, "max_attempts": 10,
         "duplicate_policy": "allow_after_failed", "key_retention": "14 days"}'::jsonb;

COMMENT ON FUNCTION idemq._job_defaults() IS
  'Defaults of optional job fields for enqueue_many; equal to enqueue()''s DEFAULTs.';
