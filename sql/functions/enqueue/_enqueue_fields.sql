-- idemq._enqueue_fields() RETURNS text[]
--
-- The fields of a job an enqueue asks for, in order: enqueue()'s parameters,
-- and the fields an enqueue_many element may have.
--
-- Guarantees: the attributes of idemq._planned_job after its four plan
--   fields (ordinal, job_id, outcome, existing_state), so the type is the one
--   list of enqueue fields; test/contract/contract.test.ts checks that they
--   equal enqueue()'s parameter names, in order.
-- Concurrency: none (reads the catalog).
-- Errors: none.
-- Tests: test/contract/contract.test.ts, test/sql/enqueue-many.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_fields()
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
RETURN ARRAY(SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = 'idemq._planned_job'::regclass AND a.attnum > 4 AND NOT a.attisdropped
             ORDER BY a.attnum);

COMMENT ON FUNCTION idemq._enqueue_fields() IS
  'The fields of a job to enqueue (enqueue()''s parameters, enqueue_many''s element fields): idemq._planned_job''s after its plan fields.';
