-- idemq._result_limit() RETURNS int
--
-- The largest result a job keeps, in bytes of its JSON text: a job's
-- result (complete), a step's result and an event's payload (step_record,
-- emit).
--
-- Guarantees: 1048576 (1 MiB), the default payload limit: a ledger row is
--   read back by every later attempt of its job, and a job's result by every
--   job() and every parent reading its children, so they stay small.
--   src/contract.ts RESULT_BYTES mirrors it (test/sql/steps.test.ts
--   holds them equal). A constant function inlines.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/steps.test.ts, test/sql/complete.test.ts
CREATE OR REPLACE FUNCTION idemq._result_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1048576;

COMMENT ON FUNCTION idemq._result_limit() IS
  'The largest job result, step result or event payload, in bytes of its JSON text (1 MiB).';
