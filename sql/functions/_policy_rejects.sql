-- idemq._policy_rejects(policy idemq.duplicate_policy, finished_state idemq.job_state) RETURNS boolean
--
-- The duplicate-policy matrix: does `policy` refuse a new job for a key whose
-- latest job ended in `finished_state`?
--
-- Guarantees: the one definition of the matrix in docs/design.md:
--   allow_after_failed  -> never rejects
--   reject_if_failed    -> rejects after failed
--   reject_always       -> rejects after any terminal state
--   reject_if_succeeded -> rejects after succeeded (retry after a failure, never after a success)
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/enqueue-policies.test.ts
CREATE OR REPLACE FUNCTION idemq._policy_rejects(policy idemq.duplicate_policy, finished_state idemq.job_state)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE policy
  WHEN 'allow_after_failed' THEN false
  WHEN 'reject_if_failed' THEN finished_state = 'failed'
  WHEN 'reject_always' THEN true
  WHEN 'reject_if_succeeded' THEN finished_state = 'succeeded'
END;

COMMENT ON FUNCTION idemq._policy_rejects(idemq.duplicate_policy, idemq.job_state) IS
  'The duplicate-policy matrix: true when the policy refuses a new job after that terminal state.';
