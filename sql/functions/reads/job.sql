-- idemq.job(job_id bigint) RETURNS SETOF idemq.job_row
--
-- One job's state and outcome, for every idemq role: what a producer reads
-- to learn what became of a job it enqueued, without a table privilege.
--
-- Guarantees:
--   * Returns one row of idemq.job_row (job_id, task, queue, payload, state,
--     priority, run_at, attempt, uncounted, max_attempts, idempotency_key,
--     locked_by, locked_at, lease_expires_at, errors, result, created_at,
--     finished_at, expires_at, concurrency_key, waiting_for, progress), or no row when
--     the job does not exist (never enqueued, or deleted by retention or
--     purge).
--   * waiting_for (idemq.waiting_reason) says why a job is not running. An
--     awaiting job: 'parents' while a parent in its `after` has not
--     succeeded, 'concurrency_key' while it waits for a place of its
--     concurrency key (docs/design.md, "Concurrency keys"), 'children'
--     while wait_for_children parks it until its spawned children finish. A runnable job
--     (claim()'s predicate: enqueued or scheduled, run_at passed, not past
--     expires_at): 'paused' (its queue or task is paused), 'held' (its queue
--     or task is held: hold()), 'concurrency' (its queue's or task's
--     concurrency limit has no slot free), 'rate' (its queue's or task's
--     rate has no start left in the period), the first of these that holds
--     (idemq._scope_waits(), from limits()); NULL when none does: it waits
--     for a worker. NULL in every other state (scheduled for later,
--     processing, finished).
--   * errors is the job's error history as fail(), rescue() and retry()
--     record it (the latest error_history entries; the last one is the
--     latest error), result what complete() stored (NULL otherwise).
--   * payload is NULL unless the session's login may read idemq.jobs itself
--     (idemq_admin, the owner, a superuser): the function shows nobody a
--     payload they could not SELECT. Why a producer does not see it, though
--     it enqueued the job: job ids are sequential and the database records
--     no job's producer, so whatever this function shows one producer it
--     shows every producer for every job, and payloads carry the data jobs
--     act on (addresses, tokens, amounts); the producer that enqueued a job
--     has its payload already. A worker reads a payload through claim(),
--     as before, and only of the jobs it claims.
--   * What it does show (state, attempts, errors, result, the locking
--     worker's id) any producer or worker may read for any job: results
--     and error messages should carry no secret.
--   * progress: the latest attempt's progress (0..100) as its handler last
--     reported it (progress()), NULL when it reported none; kept after the
--     attempt ends, cleared by the next claim.
--   * Never the job's lease_token: that is the holding attempt's alone
--     (claim() hands it out once), the part of the fencing token another
--     worker cannot guess.
--   * One primary-key probe (and one of job_dependencies for an awaiting
--     job; for a runnable one, one probe of idemq.limits' limits_scope, and
--     when its queue or task has flow control one call of limits(), which
--     reads the use of every scope: about 0.5 ms with 2 scopes, 1.8 ms with
--     20, on a loaded 2-core machine, PostgreSQL 15).
-- Concurrency: a plain read (no lock): the job as committed when the
--   statement began.
-- Errors: 22004 job_id NULL.
-- Tests: test/sql/job.test.ts, test/sql/roles.test.ts, test/sql/concurrency-keys.test.ts,
--   test/sql/waiting-for.test.ts
CREATE OR REPLACE FUNCTION idemq.job(job_id bigint)
RETURNS SETOF idemq.job_row
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_payloads boolean;
BEGIN
  IF job.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'job: job_id must not be NULL',
      HINT = 'Pass the id enqueue() returned.';
  END IF;
  -- session_user, not current_user: inside SECURITY DEFINER current_user is
  -- the owner. A session that may SET ROLE away from its login can SET it
  -- back, so the login's privilege is the one that counts.
  v_payloads := has_table_privilege(session_user, 'idemq.jobs', 'SELECT');
  RETURN QUERY
  SELECT j.id, j.task, j.queue, CASE WHEN v_payloads THEN j.payload END, j.state, j.priority,
         j.run_at, j.attempt, j.uncounted, j.max_attempts, j.idempotency_key, j.locked_by,
         j.locked_at, j.lease_expires_at, j.errors, j.result, j.created_at, j.finished_at,
         j.expires_at, j.concurrency_key,
         CASE WHEN j.state = 'awaiting' THEN
                -- The gate of wait_for_children is the row (j.id, j.id).
                CASE WHEN EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id AND d.parent_id = j.id)
                       THEN 'children'::idemq.waiting_reason
                     WHEN EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id)
                       THEN 'parents'::idemq.waiting_reason
                     WHEN j.concurrency_key IS NOT NULL THEN 'concurrency_key' END
              -- The probe of limits_scope first: _scope_waits() reads
              -- limits(), every scope's use (a few index scans per scope),
              -- which a job whose queue and task have no flow control does
              -- not need (and `idemq jobs` calls job() per row).
              WHEN j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
                   AND (j.expires_at IS NULL OR j.expires_at > now())
                   AND EXISTS (SELECT FROM idemq.limits l
                               WHERE (l.kind, l.name) IN (('queue', j.queue), ('task', j.task))) THEN
                (SELECT min(w.waiting_for) FROM idemq._scope_waits() w
                 WHERE w.queue = j.queue OR w.task = j.task)
         END,
         j.progress
  FROM idemq.jobs j
  WHERE j.id = job.job_id;
END;
$$;

COMMENT ON FUNCTION idemq.job(bigint) IS
  'One job''s state and outcome (no row when it does not exist); the payload only for a login that may read idemq.jobs.';
