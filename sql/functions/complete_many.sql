-- idemq.complete_many(job_ids bigint[], attempts int[]) RETURNS SETOF bigint
--
-- Marks many jobs succeeded in one statement; returns the ids it completed.
--
-- Guarantees:
--   * locked_by keeps the worker whose attempt succeeded (for the job's timeline).
--   * Pairs job_ids[i] with attempts[i]; completes each pair whose attempt
--     still holds its job, and skips the others (lease lost, unknown id)
--     without raising: for batched completion of jobs whose effects are
--     already committed (or idempotent). A caller that needs all-or-nothing
--     uses complete() in its transaction.
--   * Keys and continuations as complete().
-- Concurrency: updates the rows in id order (no deadlock between two batches).
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths or more than 10,000 ids.
-- Tests: test/complete.test.ts
CREATE OR REPLACE FUNCTION idemq.complete_many(job_ids bigint[], attempts int[])
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
BEGIN
  IF job_ids IS NULL OR attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'complete_many: job_ids and attempts must not be NULL',
      HINT = 'Pass two arrays of equal length: the ids and attempts claim() returned.';
  END IF;
  IF cardinality(job_ids) <> cardinality(attempts) OR cardinality(job_ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('complete_many: job_ids (%s) and attempts (%s) must have the same length, at most 10000',
                       cardinality(job_ids), cardinality(attempts)),
      HINT = 'attempts[i] is the attempt that claimed job_ids[i].';
  END IF;

  RETURN QUERY
  -- One UPDATE joined to the arrays: each pair is one primary-key probe, and
  -- the held-check sits in the UPDATE's own WHERE, so a row changed
  -- concurrently (rescue, cancel) is re-checked on its newest version and
  -- skipped if no longer held. No separate row lock first: that wrote a WAL
  -- record per job for nothing. "Held" is written as the lease columns, not
  -- "state = 'processing'", which matches the jobs_leases partial index: the
  -- planner then scanned every job in flight once per pair (seen in EXPLAIN).
  -- The sorted subquery keeps the nested loop in id order; a pair given twice
  -- updates its row once.
  UPDATE idemq.jobs AS j
  SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
  FROM (SELECT u.id, u.attempt FROM unnest(job_ids, attempts) AS u(id, attempt) ORDER BY u.id) AS t
  WHERE j.id = t.id AND j.attempt = t.attempt AND j.lease_expires_at IS NOT NULL AND j.locked_by IS NOT NULL
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.complete_many(bigint[], int[]) IS
  'Mark many (job_id, attempt) pairs succeeded; returns the ids completed, skipping lost leases.';
