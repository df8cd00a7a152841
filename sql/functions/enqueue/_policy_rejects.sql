-- idemq._policy_rejects(policy idemq.duplicate_policy, finished_state idemq.job_state) RETURNS boolean
--
-- The duplicate-policy matrix: does `policy` refuse a new job for a key whose
-- latest job ended in `finished_state`?
--
-- Guarantees: the one definition of the matrix in docs/design.md, by the
--   state the key's latest job ended in:
--
--   | policy | succeeded | failed | expired / cancelled |
--   |---|---|---|---|
--   | `allow_after_failed` (default) | new job | new job | new job |
--   | `reject_if_failed` | new job | reject | new job |
--   | `reject_always` | reject | reject | reject |
--   | `reject_if_succeeded` | reject | new job | new job |
--
--   reject_if_succeeded retries after a failure, never after a success.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/enqueue-policies.test.ts
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
