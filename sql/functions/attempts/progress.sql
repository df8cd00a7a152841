-- idemq.progress(job_id bigint, attempt int, value int, lease_token uuid DEFAULT NULL)
--   RETURNS void
--
-- Records how far a held attempt has got, as a percentage (0..100) its
-- handler chooses, for job() and the views of a job (`idemq jobs show`, the
-- dashboard's job page).
--
-- Guarantees:
--   * Fenced like complete() and heartbeat(), by (job_id, attempt,
--     lease_token): only the attempt holding the job writes its progress.
--   * Writes idemq.jobs.progress only: no state, lease or attempt change (a
--     progress report is not a heartbeat: it extends no lease). The value is
--     kept after the attempt ends (a finished job shows the last report) and
--     cleared by the next claim (claim() sets it NULL), so a retry starts
--     with none.
--   * The worker's ctx.progress(n) calls it at most once a second per job
--     (the latest value), so a handler may report in a hot loop.
-- Concurrency: row lock on the job, as heartbeat(); a concurrent completion
--   or rescue wins or waits as with heartbeat().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id, attempt or value;
--   22023 value outside 0..100 (nothing written).
-- Tests: test/sql/progress.test.ts, test/sql/roles.test.ts, test/worker/progress.test.ts
CREATE OR REPLACE FUNCTION idemq.progress(job_id bigint, attempt int, value int, lease_token uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF progress.job_id IS NULL OR progress.attempt IS NULL OR progress.value IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'progress: job_id, attempt and value must not be NULL',
      HINT = 'Pass the held job''s id and attempt (claim() returned them) and a percentage 0..100.';
  END IF;
  IF progress.value NOT BETWEEN 0 AND 100 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('progress: value must be a percentage from 0 to 100, got %s', progress.value),
      HINT = 'Report how far the attempt has got as a whole percentage, e.g. round(100 * done / total).';
  END IF;
  UPDATE idemq.jobs AS j
  SET progress = progress.value
  WHERE j.id = progress.job_id AND j.attempt = progress.attempt
    AND j.lease_token IS NOT DISTINCT FROM progress.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by);
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(progress.job_id, progress.attempt, 'progress');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.progress(bigint, int, int, uuid) IS
  'Record a held attempt''s progress (a percentage 0..100), fenced like complete(); cleared by the next claim.';
