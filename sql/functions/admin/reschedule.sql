-- idemq.reschedule(job_id bigint, run_at timestamptz) RETURNS idemq.job_state
--
-- Moves a job that waits to run to another time. Returns its new state:
-- `scheduled` (run_at in the future), `enqueued` (now or past), or `awaiting`
-- (unchanged: it also waits for its parents; run_at applies once they succeed).
--
-- Guarantees: attempts, errors and key are untouched.
-- Concurrency: row lock on the job.
-- Errors: IQ404; IQ412 the job is processing or finished (DETAIL {"job_id","state"});
--   22004 NULL run_at; 22023 run_at infinity or -infinity.
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.reschedule(job_id bigint, run_at timestamptz)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
  v_state idemq.job_state;
BEGIN
  IF reschedule.run_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'reschedule: run_at must not be NULL',
      HINT = 'Pass when the job should run, e.g. now() + interval ''1 hour''.';
  END IF;
  PERFORM idemq._check_instant('reschedule', 'run_at', reschedule.run_at);
  v_job := idemq._lock_job(reschedule.job_id, 'reschedule');
  IF v_job.state NOT IN ('scheduled', 'enqueued', 'awaiting') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('reschedule: job %s is %s; only scheduled, enqueued or awaiting jobs can be rescheduled',
                       v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = CASE WHEN v_job.state = 'processing' THEN 'A worker is running it; wait, or cancel it.'
                  ELSE 'It finished; use retry to run it again.' END;
  END IF;
  v_state := CASE WHEN v_job.state = 'awaiting' THEN 'awaiting'
                  ELSE idemq._initial_state(reschedule.run_at) END;
  UPDATE idemq.jobs AS j SET run_at = reschedule.run_at, state = v_state WHERE j.id = v_job.id;
  IF v_state = 'enqueued' THEN
    PERFORM idemq._notify_waiting(v_job.queue);
  END IF;
  RETURN v_state;
END;
$$;

COMMENT ON FUNCTION idemq.reschedule(bigint, timestamptz) IS
  'Move a waiting job to another run_at; IQ412 if it is processing or finished.';
