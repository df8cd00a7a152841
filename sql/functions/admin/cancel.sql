-- idemq.cancel(job_id bigint) RETURNS idemq.job_state
--
-- Cancels a job that has not finished. Returns its new state, `cancelled`.
--
-- Guarantees:
--   * Any active job can be cancelled. A job in processing is taken from its
--     worker: that attempt's complete/fail raise IQ410 and its heartbeat
--     reports it lost, so a transactional handler's writes roll back; its
--     errors record {"class": "Cancelled", ...} for that attempt.
--   * The key is marked finished (cancelled); awaiting children are cancelled.
-- Concurrency: row lock on the job (waits for a completing worker).
-- Errors: IQ404 no such job; IQ412 already finished (DETAIL {"job_id","state"}).
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.cancel(job_id bigint)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
BEGIN
  v_job := idemq._lock_job(cancel.job_id, 'cancel');
  IF v_job.state = ANY (idemq.terminal_states()) THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('cancel: job %s already finished (%s)', v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = 'Only scheduled, enqueued, processing or awaiting jobs can be cancelled.';
  END IF;
  -- A running attempt is cut short: its history says so, as a failure would.
  UPDATE idemq.jobs AS j
  SET state = 'cancelled', finished_at = now(), locked_by = NULL, lease_expires_at = NULL,
      errors = CASE WHEN j.state = 'processing'
                    THEN idemq._append_error(j.errors, jsonb_build_object(
                           'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(),
                           'worker', j.locked_by, 'class', 'Cancelled',
                           'message', 'cancelled by an operator while this attempt ran'))
                    ELSE j.errors END
  WHERE j.id = v_job.id;
  RETURN 'cancelled';
END;
$$;

COMMENT ON FUNCTION idemq.cancel(bigint) IS
  'Cancel an active job (a running attempt is fenced out); IQ412 if it already finished.';
