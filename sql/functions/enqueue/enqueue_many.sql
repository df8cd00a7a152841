-- idemq.enqueue_many(jobs jsonb) RETURNS TABLE(ordinal int, job_id bigint, outcome text)
--
-- Adds many jobs in one statement: the fast path. `jobs` is a JSON array of
-- objects with enqueue()'s fields (task required; payload, queue, run_at,
-- priority, max_attempts, idempotency_key, duplicate_policy, backoff,
-- expires_at, after, key_retention, traceparent, concurrency_key, timeout
-- optional, with enqueue()'s defaults; timeout an interval string, e.g. "30
-- seconds").
--
-- Guarantees:
--   * One row per element, in order (`ordinal` is 1-based). outcome:
--     `created`; `deduplicated` (job_id: the active job holding the key);
--     `rejected` (the policy refused; job_id: the key's latest job);
--     `conflict` (the key is held by an active job for different work; job_id: that job).
--     Rejections and conflicts do not raise, and are counted in stats().
--   * Within one call the first element with a key decides; later elements
--     with the same key are deduplicated against the job the key then holds
--     (or `conflict`), or share the first element's rejection.
--   * All elements are validated before anything is written: one bad element
--     raises and nothing is enqueued.
--   * Set-based: a constant number of statements whatever the batch size.
--   * The pipeline: parse and check (_parse_jobs), then resolve keys, lock
--     parents and insert (_enqueue_planned), as enqueue() does.
--   * traceparent (per element): stored on a created job, as enqueue() does;
--     the result does not return the existing jobs' trace contexts.
--   * concurrency_key (per element): as enqueue(); the batch's jobs of one
--     key are admitted in the key's order (priority desc, run_at, id) up to
--     its room, the others wait (_insert_jobs, _key_promote).
-- Concurrency: as enqueue(); keys are taken in key order.
-- Errors: 22004 jobs is NULL; 22023 jobs is not an array, or an element is malformed (the message
--   names the element as jobs[N]); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue-many.test.ts, test/sql/bad-input.test.ts, test/sql/concurrency-keys.test.ts,
--   test/sql/timeout.test.ts
CREATE OR REPLACE FUNCTION idemq.enqueue_many(jobs jsonb)
RETURNS TABLE(ordinal int, job_id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the jobs array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_parsed record := idemq._parse_jobs(enqueue_many.jobs);
BEGIN
  RETURN QUERY
  SELECT p.ordinal, p.job_id, p.outcome
  FROM unnest(idemq._enqueue_planned(v_parsed.planned, v_parsed.keyed, v_parsed.parents)) p;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue_many(jsonb) IS
  'Add many jobs in one call; returns (ordinal, job_id, outcome) per element, never raising for duplicates.';
