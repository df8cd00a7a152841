-- idemq.claim(worker_id text, queues text[] DEFAULT NULL, batch_size int DEFAULT 1,
--   lease interval DEFAULT '30 seconds', tasks text[] DEFAULT NULL, token boolean DEFAULT false)
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
--   * Returns rows of idemq.claimed_job: id, task, queue, payload,
--     attempt, max_attempts, idempotency_key, lease_expires_at, reclaimed,
--     traceparent, lease_token, job_id, timeout, concurrency_key, in claim
--     order. id is job_id under its 0.1.0 name, kept so 0.1.0 consumers read
--     it through an upgrade (deprecated: read job_id). concurrency_key is the
--     job's key (NULL without one). complete_and_take_next hands over only
--     the next jobs of keys its completions free, so a batch with no keyed
--     job can be completed with complete_many and lose nothing.
--   * Each claimed job moves to processing with attempt + 1, locked_by =
--     worker_id, locked_at = now(), lease_expires_at = now() + lease, or
--     now() + the job's timeout when that is shorter (a time limit no lease
--     outlives; heartbeat() keeps to it, and timeout is returned so a worker
--     can abort its handler then), and progress cleared (NULL: the new
--     attempt has reported none, progress()). With token => true it also
--     gets a new lease_token (gen_random_uuid(): 122 random bits), and
--     (job_id, attempt, lease_token) is the fencing token for complete,
--     complete_many, fail, snooze, heartbeat, progress and effect_claim's job binding:
--     the attempt fences out a stale attempt of the same worker pool, the
--     token another worker that guesses the attempt (attempts are small
--     numbers). The token is handed out here only, to the caller: no function
--     returns it again and no error names it. Without it (the default, as
--     0.1.0 claimed) lease_token is NULL and (job_id, attempt) fences alone:
--     the TypeScript worker always asks for one; a SQL consumer should too.
--   * reclaimed is true when the previous attempt lost its lease (its effect
--     may have happened: reconcile first).
--   * Durability: a claim that hands out jobs with token => true commits
--     asynchronously (SET LOCAL synchronous_commit = off, to the end of the
--     caller's transaction, which it makes asynchronous too), so its answer
--     does not wait for the WAL flush. A server crash within about 3 x
--     wal_writer_delay of that commit (0.6 s at the default) can undo it
--     whole (the jobs, their counts, flow-control slots and rate starts):
--     the jobs are handed out again with the same attempt, reclaimed false,
--     and new lease tokens, which fence the first holder out. Any later
--     durable commit (heartbeat, progress, effect_claim, a step, complete)
--     makes the claim durable first (the WAL is one sequence), so only a
--     holder that wrote nothing through idemq yet can run the same attempt
--     twice. Without a token, or when it takes no job, the commit is as the
--     caller's settings say.
--   * traceparent: the trace context enqueue stored (NULL without one), so
--     the worker's attempt span continues the producer's trace.
--   * Never takes a job in processing: a lease that ran out is taken away
--     only by rescue().
--   * Flow control (set_limit, pause; docs/design.md, "Flow control"): a
--     job is handed out only while neither its queue nor its task is paused
--     (paused keys are dropped before any job is read), with a free slot of
--     each of its scopes' concurrency limits, held by this attempt until it
--     leaves processing (complete, fail, snooze, cancel, rescue after the
--     lease, retention: whoever moves it; the job's queue_slot and
--     task_slot name the stripes whose slots this attempt took, NULL for
--     none), and an
--     unused start of each of its scopes' rate limits: no window of per
--     holds more than rate claims of a scope, timed by the claim's
--     transaction time (the jobs'
--     locked_at; retries count). Slots (in stripes: idemq.limit_slots) and
--     starts are taken FOR UPDATE SKIP LOCKED and judged on their rows' own
--     columns, so concurrent claims never admit more than the limits,
--     whatever their interleaving.
--   * Short batches under limits: fewer than batch_size jobs (none included)
--     while runnable jobs remain, when a scope has no slot or start left or
--     another claim holds the stripes or starts there are; the jobs read and
--     not started stay locked until this transaction ends. Without a row in
--     idemq.limits the batch is as without flow control, and the cost is one
--     read of that table. Under a concurrency limit without a rate (one
--     scope per job), the slots cost a locked probe and one HOT update per
--     stripe used (usually one per claim, whatever the batch), and the
--     release one appended row per statement and stripe (the jobs trigger):
--     bench/FINDINGS.md, "Flow control: what a limited claim costs".
--   * Cost: one index descent per distinct task or queue present, and per
--     (task, queue) key; one key reads batch_size runnable jobs. k keys are
--     merged reading each only as far as the claim order needs: a first
--     block of max(1, ceil(2 x batch_size / k)) jobs of each (at most k + 2 x
--     batch_size in all), then only keys whose last job read precedes the
--     one that would complete the batch, never past it. 50,000 runnable jobs,
--     claim(batch_size => 100), jobs read by the walks: about 280 over 10
--     pairs, 200-240 over 50, 200-300 over 200 (k x batch_size before:
--     1,000, 5,000, 20,000), 150 when one of 50 pairs holds all but 49 (149
--     before). No worst-case bound below k x batch_size is proven for the
--     later rounds. Filtered by queues or tasks, a backlog in another queue
--     or of another task does not slow it. Unfiltered, its keys are every
--     (task, queue) pair with runnable jobs (an index in claim order alone
--     would read batch_size in one walk, but it cost every enqueue a second
--     index entry, for claims only SQL clients make: workers pass their
--     tasks).
-- Concurrency: FOR UPDATE SKIP LOCKED over the partial index
--   jobs_runnable_by_task_queue, walked one (task, queue) key at a time
--   (keyed by _name_key of each name, the names compared too):
--   concurrent claimers never block each other and never get the same job.
--   Jobs locked by another transaction (being claimed, cancelled...) are
--   skipped, not waited for. A claim of several keys locks only the jobs it
--   takes, and a held job at its merge's frontier or bound is passed over
--   like any other (test/sql/claim-keys.test.ts). Holds idemq.limits'
--   ACCESS SHARE lock to the end of its transaction (a set_limit giving a
--   concurrency waits for it); never waits on a slot or start row.
-- Errors: 22004 worker_id/batch_size NULL (token NULL is false); 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes (idemq._limit), batch_size outside 1..1000, empty
--   queue or task name, bad lease.
-- Tests: test/sql/claim.test.ts, test/sql/claim-keys.test.ts, test/sql/claim-concurrency.test.ts,
--   test/sql/fencing.test.ts, test/sql/traceparent.test.ts, test/sql/flow-control.test.ts,
--   test/sql/flow-control-concurrency.test.ts, test/worker/flow-control-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.claim(
  worker_id text,
  queues text[] DEFAULT NULL,
  batch_size int DEFAULT 1,
  lease interval DEFAULT '30 seconds',
  tasks text[] DEFAULT NULL,
  token boolean DEFAULT false)
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
  v_limited boolean;
  v_take int := batch_size;
  v_caps int[];
  v_queue_slots int[];
  v_task_slots int[];
BEGIN
  PERFORM idemq._check_claimer('claim', worker_id, queues, tasks, lease);
  IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN batch_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('claim: batch_size must be between 1 and 1000, not %s', coalesce(batch_size::text, 'NULL')),
      HINT = 'Claim at most as many jobs as the worker can start before their leases need a heartbeat.';
  END IF;
  -- Flow control (docs/design.md, "Flow control"): with no row in
  -- idemq.limits, this one read is all a claim pays. The table's ACCESS
  -- SHARE lock, held to the end of the transaction, is what a set_limit
  -- giving a concurrency waits for.
  -- A row holding nothing but a hold that has passed (hold()) does not count.
  v_limited := EXISTS (SELECT FROM idemq.limits l
                       WHERE NOT (l.held_until <= now() AND NOT l.paused AND l.concurrency IS NULL
                                  AND l.rate IS NULL AND l.per_key IS NULL));

  -- Two steps: lock the jobs (SKIP LOCKED, in claim order) into an array, then
  -- update them by primary key. One UPDATE joined to the locking subquery let
  -- the planner hash the whole jobs table for claims of a few hundred (seen in
  -- EXPLAIN: a sequential scan of every row, finished ones included, per
  -- claim); "id = ANY (array)" is an index probe per job whatever the table
  -- holds. The jobs whose previous attempt lost its lease are noted before the
  -- update resets the flag.
  --
  -- One index holds the runnable jobs: jobs_runnable_by_task_queue
  -- (_name_key(task), _name_key(queue), priority DESC, run_at, id), walked
  -- one (task, queue) key at a time, where an equality on both leading
  -- columns leaves that key's jobs, already in claim order; each walk then
  -- compares the names themselves (a Filter), so two names with one 64-bit
  -- key never mix (_name_key). The keys: the listed tasks crossed with the
  -- listed queues; for a list that is NULL, the values present among
  -- runnable jobs, read by a loose index scan (one index descent per value:
  -- "next key after this one", the name read from the row found), and for
  -- an unfiltered claim the (task, queue) pairs present, read the same way;
  -- so finding the keys costs the number of distinct keys, tasks or queues,
  -- not backlogs. The loose scans read keys, not names: a name whose key
  -- another name present shares is not listed (_name_key says what that
  -- costs).
  -- Why keys and not the names: with the variable-width names first,
  -- every comparison of an index insertion walked them to reach priority,
  -- run_at and id (_name_key; measured: bench/FINDINGS.md, "Why the SQL is
  -- written as it is").
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
  -- (task key, queue key) > (k.task_key, k.queue_key), which is an Index
  -- Cond that starts the descent at the next pair. Spelt "j.task > $1 OR
  -- (j.task = $1 AND j.queue > $2)" it is a Filter on a walk from the first
  -- entry: EXPLAIN (ANALYZE, BUFFERS), generic plan, 50,000 runnable jobs
  -- over 50 pairs, the step after the 49th pair: Rows Removed by Filter:
  -- 44000, 917 buffers, 8.6 ms; as a row comparison, 5 buffers, 0.04 ms.
  -- Third trap (0028), in the queue scan of a claim by tasks: a task-name
  -- Filter on its step ("j.task = k.task") made the planner expect one row
  -- and read the task's whole key with a Bitmap Heap Scan and a sort
  -- (EXPLAIN ANALYZE, generic plan, 50,000 runnable jobs over 10 pairs:
  -- rows=2500 per step); on the keys alone it is an Index Scan that stops
  -- at the first entry (rows=1 per step). So the step compares keys only.
  -- Fourth trap (0019, gone with jobs_runnable): with statistics that saw
  -- one queue and one task, an equality on either looked like it kept every
  -- row, and a generic plan tied the two indexes and walked jobs_runnable
  -- with the filter again (Rows Removed by Filter: 100000 per key, 201 ms);
  -- the schema sets n_distinct = 100 on both columns, which the key columns
  -- of the index (expressions, with statistics of their own) no longer
  -- read. n_distinct stays (the schema's, harmless here).
  IF queues IS NULL AND tasks IS NULL THEN
    WITH RECURSIVE present(task_key, queue_key, task, queue) AS (
      (SELECT idemq._name_key(j.task), idemq._name_key(j.queue), j.task, j.queue
       FROM idemq.jobs j
       WHERE j.state IN ('enqueued', 'scheduled')
       ORDER BY idemq._name_key(j.task), idemq._name_key(j.queue)
       LIMIT 1)
      UNION ALL
      SELECT n.task_key, n.queue_key, n.task, n.queue
      FROM present k
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.task) AS task_key, idemq._name_key(j.queue) AS queue_key, j.task, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND (idemq._name_key(j.task), idemq._name_key(j.queue)) > (k.task_key, k.queue_key)
        ORDER BY idemq._name_key(j.task), idemq._name_key(j.queue)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present k;
  ELSIF tasks IS NULL THEN
    WITH RECURSIVE present(task_key, task) AS (
      (SELECT idemq._name_key(j.task), j.task
       FROM idemq.jobs j
       WHERE j.state IN ('enqueued', 'scheduled')
       ORDER BY idemq._name_key(j.task)
       LIMIT 1)
      UNION ALL
      SELECT n.task_key, n.task
      FROM present t
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.task) AS task_key, j.task
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled') AND idemq._name_key(j.task) > t.task_key
        ORDER BY idemq._name_key(j.task)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(t.task ORDER BY t.task, q.queue), '{}'),
           coalesce(array_agg(q.queue ORDER BY t.task, q.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present t CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q;
  ELSIF queues IS NULL THEN
    WITH RECURSIVE present(task, queue_key, queue) AS (
      SELECT u.task, n.queue_key, n.queue
      FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) u
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.queue) AS queue_key, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND idemq._name_key(j.task) = idemq._name_key(u.task)
        ORDER BY idemq._name_key(j.queue)
        LIMIT 1
      ) n
      UNION ALL
      SELECT k.task, n.queue_key, n.queue
      FROM present k
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.queue) AS queue_key, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND idemq._name_key(j.task) = idemq._name_key(k.task)
          AND idemq._name_key(j.queue) > k.queue_key
        ORDER BY idemq._name_key(j.queue)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present k;
  ELSE
    SELECT coalesce(array_agg(t.task), '{}'), coalesce(array_agg(q.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) t
    CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q;
  END IF;

  IF v_limited THEN
    -- Keys paused or without a free slot or start go; v_take bounds the walk.
    -- v_limited becomes whether a key left has a concurrency or a rate limit:
    -- without one, _claim_take would find nothing to take (calling it cost a
    -- claim as much as a limit of its own: bench/FINDINGS.md). A concurrency
    -- limit cannot appear meanwhile (its set_limit waits for this
    -- transaction's lock on idemq.limits); a rate or a pause committed from
    -- here on counts from the next claim.
    SELECT g.tasks, g.queues, g.take, g.caps, g.limited INTO v_key_tasks, v_key_queues, v_take, v_caps, v_limited
    FROM idemq._claim_gate(v_key_tasks, v_key_queues, batch_size) g;
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
        AND idemq._name_key(j.task) = idemq._name_key(v_key_tasks[1])
        AND idemq._name_key(j.queue) = idemq._name_key(v_key_queues[1])
        AND j.task = v_key_tasks[1]
        AND j.queue = v_key_queues[1]
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT v_take
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSIF v_caps IS NOT NULL THEN
    -- Several keys, some capped by flow control below the batch: each key
    -- read up to its cap (_claim_capped).
    SELECT m.ids, m.lost INTO v_ids, v_lost
    FROM idemq._claim_capped(v_key_tasks, v_key_queues, v_caps, v_take) m;
  ELSE
    -- Several keys: _claim_merge reads each key only as far as the claim
    -- order needs and locks the jobs it takes (its header says how, and
    -- what it costs). Only a claim of several keys pays its call.
    SELECT m.ids, m.lost INTO v_ids, v_lost
    FROM idemq._claim_merge(v_key_tasks, v_key_queues, v_take) m;
  END IF;
  IF v_limited AND cardinality(v_ids) > 0 THEN
    -- The slots and starts of the jobs taken, in claim order; a job that
    -- gets none it needs is left (still locked, until this transaction ends).
    -- Of one key, the key goes along (_claim_take then reads no job).
    SELECT t.ids, t.queue_slots, t.task_slots INTO v_ids, v_queue_slots, v_task_slots
    FROM idemq._claim_take(v_ids,
                           CASE WHEN cardinality(v_key_tasks) = 1 THEN v_key_tasks[1] END,
                           CASE WHEN cardinality(v_key_tasks) = 1 THEN v_key_queues[1] END) t;
  END IF;
  IF cardinality(v_ids) = 0 THEN
    RETURN;
  END IF;
  IF claim.token THEN
    -- Asynchronous commit (issue 29): the claim's answer does not wait for
    -- its WAL flush, the one wait on an idle worker's path that no CPU work
    -- removes (0.3 ms on a quiet disk, 3 ms under the shared disk's load:
    -- bench/FINDINGS.md, "The claim's round trip"). Only a server crash can
    -- lose the claim, within about 3 x wal_writer_delay (0.6 s at the
    -- default) of its commit, and it loses it whole: the jobs, their
    -- counters, flow-control slots and starts go back to before it. What
    -- makes that safe is the token: the job is handed out again with the
    -- same attempt but a new lease_token, so the first holder, if it
    -- outlived the crash, is fenced out (IQ410) of complete, fail, snooze,
    -- heartbeat, progress, steps and effect_claim. Any durable commit of a
    -- later call (a heartbeat, an effect claim, a step, complete) flushes
    -- the WAL through this commit first, so a holder that has written
    -- anything through idemq holds a durable claim. Without a token the
    -- attempt fences alone and would be handed out twice: that claim stays
    -- synchronous. SET LOCAL lasts to the end of the caller's transaction
    -- (no SET clause of this function names it), never past it: nothing
    -- stays on a pooled connection.
    SET LOCAL synchronous_commit = off;
  END IF;

  -- What starting an attempt writes: the same columns and values in both
  -- branches (but the slots) and in the hand-off of _key_promote, held equal
  -- by test/sql/predicates.test.ts ("what starting an attempt writes").
  IF v_queue_slots IS NULL AND v_task_slots IS NULL THEN
    RETURN QUERY
    WITH claimed AS (
      UPDATE idemq.jobs AS j
      SET state = 'processing', attempt = j.attempt + 1, locked_by = worker_id,
          locked_at = now(), lease_lost = false,
          -- Never past the job's time limit (_lease_until, as heartbeat()).
          lease_expires_at = idemq._lease_until(now(), j.timeout, lease),
          lease_token = CASE WHEN claim.token THEN gen_random_uuid() END,
          queue_slot = NULL, task_slot = NULL, progress = NULL
      WHERE j.id = ANY (v_ids)
      RETURNING j.id, j.task, j.queue, j.payload, j.attempt, j.max_attempts,
                j.idempotency_key, j.lease_expires_at, j.id = ANY (v_lost) AS reclaimed,
                j.traceparent, j.lease_token, j.priority, j.run_at, j.timeout, j.concurrency_key
    )
    SELECT c.id, c.task, c.queue, c.payload, c.attempt, c.max_attempts,
           c.idempotency_key, c.lease_expires_at, c.reclaimed, c.traceparent, c.lease_token, c.id, c.timeout,
           c.concurrency_key
    FROM claimed c
    ORDER BY c.priority DESC, c.run_at, c.id;
  ELSE
    -- The stripes whose slots were taken go on the jobs, where the jobs
    -- trigger reads them when the attempt ends ("id = ANY" drives the walk;
    -- the join pairs each job with its stripes).
    RETURN QUERY
    WITH claimed AS (
      UPDATE idemq.jobs AS j
      SET state = 'processing', attempt = j.attempt + 1, locked_by = worker_id,
          locked_at = now(), lease_lost = false,
          -- Never past the job's time limit (_lease_until, as heartbeat()).
          lease_expires_at = idemq._lease_until(now(), j.timeout, lease),
          lease_token = CASE WHEN claim.token THEN gen_random_uuid() END,
          queue_slot = u.queue_slot, task_slot = u.task_slot, progress = NULL
      FROM unnest(v_ids, v_queue_slots, v_task_slots) AS u(id, queue_slot, task_slot)
      WHERE j.id = ANY (v_ids) AND j.id = u.id
      RETURNING j.id, j.task, j.queue, j.payload, j.attempt, j.max_attempts,
                j.idempotency_key, j.lease_expires_at, j.id = ANY (v_lost) AS reclaimed,
                j.traceparent, j.lease_token, j.priority, j.run_at, j.timeout, j.concurrency_key
    )
    SELECT c.id, c.task, c.queue, c.payload, c.attempt, c.max_attempts,
           c.idempotency_key, c.lease_expires_at, c.reclaimed, c.traceparent, c.lease_token, c.id, c.timeout,
           c.concurrency_key
    FROM claimed c
    ORDER BY c.priority DESC, c.run_at, c.id;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.claim(text, text[], int, interval, text[], boolean) IS
  'Claim up to batch_size runnable jobs (priority desc, run_at, id) under a lease; FOR UPDATE SKIP LOCKED.';
