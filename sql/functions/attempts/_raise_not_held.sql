-- idemq._raise_not_held(job_id bigint, attempt int, operation text) RETURNS void
--
-- Raises the right error after `operation` found no job `job_id` held by
-- attempt `attempt` with the lease token given: IQ404 when the job does not
-- exist, IQ410 (lease lost) when it does. Called by complete, fail and snooze
-- after their fenced UPDATE matched nothing, so the happy path costs no
-- extra read.
--
-- Guarantees: always raises. The same IQ410 whether the attempt is stale or
--   the token is not the one claim() gave that attempt: telling them apart
--   would confirm a guessed attempt to a caller without the token.
-- Concurrency: reads the job without locking it; the state named in the
--   message is the committed state at that moment.
-- Errors: IQ404; IQ410 with DETAIL {"job_id","attempt","current_state"}.
--   Neither the message, the DETAIL nor the HINT names the current attempt
--   or any lease token: they are what fences the attempt holding the job
--   now. (This helper is never given the caller's token, so it cannot echo
--   it either.)
-- Tests: test/sql/complete.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_not_held(job_id bigint, attempt int, operation text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job record;
BEGIN
  IF _raise_not_held.job_id IS NULL OR _raise_not_held.attempt IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_id and attempt must not be NULL', operation),
      HINT = 'Pass the id and attempt that claim() returned: together they are the fencing token.';
  END IF;
  SELECT j.state INTO v_job FROM idemq.jobs j WHERE j.id = _raise_not_held.job_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('%s: job %s does not exist', operation, _raise_not_held.job_id),
      HINT = 'Check the job id; finished jobs may have been purged.';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('%s: lease lost: attempt %s no longer holds job %s (it is %s)',
                     operation, _raise_not_held.attempt, _raise_not_held.job_id, v_job.state),
    DETAIL = jsonb_build_object('job_id', _raise_not_held.job_id, 'attempt', _raise_not_held.attempt,
                                'current_state', v_job.state)::text,
    HINT = 'Another attempt took the job over (lease expired and rescued, or cancelled), or the lease_token '
           'passed is not the one claim() returned with this attempt: roll back this attempt''s work and stop.';
END;
$$;

COMMENT ON FUNCTION idemq._raise_not_held(bigint, int, text) IS
  'Raise IQ404 or IQ410 for a fenced call whose (job_id, attempt) matched no held job.';
