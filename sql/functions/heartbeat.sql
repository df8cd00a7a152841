-- idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds')
--   RETURNS SETOF bigint
--
-- Extends the leases still held; returns the ids extended.
--
-- Guarantees:
--   * For each (job_ids[i], attempts[i]) still holding its job (processing,
--     same attempt), lease_expires_at = now() + lease. A job missing from the
--     answer was lost (rescued, cancelled, or taken by a newer attempt): its
--     handler should stop, and its complete() will raise IQ410.
--   * A lease that ran out but was not yet rescued is still held, and is extended.
-- Concurrency: locks rows in id order; SKIP LOCKED is not used, so a job
--   being completed or rescued concurrently is waited for, then judged on its
--   committed state.
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths; bad lease.
-- Tests: test/heartbeat.test.ts, test/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
BEGIN
  IF job_ids IS NULL OR attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'heartbeat: job_ids and attempts must not be NULL',
      HINT = 'Pass two arrays of equal length: the ids and attempts of the jobs this worker runs.';
  END IF;
  IF cardinality(job_ids) <> cardinality(attempts) OR cardinality(job_ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('heartbeat: job_ids (%s) and attempts (%s) must have the same length, at most 10000',
                       cardinality(job_ids), cardinality(attempts)),
      HINT = 'attempts[i] is the attempt that claimed job_ids[i].';
  END IF;
  PERFORM idemq._check_lease(lease, 'heartbeat');

  RETURN QUERY
  -- Driven from the arrays through LATERAL, so each pair is one primary-key
  -- probe. "Held" is written as the lease columns, not "state = 'processing'",
  -- which matches the jobs_leases partial index: the planner then scanned every
  -- job in flight once per pair (quadratic in the batch; seen in EXPLAIN).
  WITH held AS MATERIALIZED (
    SELECT h.id
    FROM (SELECT DISTINCT t.id, t.attempt FROM unnest(job_ids, attempts) AS t(id, attempt) ORDER BY t.id) t
    CROSS JOIN LATERAL (
      SELECT j.id FROM idemq.jobs j
      WHERE j.id = t.id AND j.attempt = t.attempt AND j.lease_expires_at IS NOT NULL AND j.locked_by IS NOT NULL
      FOR NO KEY UPDATE
    ) h
  )
  UPDATE idemq.jobs AS j
  SET lease_expires_at = now() + lease
  FROM held h
  WHERE j.id = h.id AND j.lease_expires_at IS NOT NULL AND j.locked_by IS NOT NULL
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.heartbeat(bigint[], int[], interval) IS
  'Extend the leases of (job_id, attempt) pairs still held; ids missing from the answer were lost.';
