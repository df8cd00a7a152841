-- Migration 0020_one_runnable_index: one index over runnable jobs. jobs_runnable, which only claims with neither queues nor tasks walked, is dropped, and such a claim walks jobs_runnable_by_task_queue one (task, queue) pair at a time, so an enqueue writes one runnable index entry instead of two (a 20,000-job enqueue_many: 415 B of WAL per job with both, 331 B with one).
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ (npm run migration:check compares them). Once released (listed
-- in sql/released.sha256) this file never changes again.
-- Up Migration

-- Hand-written schema changes (tables, columns, indexes) go here, before the
-- functions that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes
-- in a migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration commits
-- on its own, so the next migration can use it.

-- Workers pass their tasks to claim(), so their claims walk
-- jobs_runnable_by_task_queue (0019); jobs_runnable served only claim() with
-- queues and tasks both NULL, and cost every enqueue an index entry. Such a
-- claim now walks the remaining index one (task, queue) pair at a time
-- (claim.sql below). DROP INDEX takes an ACCESS EXCLUSIVE lock on idemq.jobs:
-- it waits for open transactions that used the table, and enqueues and
-- claims wait for it, for as long as the drop takes.
DROP INDEX idemq.jobs_runnable;

-- ---- sql/functions/claim.sql ----
-- idemq.claim(worker_id text, queues text[] DEFAULT NULL, batch_size int DEFAULT 1,
--   lease interval DEFAULT '30 seconds', tasks text[] DEFAULT NULL)
--   RETURNS SETOF idemq.claimed_job
--
-- Hands up to batch_size runnable jobs to a worker, each under a lease.
--
-- Guarantees:
--   * Runnable: state enqueued or scheduled with run_at <= now() (a due
--     scheduled job needs no promoter), and not past expires_at.
--   * Order: priority desc, then run_at, then id, across all the (task,
--     queue) keys the claim may take jobs from (unfiltered: every key).
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
--   * Cost: a claim reads at most batch_size runnable jobs of each of its
--     (task, queue) keys, plus one index descent per key and per distinct
--     task or queue present. Filtered by queues or tasks, a backlog in
--     another queue or of another task does not slow it. Unfiltered, its
--     keys are every (task, queue) pair with runnable jobs: up to
--     k x batch_size jobs read for k pairs (an index in claim order alone
--     would read batch_size, but it cost every enqueue a second index
--     entry, for claims only SQL clients make: workers pass their tasks).
-- Concurrency: FOR UPDATE SKIP LOCKED over the partial index
--   jobs_runnable_by_task_queue, walked one (task, queue) key at a time:
--   concurrent claimers never block each other and never get the same job.
--   Jobs locked by another transaction (being claimed, cancelled...) are
--   skipped, not waited for. A claim of several keys locks only the jobs it
--   takes.
-- Errors: 22004 worker_id/batch_size NULL; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes (idemq._limit), batch_size outside 1..1000, empty
--   queue or task name, bad lease.
-- Tests: test/sql/claim.test.ts, test/sql/claim-keys.test.ts, test/sql/claim-concurrency.test.ts,
--   test/sql/fencing.test.ts, test/sql/traceparent.test.ts
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
-- Generic plans, planned once per session: with custom plans (the first five
-- calls, and then whenever a custom plan's estimate beats the generic one, as
-- it does for the key lookups below, which know the array lengths) PL/pgSQL
-- planned the key statements at every call: claim(tasks => '{x}') 2.2 ms a
-- call against 0.65 ms generic (500 calls, same session, loaded machine).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_lost bigint[];
  v_key_tasks text[];
  v_key_queues text[];
  v_seen bigint[];
  v_candidates bigint[];
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
  -- update resets the flag.
  --
  -- One index holds the runnable jobs: jobs_runnable_by_task_queue (task,
  -- queue, priority DESC, run_at, id), walked one (task, queue) key at a
  -- time, where an equality on both leading columns leaves exactly that
  -- key's jobs, already in claim order. The keys: the listed tasks crossed
  -- with the listed queues; for a list that is NULL, the values present
  -- among runnable jobs, read by a loose index scan (one index descent per
  -- value: "next value after this one"), and for an unfiltered claim the
  -- (task, queue) pairs present, read the same way; so finding the keys
  -- costs the number of distinct keys, tasks or queues, not backlogs.
  -- Planner trap (why the index leads with task and queue, migration 0019):
  -- a filter on queue or task checked on the rows of a walk over an index
  -- in claim order alone (the former jobs_runnable (priority DESC, run_at,
  -- id)) reads every runnable job of the other queues and tasks before it
  -- finds none of its own. EXPLAIN (ANALYZE, BUFFERS), generic plan
  -- (PG15), 200,000 runnable jobs in queue A, a claim on the empty queue B:
  -- Index Scan using jobs_runnable, Rows Removed by Filter: 200000, 6,394
  -- buffers, 138-166 ms; claim(queues => '{B}') 54-59 ms. Walking this
  -- index per key: 0 rows removed, 3 buffers; claim(queues => '{B}', tasks
  -- => '{t}') 0.36-0.49 ms a call (500 calls, one session, loaded machine).
  -- Second trap, in the pair scan: "next pair" must be the row comparison
  -- (j.task, j.queue) > (k.task, k.queue), which is an Index Cond that starts
  -- the descent at the next pair. Spelt "j.task > $1 OR (j.task = $1 AND
  -- j.queue > $2)" it is a Filter on a walk from the first entry: EXPLAIN
  -- (ANALYZE, BUFFERS), generic plan, 50,000 runnable jobs over 50 pairs,
  -- the step after the 49th pair: Rows Removed by Filter: 44000, 917
  -- buffers, 8.6 ms; as a row comparison, 5 buffers, 0.04 ms. The whole pair
  -- scan: Index Only Scan per step, 50 loops, 174 buffers, 0.7 ms.
  -- Third trap (0019, gone with jobs_runnable): with statistics that saw one
  -- queue and one task, an equality on either looked like it kept every row,
  -- and a generic plan tied the two indexes and walked jobs_runnable with
  -- the filter again (Rows Removed by Filter: 100000 per key, 201 ms); the
  -- schema sets n_distinct = 100 on both columns. With one index the
  -- planner has no other ordered walk: with n_distinct reset and statistics
  -- of one or two keys, every walk below still takes this index (EXPLAIN,
  -- generic plans, 50,000 runnable jobs). n_distinct stays (the schema's,
  -- harmless here).
  IF queues IS NULL AND tasks IS NULL THEN
    WITH RECURSIVE present(task, queue) AS (
      (SELECT j.task, j.queue
       FROM idemq.jobs j
       WHERE j.state IN ('enqueued', 'scheduled')
       ORDER BY j.task, j.queue
       LIMIT 1)
      UNION ALL
      SELECT n.task, n.queue
      FROM present k
      CROSS JOIN LATERAL (
        SELECT j.task, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled') AND (j.task, j.queue) > (k.task, k.queue)
        ORDER BY j.task, j.queue
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present k;
  ELSIF tasks IS NULL THEN
    WITH RECURSIVE present(task) AS (
      SELECT (SELECT j.task FROM idemq.jobs j
              WHERE j.state IN ('enqueued', 'scheduled')
              ORDER BY j.task LIMIT 1)
      UNION ALL
      SELECT (SELECT j.task FROM idemq.jobs j
              WHERE j.state IN ('enqueued', 'scheduled') AND j.task > t.task
              ORDER BY j.task LIMIT 1)
      FROM present t WHERE t.task IS NOT NULL
    )
    SELECT coalesce(array_agg(t.task ORDER BY t.task, q.queue), '{}'),
           coalesce(array_agg(q.queue ORDER BY t.task, q.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present t CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q
    WHERE t.task IS NOT NULL;
  ELSIF queues IS NULL THEN
    WITH RECURSIVE present(task, queue) AS (
      SELECT u.task, (SELECT j.queue FROM idemq.jobs j
                      WHERE j.state IN ('enqueued', 'scheduled') AND j.task = u.task
                      ORDER BY j.queue LIMIT 1)
      FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) u
      UNION ALL
      SELECT k.task, (SELECT j.queue FROM idemq.jobs j
                      WHERE j.state IN ('enqueued', 'scheduled') AND j.task = k.task AND j.queue > k.queue
                      ORDER BY j.queue LIMIT 1)
      FROM present k WHERE k.queue IS NOT NULL
    )
    SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present k WHERE k.queue IS NOT NULL;
  ELSE
    SELECT coalesce(array_agg(t.task), '{}'), coalesce(array_agg(q.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) t
    CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q;
  END IF;

  IF cardinality(v_key_tasks) = 0 THEN
    -- No runnable job of any key asked for (unfiltered: none at all).
    RETURN;
  ELSIF cardinality(v_key_tasks) = 1 THEN
    -- One key (a worker of one task, or of one queue and one task; an
    -- unfiltered claim while one key has runnable jobs): its walk is the
    -- claim order itself, locked as it goes.
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.task = v_key_tasks[1]
        AND j.queue = v_key_queues[1]
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSE
    -- Several keys: the first jobs of each key, merged into claim order, are
    -- the candidates; they are locked in that order, SKIP LOCKED. Locking
    -- inside each key's walk would lock up to batch_size jobs per key (a row
    -- lock is a WAL record, and other claimers skip those jobs) to keep
    -- batch_size of them. A candidate another claimer holds, or that stopped
    -- being runnable, is skipped and the next round looks past it. Each
    -- key's walk reads up to batch_size jobs (which key holds the next job
    -- is known only after the merge), so k keys with backlogs cost up to
    -- k x batch_size index entries and rows, whatever the backlogs' size.
    -- Unfiltered, k is every pair present: claim(batch_size => 100), 50,000
    -- runnable jobs spread over 50 pairs, EXPLAIN (ANALYZE, BUFFERS) of the
    -- candidates: 50 walks of 100 rows, 5,209 buffers, 5.9 ms, where the walk
    -- of the dropped jobs_runnable read 100 rows (220 buffers, 0.2 ms); the
    -- whole call 10-12.5 ms against 1.5 ms (medians of 200 calls, a loaded
    -- 2-core machine), 2.3 against 1.4 ms over 10 pairs, 44 against 1.4 ms
    -- over 200. A worker's claim (it passes its tasks) has paid the same
    -- per key since 0019.
    v_ids := '{}';
    v_lost := '{}';
    v_seen := '{}';
    LOOP
      SELECT coalesce(array_agg(c.id), '{}')
      INTO v_candidates
      FROM (
        SELECT w.id
        FROM unnest(v_key_tasks, v_key_queues) AS k(task, queue)
        CROSS JOIN LATERAL (
          SELECT j.id, j.priority, j.run_at
          FROM idemq.jobs j
          WHERE j.state IN ('enqueued', 'scheduled')
            AND j.task = k.task
            AND j.queue = k.queue
            AND j.run_at <= now()
            AND (j.expires_at IS NULL OR j.expires_at > now())
            AND j.id <> ALL (v_seen)
          ORDER BY j.priority DESC, j.run_at, j.id
          LIMIT batch_size - cardinality(v_ids)
        ) w
        ORDER BY w.priority DESC, w.run_at, w.id
        LIMIT batch_size - cardinality(v_ids)
      ) c;
      EXIT WHEN cardinality(v_candidates) = 0;
      SELECT v_ids || coalesce(array_agg(p.id), '{}'),
             v_lost || coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
      INTO v_ids, v_lost
      FROM (
        SELECT j.id, j.lease_lost
        FROM idemq.jobs j
        WHERE j.id = ANY (v_candidates)
          AND j.state IN ('enqueued', 'scheduled')
          AND j.run_at <= now()
          AND (j.expires_at IS NULL OR j.expires_at > now())
        ORDER BY j.priority DESC, j.run_at, j.id
        FOR UPDATE SKIP LOCKED
      ) p;
      EXIT WHEN cardinality(v_ids) = batch_size;
      v_seen := v_seen || v_candidates;
    END LOOP;
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

-- ---- sql/functions/overview.sql ----
-- idemq.overview(recent interval DEFAULT '15 minutes', exact_up_to bigint DEFAULT 10000) RETURNS TABLE(queue text, task text, metric text, value bigint, exact boolean)
--
-- The dashboard's overview in one call that stays fast with millions of
-- finished jobs retained: stats() counts every row (0.35-0.5 s at 1,000,000).
--
-- Guarantees: one row per (queue, task, metric), only non-zero values:
--   * metric = an active state (scheduled, enqueued, processing, awaiting),
--     'lease_expired', 'oldest_runnable_seconds': exact, as stats() counts
--     them, per queue and task (read through the partial indexes on active
--     rows: jobs_runnable_by_task_queue, jobs_leases, jobs_awaiting).
--   * metric = '<terminal state>_recent' (succeeded_recent, failed_recent,
--     expired_recent, cancelled_recent): jobs that reached that state within
--     `recent` of now(), exact, per queue and task (jobs_by_finish).
--   * metric = a terminal state, queue and task NULL: all jobs in that state.
--     Exact (exact true) when at most exact_up_to; otherwise exact false and
--     value an estimate, at least exact_up_to + 1: the table's row estimate
--     (pg_class.reltuples) times the state's frequency in pg_stats, or
--     exact_up_to + 1 itself when the table has not been analysed.
--   * metric = 'deduplicated' | 'rejected' | 'conflict' | 'guard_duplicate'
--     (queue NULL): events per task since install, as stats() returns them.
--   Every row but the estimated totals has exact true.
-- Concurrency: plain reads (one snapshot per statement); no locks.
-- Errors: 22004 a NULL argument; 22023 recent not positive or over
--   duration_days, exact_up_to not from 0 to 10,000,000.
-- Tests: test/sql/overview.test.ts, test/dashboard/dashboard.test.ts
CREATE OR REPLACE FUNCTION idemq.overview(recent interval DEFAULT '15 minutes', exact_up_to bigint DEFAULT 10000)
RETURNS TABLE(queue text, task text, metric text, value bigint, exact boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_state idemq.job_state;
  v_count bigint;
  v_estimate numeric;
BEGIN
  IF recent IS NULL OR exact_up_to IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'overview: recent and exact_up_to must not be NULL',
      HINT = 'Leave an argument out to take its default.';
  END IF;
  IF recent <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: recent must be positive, not %s', recent),
      HINT = 'Give the window of recent finishes, e.g. recent => ''15 minutes''.';
  END IF;
  PERFORM idemq._check_duration('overview', 'recent', recent);
  IF exact_up_to NOT BETWEEN 0 AND 10000000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: exact_up_to must be from 0 to 10000000, not %s', exact_up_to),
      HINT = 'Totals over it are estimated; 10000 (the default) keeps the call fast.';
  END IF;

  -- Each branch names the state(s) as constants so the planner matches the
  -- partial index of active rows instead of scanning the finished ones.
  RETURN QUERY
  SELECT j.queue, j.task, j.state::text, count(*), true
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled')
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT j.queue, j.task, 'processing', count(*), true
  FROM idemq.jobs j WHERE j.state = 'processing'
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, 'awaiting', count(*), true
  FROM idemq.jobs j WHERE j.state = 'awaiting'
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, 'lease_expired', count(*), true
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  -- As stats() computes it (capped epoch seconds: a run_at of -infinity must not fail the call).
  SELECT j.queue, j.task, 'oldest_runnable_seconds',
         least(floor(extract(epoch FROM now()) - extract(epoch FROM min(j.run_at))),
               9223372036854775807)::bigint, true
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
    AND (j.expires_at IS NULL OR j.expires_at > now())
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, j.state::text || '_recent', count(*), true
  FROM idemq.jobs j
  WHERE j.state IN ('succeeded', 'failed', 'expired', 'cancelled')
    AND j.finished_at IS NOT NULL AND j.finished_at >= now() - recent
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint, true
  FROM idemq.counters c
  GROUP BY c.task, c.event;

  -- Totals per terminal state: counted through jobs_by_finish up to the cap,
  -- estimated beyond it (a count(*) of a million rows is what this avoids).
  FOREACH v_state IN ARRAY ARRAY['succeeded', 'failed', 'expired', 'cancelled']::idemq.job_state[] LOOP
    SELECT count(*) INTO v_count
    FROM (SELECT FROM idemq.jobs j
          WHERE j.state = v_state AND j.finished_at IS NOT NULL
          LIMIT exact_up_to + 1) s;
    CONTINUE WHEN v_count = 0;
    queue := NULL;
    task := NULL;
    metric := v_state::text;
    IF v_count <= exact_up_to THEN
      value := v_count;
      exact := true;
    ELSE
      SELECT c.reltuples * s.most_common_freqs[array_position(s.most_common_vals::text::text[], v_state::text)]
      INTO v_estimate
      FROM pg_class c
      LEFT JOIN pg_stats s
        ON s.schemaname = 'idemq' AND s.tablename = 'jobs' AND s.attname = 'state'
      WHERE c.oid = 'idemq.jobs'::regclass AND c.reltuples > 0;
      value := greatest(exact_up_to + 1, coalesce(round(v_estimate), 0))::bigint;
      exact := false;
    END IF;
    RETURN NEXT;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.overview(interval, bigint) IS
  'Dashboard overview: exact active counts and recent finishes per queue and task, terminal totals exact up to a cap and estimated beyond it.';

-- Down Migration

-- sql/functions/claim.sql as of 0019_many_queues
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
--   * Cost: a claim filtered by queues or tasks reads at most batch_size
--     runnable jobs of each of its own (task, queue) keys, plus one index
--     descent per key and per distinct task or queue present: a backlog in
--     another queue or of another task does not slow it.
-- Concurrency: FOR UPDATE SKIP LOCKED over the partial indexes jobs_runnable
--   (no filter) and jobs_runnable_by_task_queue (a queue or task filter):
--   concurrent claimers never block each other and never get the same job.
--   Jobs locked by another transaction (being claimed, cancelled...) are
--   skipped, not waited for. A claim of several keys locks only the jobs it
--   takes.
-- Errors: 22004 worker_id/batch_size NULL; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes (idemq._limit), batch_size outside 1..1000, empty
--   queue or task name, bad lease.
-- Tests: test/sql/claim.test.ts, test/sql/claim-keys.test.ts, test/sql/claim-concurrency.test.ts,
--   test/sql/fencing.test.ts, test/sql/traceparent.test.ts
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
-- Generic plans, planned once per session: with custom plans (the first five
-- calls, and then whenever a custom plan's estimate beats the generic one, as
-- it does for the key lookups below, which know the array lengths) PL/pgSQL
-- planned the key statements at every call: claim(tasks => '{x}') 2.2 ms a
-- call against 0.65 ms generic (500 calls, same session, loaded machine).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_lost bigint[];
  v_key_tasks text[];
  v_key_queues text[];
  v_seen bigint[];
  v_candidates bigint[];
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
  -- update resets the flag.
  IF queues IS NULL AND tasks IS NULL THEN
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSE
    -- Planner trap: a filter on queue or task checked on the rows of a walk
    -- over jobs_runnable (priority DESC, run_at, id) reads every runnable job
    -- of the other queues and tasks before it finds none of its own. EXPLAIN
    -- (ANALYZE, BUFFERS) of the queue-filtered walk, generic plan (PG15),
    -- 200,000 runnable jobs in queue A, a claim on the empty queue B: Index
    -- Scan using jobs_runnable, Rows Removed by Filter: 200000, 6,394 buffers,
    -- 138-166 ms; claim(queues => '{B}') 54-59 ms, claim(tasks => '{x}') 53 ms.
    -- So a filtered claim walks jobs_runnable_by_task_queue (task, queue,
    -- priority DESC, run_at, id) one (task, queue) key at a time, where an
    -- equality on both leading columns leaves exactly that key's jobs, already
    -- in claim order: 0 rows removed, 3 buffers; claim(queues => '{B}',
    -- tasks => '{t}') 0.36-0.49 ms a call (500 calls, one session, a loaded
    -- machine) in the same database, where main's took 54-59 ms.
    -- The keys: the listed tasks crossed with the listed queues; for a list
    -- that is NULL, the values present among runnable jobs, read by a loose
    -- index scan (one index descent per value: "next value after this one"),
    -- so its cost is the number of distinct tasks or queues, not backlogs.
    -- Second trap: jobs_runnable serves "ORDER BY priority DESC, run_at, id"
    -- as well, and with statistics that saw one queue and one task, an
    -- equality on either looks like it keeps every row, so a generic plan (and
    -- every per-key walk below, whose key comes from the outer row) tied the
    -- two indexes and walked jobs_runnable with the filter again (Rows Removed
    -- by Filter: 100000 per key, 201 ms). The base schema tells the planner
    -- to assume many distinct queues and tasks (n_distinct on both columns),
    -- and the new index wins: 0 rows removed, 7 buffers, 0.1 ms.
    IF tasks IS NULL THEN
      WITH RECURSIVE present(task) AS (
        SELECT (SELECT j.task FROM idemq.jobs j
                WHERE j.state IN ('enqueued', 'scheduled')
                ORDER BY j.task LIMIT 1)
        UNION ALL
        SELECT (SELECT j.task FROM idemq.jobs j
                WHERE j.state IN ('enqueued', 'scheduled') AND j.task > t.task
                ORDER BY j.task LIMIT 1)
        FROM present t WHERE t.task IS NOT NULL
      )
      SELECT coalesce(array_agg(t.task ORDER BY t.task, q.queue), '{}'),
             coalesce(array_agg(q.queue ORDER BY t.task, q.queue), '{}')
      INTO v_key_tasks, v_key_queues
      FROM present t CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q
      WHERE t.task IS NOT NULL;
    ELSIF queues IS NULL THEN
      WITH RECURSIVE present(task, queue) AS (
        SELECT u.task, (SELECT j.queue FROM idemq.jobs j
                        WHERE j.state IN ('enqueued', 'scheduled') AND j.task = u.task
                        ORDER BY j.queue LIMIT 1)
        FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) u
        UNION ALL
        SELECT k.task, (SELECT j.queue FROM idemq.jobs j
                        WHERE j.state IN ('enqueued', 'scheduled') AND j.task = k.task AND j.queue > k.queue
                        ORDER BY j.queue LIMIT 1)
        FROM present k WHERE k.queue IS NOT NULL
      )
      SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
      INTO v_key_tasks, v_key_queues
      FROM present k WHERE k.queue IS NOT NULL;
    ELSE
      SELECT coalesce(array_agg(t.task), '{}'), coalesce(array_agg(q.queue), '{}')
      INTO v_key_tasks, v_key_queues
      FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) t
      CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q;
    END IF;

    IF cardinality(v_key_tasks) = 1 THEN
      -- One key (a worker of one task, or of one queue and one task): its
      -- walk is the claim order itself, locked as it goes.
      SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
      INTO v_ids, v_lost
      FROM (
        SELECT j.id, j.lease_lost
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND j.task = v_key_tasks[1]
          AND j.queue = v_key_queues[1]
          AND j.run_at <= now()
          AND (j.expires_at IS NULL OR j.expires_at > now())
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT batch_size
        FOR UPDATE SKIP LOCKED
      ) p;
    ELSE
      -- Several keys: the first jobs of each key, merged into claim order, are
      -- the candidates; they are locked in that order, SKIP LOCKED. Locking
      -- inside each key's walk would lock up to batch_size jobs per key (a row
      -- lock is a WAL record, and other claimers skip those jobs) to keep
      -- batch_size of them. A candidate another claimer holds, or that stopped
      -- being runnable, is skipped and the next round looks past it. Each
      -- key's walk reads up to batch_size jobs (which key holds the next job
      -- is known only after the merge), so k keys with backlogs cost up to
      -- k x batch_size index entries and rows, whatever the backlogs' size.
      v_ids := '{}';
      v_lost := '{}';
      v_seen := '{}';
      LOOP
        SELECT coalesce(array_agg(c.id), '{}')
        INTO v_candidates
        FROM (
          SELECT w.id
          FROM unnest(v_key_tasks, v_key_queues) AS k(task, queue)
          CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at
            FROM idemq.jobs j
            WHERE j.state IN ('enqueued', 'scheduled')
              AND j.task = k.task
              AND j.queue = k.queue
              AND j.run_at <= now()
              AND (j.expires_at IS NULL OR j.expires_at > now())
              AND j.id <> ALL (v_seen)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT batch_size - cardinality(v_ids)
          ) w
          ORDER BY w.priority DESC, w.run_at, w.id
          LIMIT batch_size - cardinality(v_ids)
        ) c;
        EXIT WHEN cardinality(v_candidates) = 0;
        SELECT v_ids || coalesce(array_agg(p.id), '{}'),
               v_lost || coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
        INTO v_ids, v_lost
        FROM (
          SELECT j.id, j.lease_lost
          FROM idemq.jobs j
          WHERE j.id = ANY (v_candidates)
            AND j.state IN ('enqueued', 'scheduled')
            AND j.run_at <= now()
            AND (j.expires_at IS NULL OR j.expires_at > now())
          ORDER BY j.priority DESC, j.run_at, j.id
          FOR UPDATE SKIP LOCKED
        ) p;
        EXIT WHEN cardinality(v_ids) = batch_size;
        v_seen := v_seen || v_candidates;
      END LOOP;
    END IF;
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

-- sql/functions/overview.sql as of 0016_dashboard
-- idemq.overview(recent interval DEFAULT '15 minutes', exact_up_to bigint DEFAULT 10000) RETURNS TABLE(queue text, task text, metric text, value bigint, exact boolean)
--
-- The dashboard's overview in one call that stays fast with millions of
-- finished jobs retained: stats() counts every row (0.35-0.5 s at 1,000,000).
--
-- Guarantees: one row per (queue, task, metric), only non-zero values:
--   * metric = an active state (scheduled, enqueued, processing, awaiting),
--     'lease_expired', 'oldest_runnable_seconds': exact, as stats() counts
--     them, per queue and task (read through the partial indexes on active
--     rows: jobs_runnable, jobs_leases, jobs_awaiting).
--   * metric = '<terminal state>_recent' (succeeded_recent, failed_recent,
--     expired_recent, cancelled_recent): jobs that reached that state within
--     `recent` of now(), exact, per queue and task (jobs_by_finish).
--   * metric = a terminal state, queue and task NULL: all jobs in that state.
--     Exact (exact true) when at most exact_up_to; otherwise exact false and
--     value an estimate, at least exact_up_to + 1: the table's row estimate
--     (pg_class.reltuples) times the state's frequency in pg_stats, or
--     exact_up_to + 1 itself when the table has not been analysed.
--   * metric = 'deduplicated' | 'rejected' | 'conflict' | 'guard_duplicate'
--     (queue NULL): events per task since install, as stats() returns them.
--   Every row but the estimated totals has exact true.
-- Concurrency: plain reads (one snapshot per statement); no locks.
-- Errors: 22004 a NULL argument; 22023 recent not positive or over
--   duration_days, exact_up_to not from 0 to 10,000,000.
-- Tests: test/sql/overview.test.ts, test/dashboard/dashboard.test.ts
CREATE OR REPLACE FUNCTION idemq.overview(recent interval DEFAULT '15 minutes', exact_up_to bigint DEFAULT 10000)
RETURNS TABLE(queue text, task text, metric text, value bigint, exact boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_state idemq.job_state;
  v_count bigint;
  v_estimate numeric;
BEGIN
  IF recent IS NULL OR exact_up_to IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'overview: recent and exact_up_to must not be NULL',
      HINT = 'Leave an argument out to take its default.';
  END IF;
  IF recent <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: recent must be positive, not %s', recent),
      HINT = 'Give the window of recent finishes, e.g. recent => ''15 minutes''.';
  END IF;
  PERFORM idemq._check_duration('overview', 'recent', recent);
  IF exact_up_to NOT BETWEEN 0 AND 10000000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: exact_up_to must be from 0 to 10000000, not %s', exact_up_to),
      HINT = 'Totals over it are estimated; 10000 (the default) keeps the call fast.';
  END IF;

  -- Each branch names the state(s) as constants so the planner matches the
  -- partial index of active rows instead of scanning the finished ones.
  RETURN QUERY
  SELECT j.queue, j.task, j.state::text, count(*), true
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled')
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT j.queue, j.task, 'processing', count(*), true
  FROM idemq.jobs j WHERE j.state = 'processing'
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, 'awaiting', count(*), true
  FROM idemq.jobs j WHERE j.state = 'awaiting'
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, 'lease_expired', count(*), true
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  -- As stats() computes it (capped epoch seconds: a run_at of -infinity must not fail the call).
  SELECT j.queue, j.task, 'oldest_runnable_seconds',
         least(floor(extract(epoch FROM now()) - extract(epoch FROM min(j.run_at))),
               9223372036854775807)::bigint, true
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
    AND (j.expires_at IS NULL OR j.expires_at > now())
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, j.state::text || '_recent', count(*), true
  FROM idemq.jobs j
  WHERE j.state IN ('succeeded', 'failed', 'expired', 'cancelled')
    AND j.finished_at IS NOT NULL AND j.finished_at >= now() - recent
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint, true
  FROM idemq.counters c
  GROUP BY c.task, c.event;

  -- Totals per terminal state: counted through jobs_by_finish up to the cap,
  -- estimated beyond it (a count(*) of a million rows is what this avoids).
  FOREACH v_state IN ARRAY ARRAY['succeeded', 'failed', 'expired', 'cancelled']::idemq.job_state[] LOOP
    SELECT count(*) INTO v_count
    FROM (SELECT FROM idemq.jobs j
          WHERE j.state = v_state AND j.finished_at IS NOT NULL
          LIMIT exact_up_to + 1) s;
    CONTINUE WHEN v_count = 0;
    queue := NULL;
    task := NULL;
    metric := v_state::text;
    IF v_count <= exact_up_to THEN
      value := v_count;
      exact := true;
    ELSE
      SELECT c.reltuples * s.most_common_freqs[array_position(s.most_common_vals::text::text[], v_state::text)]
      INTO v_estimate
      FROM pg_class c
      LEFT JOIN pg_stats s
        ON s.schemaname = 'idemq' AND s.tablename = 'jobs' AND s.attname = 'state'
      WHERE c.oid = 'idemq.jobs'::regclass AND c.reltuples > 0;
      value := greatest(exact_up_to + 1, coalesce(round(v_estimate), 0))::bigint;
      exact := false;
    END IF;
    RETURN NEXT;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.overview(interval, bigint) IS
  'Dashboard overview: exact active counts and recent finishes per queue and task, terminal totals exact up to a cap and estimated beyond it.';

-- Hand-written reversal of the schema changes above goes here, after the functions.
-- As 0001_init created it. Built without CONCURRENTLY (migrations run in a
-- transaction): enqueues wait for the build.
CREATE INDEX jobs_runnable ON idemq.jobs (priority DESC, run_at, id)
  WHERE state IN ('enqueued', 'scheduled');
