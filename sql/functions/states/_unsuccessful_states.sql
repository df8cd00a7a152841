-- idemq._unsuccessful_states() RETURNS idemq.job_state[]
--
-- The terminal states other than succeeded: failed, cancelled, expired.
--
-- Guarantees: terminal_states() minus succeeded (checked by
--   test/sql/predicates.test.ts). A job in one can be retried; a parent in one
--   cancels its children.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._unsuccessful_states()
RETURNS idemq.job_state[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY['failed', 'cancelled', 'expired']::idemq.job_state[];

COMMENT ON FUNCTION idemq._unsuccessful_states() IS
  'The terminal states other than succeeded (failed, cancelled, expired): retry() takes them, and a parent in one cancels its children.';
