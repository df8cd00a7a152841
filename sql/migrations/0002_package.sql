-- Migration 0002_package (issue 9): carries sql/functions/_policy_rejects.sql, whose
-- header now points at docs/design.md; the installed function does not change.
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ (npm run migration:check compares them). Once released (listed
-- in sql/released.sha256) this file never changes again.
-- Up Migration

-- Hand-written schema changes (tables, columns, indexes) go here, before the
-- functions that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes
-- in a migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration commits
-- on its own, so the next migration can use it.

-- ---- sql/functions/_policy_rejects.sql ----
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

-- Down Migration

-- sql/functions/_policy_rejects.sql as of 0001_init
-- idemq._policy_rejects(policy idemq.duplicate_policy, finished_state idemq.job_state) RETURNS boolean
--
-- The duplicate-policy matrix: does `policy` refuse a new job for a key whose
-- latest job ended in `finished_state`?
--
-- Guarantees: the one definition of the matrix in DESIGN.md:
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

-- Hand-written reversal of the schema changes above goes here, after the functions.
