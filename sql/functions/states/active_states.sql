-- idemq.active_states() RETURNS idemq.job_state[]
--
-- The states of a job that has not finished: scheduled, enqueued, processing, awaiting.
--
-- Guarantees: with terminal_states() it partitions idemq.job_state (checked by
--   test/contract/contract.test.ts, as are the literal lists in constraints and partial
--   index predicates, which the planner needs spelled out).
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq.active_states()
RETURNS idemq.job_state[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY['scheduled', 'enqueued', 'processing', 'awaiting']::idemq.job_state[];

COMMENT ON FUNCTION idemq.active_states() IS
  'States of jobs that have not finished (an idempotency key is held while its job is in one).';
