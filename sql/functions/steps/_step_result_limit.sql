-- idemq._step_result_limit() RETURNS int
--
-- The largest step result (and event payload) a job's step ledger keeps, in
-- bytes of its JSON text.
--
-- Guarantees: 1048576 (1 MiB), the default payload limit: a ledger row is
--   read back by every later attempt of its job, so it stays small.
--   src/contract.ts STEP_RESULT_BYTES mirrors it (test/sql/steps.test.ts
--   holds them equal). A constant function inlines.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/steps.test.ts
CREATE OR REPLACE FUNCTION idemq._step_result_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1048576;

COMMENT ON FUNCTION idemq._step_result_limit() IS
  'The largest step result or event payload, in bytes of its JSON text (1 MiB).';
