-- idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds',
--   lease_tokens uuid[] DEFAULT NULL) RETURNS SETOF bigint
--
-- Extends the leases still held; returns the ids extended.
--
-- Guarantees:
--   * For each (job_ids[i], attempts[i], lease_tokens[i]) still holding its
--     job (processing, same attempt, the lease token claim() returned with
--     it), lease_expires_at = now() + lease. A job missing from the answer
--     was lost (rescued, cancelled, or taken by a newer attempt): its
--     handler should stop, and its complete() will raise IQ410. Another
--     worker that guesses the attempt but lacks the token extends nothing.
--     A NULL token (lease_tokens NULL: all of them) matches only a job
--     claimed without one (before 0.2.0).
--   * A lease that ran out but was not yet rescued is still held, and is extended.
--   * A job's time limit (enqueue(..., timeout)) caps the lease: never past
--     locked_at + timeout (least(now() + lease, locked_at + timeout)). Once
--     that instant has passed the job is not extended and is missing from
--     the answer (its handler should stop: its attempt is over), so rescue()
--     takes it back when the capped lease runs out, as after a crash.
--   * An id given more than once counts once, with its highest attempt (and
--     that entry's token).
--   * Reads jobs by primary key only (cost follows the batch, not the table).
-- Concurrency: updates rows in id order; SKIP LOCKED is not used, so a job
--   being completed or rescued concurrently is waited for, then judged on its
--   committed state.
-- Errors: 22004 NULL job_ids or attempts; 22023 arrays of different lengths or more than 10,000
--   ids (both checked by _pairs_by_id); bad lease.
-- Tests: test/sql/heartbeat.test.ts, test/sql/fencing.test.ts, test/sql/timeout.test.ts,
--   test/sql/claim.test.ts (no sequential scan)
CREATE OR REPLACE FUNCTION idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds',
                                           lease_tokens uuid[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_attempts int[];
  v_tokens uuid[];
BEGIN
  -- As in complete_many: the pairs checked and sorted by id (_pairs_by_id),
  -- width_bucket() finding an id's attempt by binary search, and "id = ANY
  -- (ids)", a primary-key probe per job whatever the table holds (joined to
  -- the arrays, the planner hashed or scanned the whole table). The attempt
  -- and the held-check are re-checked on the newest row version.
  SELECT p.ids, p.attempts_by_id, p.tokens_by_id INTO v_ids, v_attempts, v_tokens
  FROM idemq._pairs_by_id(job_ids, attempts, lease_tokens, 'heartbeat',
                          'Pass arrays of equal length: the ids, attempts and lease tokens of the jobs this worker runs.') p;
  PERFORM idemq._check_lease(lease, 'heartbeat');

  RETURN QUERY
  UPDATE idemq.jobs AS j
  SET lease_expires_at = idemq._lease_until(j.locked_at, j.timeout, lease)
  WHERE j.id = ANY (v_ids)
    AND (j.timeout IS NULL OR j.locked_at + j.timeout > now())
    AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
    AND j.lease_token IS NOT DISTINCT FROM v_tokens[width_bucket(j.id, v_ids)]
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.heartbeat(bigint[], int[], interval, uuid[]) IS
  'Extend the leases of (job_id, attempt, lease_token) entries still held; ids missing from the answer were lost.';
