-- idemq.retry(job_id bigint) RETURNS idemq.job_state
--
-- Runs a failed, cancelled or expired job again: back to `enqueued`, runnable
-- now, with fresh attempts. Returns `enqueued`, or `awaiting` for a job whose
-- concurrency key has no room (it waits for its key, as a new job would).
--
-- Guarantees:
--   * Fresh attempts: the attempts spent so far stop counting against
--     max_attempts; `attempt` itself keeps growing (it is the fencing token,
--     so a worker of the old run can never complete the new one).
--   * The error history is kept, and records the retry: an entry {"attempt"
--     (the last attempt before it), "class": "Retried", "message",
--     "previous_state", "finished_at" (when that run ended), "retried_at"},
--     so a job's timeline shows the operator's retry and what it undid (a
--     cancel included). An expired job's expires_at is cleared (so is any
--     expires_at already past).
--   * A keyed job takes its key again; if another active job holds the key,
--     IQ409. The key row keeps its retention (key_retention); one that
--     prune_keys released meanwhile comes back with the default retention
--     (_job_defaults: job rows do not store it). Waiting workers are
--     notified (_notify_waiting).
--   * A job with a concurrency key waits for its key again (awaiting) and is
--     admitted at once when the key has room (_key_promote, under the key's
--     lock, taken before the job's row lock: the order every path takes).
--   * An operator's override: a job cancelled because a parent (after) did
--     not succeed runs now, without waiting on that parent again.
-- Concurrency: the concurrency key's lock (_key_lock) when it has one, then
--   row locks on the job and its key row.
-- Errors: IQ404; IQ412 the job is active or succeeded (DETAIL {"job_id","state"});
--   IQ409 its key is held by another active job (DETAIL {"key","existing_job_id",
--   "existing_state","policy"}, policy null).
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts,
--   test/sql/retention.test.ts, test/sql/concurrency-keys.test.ts
CREATE OR REPLACE FUNCTION idemq.retry(job_id bigint)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
  v_holder record;
  v_state idemq.job_state;
BEGIN
  -- The concurrency key never changes: read it unlocked, lock the key first.
  PERFORM idemq._key_lock(ARRAY(SELECT j.concurrency_key FROM idemq.jobs j WHERE j.id = retry.job_id));
  v_job := idemq._lock_job(retry.job_id, 'retry');
  IF v_job.state <> ALL (idemq._unsuccessful_states()) THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('retry: job %s is %s; only failed, cancelled or expired jobs can be retried', v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = CASE WHEN v_job.state = 'succeeded' THEN 'A succeeded job''s effect happened; enqueue new work instead.'
                  ELSE 'The job has not finished; wait for it, or cancel it first.' END;
  END IF;

  IF v_job.idempotency_key IS NOT NULL THEN
    SELECT k.job_id, k.finished_state INTO v_holder
    FROM idemq.keys k WHERE k.key = v_job.idempotency_key FOR NO KEY UPDATE;
    IF FOUND AND v_holder.job_id <> v_job.id AND v_holder.finished_state IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'IQ409',
        MESSAGE = format('retry: idempotency key "%s" of job %s is held by active job %s',
                         idemq._excerpt(v_job.idempotency_key), v_job.id, v_holder.job_id),
        DETAIL = jsonb_build_object('key', v_job.idempotency_key, 'existing_job_id', v_holder.job_id,
                                    'existing_state', (SELECT j.state FROM idemq.jobs j WHERE j.id = v_holder.job_id),
                                    'policy', NULL)::text,
        HINT = format('Job %s already does this work; cancel it first to retry job %s.', v_holder.job_id, v_job.id);
    END IF;
    INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
    VALUES (v_job.idempotency_key, v_job.id, v_job.task, md5(v_job.payload::text),
            (idemq._job_defaults()->>'key_retention')::interval)
    ON CONFLICT ON CONSTRAINT keys_pkey DO UPDATE
      SET job_id = EXCLUDED.job_id, task = EXCLUDED.task, payload_md5 = EXCLUDED.payload_md5,
          finished_state = NULL, finished_at = NULL;
  END IF;

  IF v_job.concurrency_key IS NOT NULL THEN
    -- Parents it no longer waits for (the override) must not hold it.
    DELETE FROM idemq.job_dependencies AS d WHERE d.child_id = v_job.id;
  END IF;
  UPDATE idemq.jobs AS j
  SET state = CASE WHEN j.concurrency_key IS NULL THEN 'enqueued' ELSE 'awaiting' END::idemq.job_state, run_at = now(), finished_at = NULL, uncounted = j.attempt,
      errors = idemq._append_error(j.errors, jsonb_build_object(
        'attempt', j.attempt, 'class', 'Retried',
        'message', format('retried by an operator after the job was %s', j.state),
        'previous_state', j.state, 'finished_at', j.finished_at, 'retried_at', now())),
      expires_at = CASE WHEN j.state = 'expired' OR j.expires_at <= now() THEN NULL ELSE j.expires_at END
  WHERE j.id = v_job.id;
  IF v_job.concurrency_key IS NOT NULL THEN
    PERFORM idemq._key_promote(ARRAY[v_job.concurrency_key]);
    SELECT j.state INTO v_state FROM idemq.jobs j WHERE j.id = v_job.id;
    RETURN v_state;
  END IF;
  PERFORM idemq._notify_waiting(v_job.queue);
  RETURN 'enqueued';
END;
$$;

COMMENT ON FUNCTION idemq.retry(bigint) IS
  'Run a failed, cancelled or expired job again with fresh attempts; IQ409 if its key is held by another active job.';
