-- idemq.wait_for_children(job_id bigint, attempt int, lease_token uuid DEFAULT NULL) RETURNS boolean
--
-- Fan-in: ends the attempt of a job that spawned children, without spending
-- it, and parks the job (`awaiting`) until its children have finished (or,
-- when its spawn said fail_fast, until the first of them did not succeed);
-- the job then runs again, and children() hands it their outcomes. No
-- worker is held meanwhile.
--
-- Guarantees:
--   * true: parked. The attempt ends as snooze() ends one (lease cleared,
--     uncounted + 1: attempts and backoff untouched), the job is
--     `awaiting` behind its gate, the dependency row (job_id, job_id) that
--     keeps awaiting jobs from being promoted (_key_promote) and that
--     job() reports as waiting_for 'children'. The child whose finish ends
--     the wait releases it (_child_finished, _release_waiting): enqueued,
--     or admitted by its concurrency key.
--   * false: nothing to wait for (no child unfinished, or under fail_fast
--     one did not succeed, or the job spawned none): nothing is written
--     and the attempt still holds the job; go on (children() says how they
--     ended) and end the attempt as usual.
--   * No lost wake-up: the count is read under the lock of the job's
--     child_waits row, which every finishing child updates: a child that
--     finished before is counted, one finishing after finds the job parked.
--   * Fenced by (job_id, attempt, lease_token) as complete().
-- Concurrency: locks the job's child_waits row, then the gate row, then the
--   job's row (the order _child_finished and _release_waiting take them).
-- Errors: 22004 job_id or attempt NULL; IQ404 no such job; IQ410 lease lost.
-- Tests: test/sql/children.test.ts, test/worker/fan-out.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts,
--   test/worker/workflow-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.wait_for_children(job_id bigint, attempt int, lease_token uuid DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_wait record;
BEGIN
  SELECT w.pending, w.failed, w.fail_fast INTO v_wait
  FROM idemq.child_waits w
  WHERE w.parent_id = wait_for_children.job_id
  FOR UPDATE;
  IF NOT FOUND OR v_wait.pending = 0 OR (v_wait.fail_fast AND v_wait.failed > 0) THEN
    PERFORM idemq._lock_held('wait_for_children', wait_for_children.job_id, wait_for_children.attempt,
                             wait_for_children.lease_token);
    RETURN false;
  END IF;
  -- The gate first: the UPDATE's trigger (_count_jobs) may promote waiting
  -- jobs of the job's concurrency key, and must not take this one.
  INSERT INTO idemq.job_dependencies (parent_id, child_id)
  VALUES (wait_for_children.job_id, wait_for_children.job_id)
  ON CONFLICT DO NOTHING;
  PERFORM idemq._lock_held('wait_for_children', wait_for_children.job_id, wait_for_children.attempt,
                           wait_for_children.lease_token);
  UPDATE idemq.jobs AS j
  SET state = 'awaiting', uncounted = j.uncounted + 1, locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = wait_for_children.job_id;
  RETURN true;
END;
$$;

COMMENT ON FUNCTION idemq.wait_for_children(bigint, int, uuid) IS
  'Fan-in: park the held job (awaiting, attempt not spent) until its spawned children have finished; false when none is left to wait for.';
