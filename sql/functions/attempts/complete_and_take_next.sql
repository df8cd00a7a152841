-- idemq.complete_and_take_next(job_ids bigint[], attempts int[], lease_tokens uuid[],
--   worker_id text, queues text[] DEFAULT NULL, lease interval DEFAULT '30 seconds',
--   tasks text[] DEFAULT NULL)
--   RETURNS TABLE (completed bigint, job_id bigint, task text, queue text, payload jsonb,
--     attempt int, max_attempts int, idempotency_key text, lease_expires_at timestamptz,
--     reclaimed boolean, traceparent text, lease_token uuid, timeout interval,
--     concurrency_key text)
--
-- complete_many(), and the next job of each concurrency key it frees handed
-- to the same worker in the same statement: the job goes from awaiting
-- straight to processing (one write), where a completion and a later claim
-- write it twice (promoted to enqueued, then claimed).
--
-- Guarantees:
--   * Completes exactly what complete_many(job_ids, attempts, lease_tokens)
--     completes, and returns one row per job completed: `completed` its id,
--     the other columns NULL.
--   * Then one row per job handed to worker_id (`completed` NULL), with the
--     columns claim() returns (job_id, task, ..., timeout, concurrency_key: the
--     same values, attempt already counted) and held as claim(token => true)
--     holds it: processing, locked_by worker_id, a new lease_token, the lease
--     (or the job's timeout when shorter). The caller runs and completes it
--     as a claimed job. In claim order.
--   * Handed only what this worker's next claim(worker_id, queues, lease,
--     tasks) would take before anything else of the job's task and queue
--     (_key_promote, "Hand-off"): the freed key's best waiting job, runnable
--     now, of the worker's tasks and queues, with no pause, concurrency or
--     rate limit or hold on its queue or task and no hold on its key, and no
--     runnable job of its task and queue ahead of it in claim order. Every
--     other freed key's job is admitted (enqueued) as complete_many admits
--     it, for any claim. So per key at most K run (the key's lock and count
--     are _key_promote's), and other keys are not held back: a key's next
--     job never passes over older or higher-priority jobs of its task and
--     queue, and the worker's own free slots still go to claim().
--   * Jobs of another task or queue than the freed key's are never handed:
--     claim()'s order across tasks and queues is not kept against them.
--   * The completion is durable when this returns (a synchronous commit,
--     as complete_many's); the handed jobs are in the same commit.
-- Concurrency: as complete_many() (rows updated in id order), then the keys'
--   locks (_key_lock) as complete_many's own admission takes them. The
--   hand-off is passed to _key_promote through the transaction-local setting
--   idemq.hand_off, set for the completion only and cleared before this
--   returns (and with the transaction, on error); a session that sets it
--   itself can hand jobs only to a worker id of its choosing, which claim()
--   lets it do anyway.
-- Errors: those of complete_many(); 22004 NULL worker_id or lease; 22023 as
--   claim() (_check_claimer).
-- Tests: test/sql/take-next.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.complete_and_take_next(
  job_ids bigint[],
  attempts int[],
  lease_tokens uuid[],
  worker_id text,
  queues text[] DEFAULT NULL,
  lease interval DEFAULT '30 seconds',
  tasks text[] DEFAULT NULL)
RETURNS TABLE (completed bigint, job_id bigint, task text, queue text, payload jsonb,
               attempt int, max_attempts int, idempotency_key text, lease_expires_at timestamptz,
               reclaimed boolean, traceparent text, lease_token uuid, timeout interval,
               concurrency_key text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_completed bigint[];
  v_handed bigint[];
BEGIN
  PERFORM idemq._check_claimer('complete_and_take_next', worker_id, queues, tasks, lease);
  PERFORM set_config('idemq.hand_off',
    jsonb_build_object('worker', worker_id, 'lease', lease::text, 'queues', queues, 'tasks', tasks)::text, true);
  PERFORM set_config('idemq.handed', '', true);
  SELECT coalesce(array_agg(c.c), '{}') INTO v_completed
  FROM idemq.complete_many(job_ids, attempts, lease_tokens) AS c(c);
  PERFORM set_config('idemq.hand_off', '', true);
  v_handed := string_to_array(nullif(current_setting('idemq.handed', true), ''), ',')::bigint[];
  PERFORM set_config('idemq.handed', '', true);

  RETURN QUERY SELECT c.id, NULL::bigint, NULL::text, NULL::text, NULL::jsonb, NULL::int, NULL::int,
                      NULL::text, NULL::timestamptz, NULL::boolean, NULL::text, NULL::uuid, NULL::interval,
                      NULL::text
               FROM unnest(v_completed) AS c(id);
  IF v_handed IS NOT NULL THEN
    -- Read back by primary key: the hand-off wrote these rows in this
    -- transaction, for this worker (a job it handed and a later statement
    -- of this call changed is not returned: none does).
    -- Planner trap: with the state and worker in the same WHERE as the ids,
    -- the planner may walk jobs_leases (every processing job of every
    -- worker; its statistics, taken when few were processing, say it is
    -- small) and filter the ids: EXPLAIN ANALYZE under a worker holding
    -- 500 jobs, a read-back of 50: Index Scan using jobs_leases, Rows
    -- Removed by Filter: 450, each row checked against the 50 ids; 10% of
    -- a keyed completion's instructions (bench/FINDINGS.md, "The keyed
    -- completion's cost"). OFFSET 0 keeps the lookup by id apart, so it
    -- can only use jobs_pkey; the state and worker are checked on its rows.
    RETURN QUERY
    SELECT NULL::bigint, j.id, j.task, j.queue, j.payload, j.attempt, j.max_attempts,
           j.idempotency_key, j.lease_expires_at, false, j.traceparent, j.lease_token, j.timeout,
           j.concurrency_key
    FROM (SELECT * FROM idemq.jobs b WHERE b.id = ANY (v_handed) OFFSET 0) j
    WHERE j.state = 'processing' AND j.locked_by = worker_id
    ORDER BY j.priority DESC, j.run_at, j.id;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.complete_and_take_next(bigint[], int[], uuid[], text, text[], interval, text[]) IS
  'complete_many(), and the next job of each concurrency key it frees handed to the same worker, claimed in the same statement.';
