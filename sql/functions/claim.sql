-- idemq.claim(worker_id text, queues text[] DEFAULT NULL, batch_size int DEFAULT 1,
--   lease interval DEFAULT '30 seconds', tasks text[] DEFAULT NULL)
--   RETURNS SETOF idemq.claimed_job
--
-- Hands up to batch_size runnable jobs to a worker, each under a lease.
--
-- Guarantees:
--   * Runnable: state enqueued or scheduled with run_at <= now() (a due
--     scheduled job needs no promoter), and not past expires_at.
--   * Order: priority desc, then run_at, then id.
--   * tasks: only jobs of these tasks (NULL: any task). A worker passes the
--     tasks it has, so a job of a task it lacks is left to a worker that has
--     it instead of spending an attempt.
--   * Each claimed job moves to processing with attempt + 1, locked_by =
--     worker_id, lease_expires_at = now() + lease. (id, attempt) is the
--     fencing token for complete, fail, snooze and heartbeat.
--   * reclaimed is true when the previous attempt lost its lease (its effect
--     may have happened: reconcile first).
--   * traceparent: the trace context enqueue stored (NULL without one), so
--     the worker's attempt span continues the producer's trace.
--   * Never takes a job in processing: a lease that ran out is taken away
--     only by rescue().
-- Concurrency: FOR UPDATE SKIP LOCKED over the jobs_runnable partial index:
--   concurrent claimers never block each other and never get the same job.
--   Jobs locked by another transaction (being claimed, cancelled...) are
--   skipped, not waited for.
-- Errors: 22004 worker_id/batch_size NULL; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes (idemq._limit), batch_size outside 1..1000, empty
--   queue or task name, bad lease.
-- Tests: test/sql/claim.test.ts, test/sql/claim-concurrency.test.ts, test/sql/fencing.test.ts,
--   test/sql/traceparent.test.ts
CREATE OR REPLACE FUNCTION idemq.claim(
  worker_id text,
  queues text[] DEFAULT NULL,
  batch_size int DEFAULT 1,
  lease interval DEFAULT '30 seconds',
  tasks text[] DEFAULT NULL)
RETURNS SETOF idemq.claimed_job
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_lost bigint[];
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'claim: worker_id must be a non-empty string',
      HINT = 'Name the worker, e.g. hostname:pid; it is recorded as locked_by and in the error history.';
  END IF;
  PERFORM idemq._check_size('claim', 'worker_id', worker_id, 'worker_id_bytes',
    'Use a shorter worker id, e.g. hostname:pid; it is stored in every job the worker claims.');
  IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN batch_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('claim: batch_size must be between 1 and 1000, not %s', coalesce(batch_size::text, 'NULL')),
      HINT = 'Claim at most as many jobs as the worker can start before their leases need a heartbeat.';
  END IF;
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim: queues must be NULL (all queues) or a non-empty list of queue names, not %s',
                       idemq._excerpt(queues::text)),
      HINT = 'Pass NULL to claim from every queue.';
  END IF;
  IF tasks IS NOT NULL AND (cardinality(tasks) = 0 OR EXISTS (
       SELECT 1 FROM unnest(tasks) t WHERE t IS NULL OR t = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim: tasks must be NULL (any task) or a non-empty list of task names, not %s',
                       idemq._excerpt(tasks::text)),
      HINT = 'Pass the names of the tasks this worker has, or NULL to claim jobs of any task.';
  END IF;
  PERFORM idemq._check_lease(lease, 'claim');

  -- Two steps: lock the jobs (SKIP LOCKED, in claim order) into an array, then
  -- update them by primary key. One UPDATE joined to the locking subquery let
  -- the planner hash the whole jobs table for claims of a few hundred (seen in
  -- EXPLAIN: a sequential scan of every row, finished ones included, per
  -- claim); "id = ANY (array)" is an index probe per job whatever the table
  -- holds. The jobs whose previous attempt lost its lease are noted before the
  -- update resets the flag. Two static statements for the queue filter rather
  -- than "queues IS NULL OR ...": each gets a plan that walks jobs_runnable in
  -- claim order and stops at the limit. The task filter is checked on the
  -- rows the walk meets (jobs_runnable does not hold the task).
  IF queues IS NULL THEN
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
        AND (tasks IS NULL OR j.task = ANY (tasks))
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSE
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.run_at <= now()
        AND j.queue = ANY (queues)
        AND (j.expires_at IS NULL OR j.expires_at > now())
        AND (tasks IS NULL OR j.task = ANY (tasks))
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
  END IF;
  IF cardinality(v_ids) = 0 THEN
    RETURN;
  END IF;

  RETURN QUERY
  WITH claimed AS (
    UPDATE idemq.jobs AS j
    SET state = 'processing', attempt = j.attempt + 1, locked_by = worker_id,
        locked_at = now(), lease_expires_at = now() + lease, lease_lost = false
    WHERE j.id = ANY (v_ids)
    RETURNING j.id, j.task, j.queue, j.payload, j.attempt, j.max_attempts,
              j.idempotency_key, j.lease_expires_at, j.id = ANY (v_lost) AS reclaimed,
              j.traceparent, j.priority, j.run_at
  )
  SELECT c.id, c.task, c.queue, c.payload, c.attempt, c.max_attempts,
         c.idempotency_key, c.lease_expires_at, c.reclaimed, c.traceparent
  FROM claimed c
  ORDER BY c.priority DESC, c.run_at, c.id;
END;
$$;

COMMENT ON FUNCTION idemq.claim(text, text[], int, interval, text[]) IS
  'Claim up to batch_size runnable jobs (priority desc, run_at, id) under a lease; FOR UPDATE SKIP LOCKED.';
