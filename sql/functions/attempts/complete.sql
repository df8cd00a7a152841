-- idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL,
--   lease_token uuid DEFAULT NULL) RETURNS void
--
-- Marks a job succeeded, fenced by (job_id, attempt, lease_token).
--
-- Guarantees:
--   * locked_by keeps the worker whose attempt succeeded (for the job's timeline).
--   * Succeeds only while that attempt holds the job (state processing,
--     same attempt, the lease_token claim() returned with it); otherwise
--     raises IQ410 and changes nothing. Another worker that guesses the
--     attempt but lacks the token gets IQ410 too. lease_token NULL matches
--     only a job claimed without one (by claim() before 0.2.0, whose
--     holders pass none). Called in the
--     transaction that wrote the job's effect, a lost lease rolls the effect
--     back with it: a stale worker can never commit.
--   * Holding includes a lease that ran out but was not yet rescued.
--   * The job's idempotency key is marked finished (the policy now applies)
--     and jobs waiting on it (after) are released when all their parents succeeded.
--   * Retention 0 (the succeeded retention of the job's task, queue or the
--     default is 0, see apply_retention): the job row is deleted by the
--     completing statement itself (its result is not kept), and the key
--     ledger records the success, so the duplicate policy still applies to
--     its key. A job that has children is kept instead (its trigger releases
--     them) and apply_retention deletes it on its next pass.
--     Retention is read once per call (_success_retention).
-- Concurrency: row lock on the job; a concurrent rescue() or cancel() either
--   commits first (then this raises IQ410) or waits for this transaction.
-- Errors: IQ404 no such job; IQ410 lease lost (DETAIL {"job_id","attempt",
--   "current_state"}; no token in it); 22004 NULL job_id/attempt; 22023 a
--   result over _result_limit() bytes of JSON text (nothing written).
-- Tests: test/sql/complete.test.ts, test/sql/fencing.test.ts, test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL,
                                          lease_token uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_r record;
  v_gone int;
BEGIN
  -- Checked before anything is written: the job stays held, and the caller
  -- may complete it again with less.
  PERFORM idemq._check_result('complete', format('job %s: the result', complete.job_id), complete.result,
    'Keep bulky data in a table of your own and return its key; nothing was written, so complete the job again with less.');
  SELECT * INTO v_r FROM idemq._success_retention() z;
  IF v_r.any_zero THEN
    -- Retention 0: delete instead of update. _on_job_finished (AFTER UPDATE)
    -- does not fire for a DELETE, so the ledger write it makes for a
    -- succeeded key is made here; a job with children takes the UPDATE below.
    WITH gone AS (
      DELETE FROM idemq.jobs AS j
      WHERE j.id = complete.job_id AND j.attempt = complete.attempt
        AND j.lease_token IS NOT DISTINCT FROM complete.lease_token
        AND idemq._held(j.lease_expires_at, j.locked_by)
        AND NOT j.has_children
        AND idemq._gone_on_success(j.task, j.queue, v_r.default_zero, v_r.zero_tasks, v_r.kept_tasks,
                                   v_r.zero_queues, v_r.kept_queues)
      RETURNING j.id, j.idempotency_key
    ), ledger AS (
      UPDATE idemq.keys AS k SET finished_state = 'succeeded', finished_at = now()
      FROM gone g WHERE k.key = g.idempotency_key AND k.job_id = g.id
    )
    SELECT count(*) INTO v_gone FROM gone;
    IF v_gone = 1 THEN
      RETURN;
    END IF;
  END IF;

  UPDATE idemq.jobs AS j
  SET state = 'succeeded', result = complete.result, finished_at = now(),
      lease_expires_at = NULL
  WHERE j.id = complete.job_id AND j.attempt = complete.attempt
    AND j.lease_token IS NOT DISTINCT FROM complete.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by);
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(complete.job_id, complete.attempt, 'complete');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.complete(bigint, int, jsonb, uuid) IS
  'Mark a job succeeded if attempt (with its lease token) still holds it; IQ410 (lease lost) otherwise, so the caller''s transaction rolls back.';
