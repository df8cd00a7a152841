-- idemq.job_result(job_id bigint, notify boolean DEFAULT false)
--   RETURNS TABLE(state idemq.job_state, result jsonb, last_error jsonb, finished_at timestamptz)
--
-- A job's outcome: its state, its result (what complete() stored: a
-- handler's return value) once it succeeded, its latest error entry once it
-- failed, expired or was cancelled; no row when there is no such job. With
-- `notify => true`, a job not finished yet sends NOTIFY idemq_results (the
-- payload: its id) when it finishes, so a client that LISTENs first and
-- calls this next waits for the outcome without polling (Client.result).
--
-- Guarantees:
--   * result is NULL until the job succeeded (the value complete() stored,
--     NULL when it stored none); last_error is the last entry of the job's
--     errors once it finished unsuccessfully, NULL otherwise (the errors of
--     attempts that were retried stay in job()).
--   * notify => true on an active job marks it (jobs.result_watched, with
--     has_children so its finish runs the jobs trigger and a succeeded
--     retention of 0 keeps the row until apply_retention): the transaction
--     that finishes it sends the NOTIFY at its commit, whichever function
--     finished it (complete, fail, cancel, rescue, ...). A job nobody waits
--     for sends none: the mark costs nothing to jobs without it. The mark
--     stays until the job finishes; a second caller writes nothing.
--   * A caller that LISTENs on idemq_results before calling this misses no
--     outcome: the job finished before the call (the row returned says so)
--     or after it (the NOTIFY follows the mark, which the finishing
--     statement sees: it locks the row the mark wrote).
--   * The NOTIFY says only that the job finished; read the outcome with
--     this function again. A retried job (retry()) finishes again.
-- Concurrency: the mark is a row update of an active job: it waits for a
--   transaction that holds the job's row (a completion in flight), then
--   sees that job finished and returns its outcome.
-- Errors: 22004 job_id or notify NULL.
-- Tests: test/sql/job-result.test.ts, test/worker/fan-out.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts
CREATE OR REPLACE FUNCTION idemq.job_result(job_id bigint, notify boolean DEFAULT false)
RETURNS TABLE(state idemq.job_state, result jsonb, last_error jsonb, finished_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF job_result.job_id IS NULL OR job_result.notify IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('job_result: %s must not be NULL', CASE WHEN job_result.job_id IS NULL THEN 'job_id' ELSE 'notify' END),
      HINT = 'Pass the id enqueue() returned, and notify => true only to be sent NOTIFY idemq_results when it finishes.';
  END IF;
  IF job_result.notify THEN
    UPDATE idemq.jobs AS j SET result_watched = true, has_children = true
    WHERE j.id = job_result.job_id AND j.finished_at IS NULL
      AND NOT (j.result_watched AND j.has_children);
  END IF;
  RETURN QUERY
  SELECT j.state,
         CASE WHEN j.state = 'succeeded' THEN j.result END,
         CASE WHEN j.finished_at IS NOT NULL AND j.state <> 'succeeded' THEN j.errors -> -1 END,
         j.finished_at
  FROM idemq.jobs j
  WHERE j.id = job_result.job_id;
END;
$$;

COMMENT ON FUNCTION idemq.job_result(bigint, boolean) IS
  'A job''s state and outcome (result, or its latest error); notify => true: NOTIFY idemq_results with its id when it finishes.';
