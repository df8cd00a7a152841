-- idemq.terminal_states() RETURNS idemq.job_state[]
--
-- The states a job ends in: succeeded, failed, expired, cancelled.
--
-- Guarantees: with active_states() it partitions idemq.job_state; a job in one
--   of these has finished_at set and is never claimed again unless retry() is called.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq.terminal_states()
RETURNS idemq.job_state[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY['succeeded', 'failed', 'expired', 'cancelled']::idemq.job_state[];

COMMENT ON FUNCTION idemq.terminal_states() IS
  'States a job ends in; purge() defaults to these.';
