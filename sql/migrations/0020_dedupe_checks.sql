-- Migration 0020_dedupe_checks (issue 10): each argument rule written once: _pairs_by_id checks the (job_ids, attempts) pairs of complete_many and heartbeat; _check_key_owner, _check_key_bytes and _raise_not_owner hold the key and owner checks and the IQ410 of the effect functions and guard; _names_valid and _raise_bad_names the queue and task lists of claim, worker_seen, wait_for_jobs and stop_waiting; _raise_null_argument the 22004 of enqueue's and schedule's defaulted arguments. Messages, SQLSTATEs, HINTs and DETAILs unchanged.
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

-- ---- sql/functions/_check_key_bytes.sql ----
-- idemq._check_key_bytes(operation text, key text, owner text) RETURNS void
--
-- Refuses a guard or effect key, or an effect owner, longer than key_bytes
-- bytes (idemq._limit): the one place their HINTs are written.
--
-- Guarantees: returns only when key and owner are each NULL (not checked:
--   the caller's NULL check words that error) or at most key_bytes bytes;
--   the key is checked first. Messages name `operation`, the function the
--   user called (_check_size).
-- Concurrency: none.
-- Errors: 22023 key or owner over key_bytes bytes.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_key_bytes(operation text, key text, owner text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM idemq._check_size(operation, 'key', _check_key_bytes.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  -- guard has no owner: skip the call rather than let _check_size return.
  IF _check_key_bytes.owner IS NOT NULL THEN
    PERFORM idemq._check_size(operation, 'owner', _check_key_bytes.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_key_bytes(text, text, text) IS
  'Raise 22023 when a guard or effect key, or an effect owner, is over key_bytes bytes.';

-- ---- sql/functions/_names_valid.sql ----
-- idemq._names_valid(names text[]) RETURNS boolean
--
-- Is `names` a valid filter of queue or task names: NULL (every queue, any
-- task), or a non-empty list of non-empty names? The test of claim,
-- worker_seen, wait_for_jobs and stop_waiting; _raise_bad_names words the
-- error when it fails.
--
-- Guarantees: the one definition of a valid name list. "'' = ANY (names) IS
--   FALSE" holds only when no name is '' and none is NULL (a NULL element
--   makes the comparison NULL, not false). One expression without a
--   subquery, neither STRICT nor plpgsql, so it is inlined and plpgsql
--   evaluates it as a simple expression: claim's checks cost no function
--   call. PG15, 50,000 claims of an empty queue in one session: a plpgsql
--   check helper (with its SET clause) took claim from 42 to 52 us a call;
--   this, 34 us (the EXISTS over unnest it replaced ran a query per list).
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/bad-input.test.ts, test/sql/workers.test.ts, test/sql/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._names_valid(names text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN names IS NULL OR (cardinality(names) > 0 AND ('' = ANY (names)) IS FALSE);

COMMENT ON FUNCTION idemq._names_valid(text[]) IS
  'NULL, or a non-empty list of names none of which is NULL or empty: a valid queue or task filter.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._pairs_by_id;
-- ---- sql/functions/_pairs_by_id.sql ----
-- idemq._pairs_by_id(job_ids bigint[], attempts int[], operation text, null_hint text,
--   OUT ids bigint[], OUT attempts_by_id int[])
--
-- Checks the (job_ids[i], attempts[i]) pairs of complete_many and heartbeat,
-- and returns them sorted by id for width_bucket():
-- attempts_by_id[width_bucket(id, ids)] is the attempt given for id, found by
-- binary search.
--
-- Guarantees: the one definition of a valid pair list (both arrays given, of
--   equal length, at most 10000 ids), checked in the call that sorts it, so
--   the callers pay no second function call. Each id once, with its highest
--   attempt (attempts only grow: only the latest can hold the job); NULL ids
--   dropped; empty arrays for no pairs. Messages name `operation`, the
--   function the user called; `null_hint` is the HINT of the NULL case.
-- Concurrency: none (reads only its arguments).
-- Errors: 22004 job_ids or attempts NULL; 22023 arrays of different lengths
--   or more than 10000 ids.
-- Tests: test/sql/complete.test.ts, test/sql/heartbeat.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._pairs_by_id(job_ids bigint[], attempts int[], operation text, null_hint text,
                                              OUT ids bigint[], OUT attempts_by_id int[])
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF job_ids IS NULL OR attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_ids and attempts must not be NULL', operation),
      HINT = null_hint;
  END IF;
  IF cardinality(job_ids) <> cardinality(attempts) OR cardinality(job_ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: job_ids (%s) and attempts (%s) must have the same length, at most 10000',
                       operation, cardinality(job_ids), cardinality(attempts)),
      HINT = 'attempts[i] is the attempt that claimed job_ids[i].';
  END IF;
  -- plpgsql, not LANGUAGE sql: a SQL function with a SET clause is never
  -- inlined, and PostgreSQL 15-17 parse and plan its body again at every
  -- call from complete_many's or heartbeat's statement (18 caches it);
  -- plpgsql keeps the plan for the session. As LANGUAGE sql, `npm run bench
  -- -- profile` (process.c10, 20,000 jobs, PG15): 180 us per call, 19.3 us
  -- per completed job.
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}')
    INTO ids, attempts_by_id
  FROM (SELECT u.id, max(u.attempt) AS attempt
        FROM unnest(job_ids, attempts) AS u(id, attempt)
        WHERE u.id IS NOT NULL
        GROUP BY u.id) t;
END;
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[], text, text) IS
  'Check (job_id, attempt) pairs and sort them by id, each id once with its highest attempt, for width_bucket() lookups.';

-- ---- sql/functions/_raise_bad_names.sql ----
-- idemq._raise_bad_names(operation text, what text, names text[], null_means text, hint text,
--   max_length int DEFAULT NULL) RETURNS void
--
-- Raises 22023 for a list of queue or task names (`what`: 'queues' or
-- 'tasks') that `operation` refuses: callers test the list with _names_valid
-- (and worker_seen the length of queue names as well) and call this only
-- when it fails, so a valid call costs no function call.
--
-- Guarantees: always raises; the one wording of the error: the message names
--   `operation`, the function the user called, says what NULL stands for
--   (`null_means`, e.g. 'all queues'), the longest name with max_length, and
--   quotes an excerpt (_excerpt) of the list; `hint` is its HINT.
-- Concurrency: none.
-- Errors: always 22023.
-- Tests: test/sql/bad-input.test.ts, test/sql/workers.test.ts, test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_bad_names(operation text, what text, names text[], null_means text, hint text,
                                                  max_length int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22023',
    -- left(what, -1): 'queues' -> 'queue names'.
    MESSAGE = format('%s: %s must be NULL (%s) or a non-empty list of %s names%s, not %s',
                     operation, what, null_means, left(what, -1),
                     CASE WHEN max_length IS NOT NULL THEN format(' of 1 to %s characters', max_length) END,
                     idemq._excerpt(names::text)),
    HINT = hint;
END;
$$;

COMMENT ON FUNCTION idemq._raise_bad_names(text, text, text[], text, text, int) IS
  'Raise 22023 for a queue or task filter that is neither NULL nor a non-empty list of non-empty names.';

-- ---- sql/functions/_raise_not_owner.sql ----
-- idemq._raise_not_owner(operation text, key text, owner text, hint text) RETURNS void
--
-- Raises IQ410 after effect_done or effect_release (`operation`) found no
-- claim on effect `key` held by `owner`.
--
-- Guarantees: always raises; the one wording of the error and of its DETAIL
--   ({"key","owner"}, in full; the message quotes excerpts). `hint` says
--   what the caller should do, which differs between the two.
-- Concurrency: none (reads nothing).
-- Errors: IQ410 with DETAIL {"key","owner"}.
-- Tests: test/sql/effects.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_not_owner(operation text, key text, owner text, hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('%s: the claim on effect "%s" is not held by %s',
                     operation, idemq._excerpt(_raise_not_owner.key), idemq._excerpt(_raise_not_owner.owner)),
    DETAIL = jsonb_build_object('key', _raise_not_owner.key, 'owner', _raise_not_owner.owner)::text,
    HINT = hint;
END;
$$;

COMMENT ON FUNCTION idemq._raise_not_owner(text, text, text, text) IS
  'Raise IQ410 (DETAIL {"key","owner"}) for an effect claim that this owner does not hold.';

-- ---- sql/functions/_raise_null_argument.sql ----
-- idemq._raise_null_argument(operation text, argument text) RETURNS void
--
-- Raises 22004 for an argument of `operation` passed as NULL where it has a
-- default: enqueue's and schedule's optional arguments.
--
-- Guarantees: always raises; the one wording of that error, naming the
--   argument in the message and the HINT. Callers pick the first NULL
--   argument themselves and call this only then, so a valid call costs
--   nothing.
-- Concurrency: none.
-- Errors: always 22004.
-- Tests: test/sql/bad-input.test.ts, test/sql/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_null_argument(operation text, argument text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22004',
    MESSAGE = format('%s: %s must not be NULL', operation, argument),
    HINT = format('Pass a value for %s, or leave the argument out to use its default.', argument);
END;
$$;

COMMENT ON FUNCTION idemq._raise_null_argument(text, text) IS
  'Raise 22004 for an argument passed as NULL where it has a default, with a HINT to leave it out.';

-- ---- sql/functions/_check_key_owner.sql ----
-- idemq._check_key_owner(operation text, key text, owner text) RETURNS void
--
-- Refuses the key and owner of effect_done or effect_release unless both are
-- non-empty strings of at most key_bytes bytes: the claim they name is
-- effect_claim's, made with the same key and owner.
--
-- Guarantees: returns only for a key and an owner that effect_claim accepts
--   (sizes: _check_key_bytes). Messages name `operation`, the function the
--   user called.
-- Concurrency: none.
-- Errors: 22004 key or owner NULL; 22023 key or owner empty, or over
--   key_bytes bytes.
-- Tests: test/sql/bad-input.test.ts, test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_key_owner(operation text, key text, owner text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_key_owner.key IS NULL OR _check_key_owner.owner IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: key and owner must not be NULL', operation),
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  IF _check_key_owner.key = '' OR _check_key_owner.owner = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: key and owner must be non-empty', operation),
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  PERFORM idemq._check_key_bytes(operation, _check_key_owner.key, _check_key_owner.owner);
END;
$$;

COMMENT ON FUNCTION idemq._check_key_owner(text, text, text) IS
  'Raise 22004/22023 unless the key and owner of effect_done or effect_release are non-empty and within key_bytes.';

-- ---- sql/functions/_wait_markers.sql ----
-- idemq._wait_markers(queues text[], operation text, taking boolean)
--   RETURNS TABLE(marker bigint, held boolean)
--
-- The waiting markers of `queues` (NULL: the all-queues marker), each once,
-- and whether this session holds it: what wait_for_jobs takes (`taking`) and
-- stop_waiting releases.
--
-- Guarantees:
--   * Validates `queues` first; `operation` names the caller in errors.
--   * Bounded: more than _wait_marker_limit() distinct queues stand for the
--     all-queues marker instead, and so, when `taking`, do queues whose new
--     markers would take this session past that many markers held. A session
--     therefore holds at most _wait_marker_limit() + 1 markers whatever lists
--     it passes. Waiting for every queue is always safe: it only costs NOTIFYs
--     for queues the session does not claim from.
-- Concurrency: reads this session's own locks in pg_locks, once.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_markers(queues text[], operation text, taking boolean)
RETURNS TABLE(marker bigint, held boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_held bigint[];
  v_keys bigint[];
BEGIN
  IF NOT idemq._names_valid(queues) THEN
    PERFORM idemq._raise_bad_names(operation, 'queues', queues, 'all queues',
      'Pass the queues you claim from, or NULL for every queue.');
  END IF;
  -- pg_locks copies the whole lock table: read it once, not once per key.
  SELECT coalesce(array_agg((l.classid::bigint << 32) | l.objid::bigint), '{}') INTO v_held
  FROM pg_locks l
  WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock'
    AND l.objsubid = 1 AND l.granted;
  SELECT array_agg(DISTINCT idemq._wait_key(q)) INTO v_keys
  FROM unnest(coalesce(queues, ARRAY[NULL::text])) q;
  IF cardinality(v_keys) > idemq._wait_marker_limit()
     OR (taking AND cardinality(v_held) + (SELECT count(*) FROM unnest(v_keys) k WHERE k <> ALL (v_held))
                    > idemq._wait_marker_limit()) THEN
    v_keys := ARRAY[idemq._wait_key(NULL)];
  END IF;
  RETURN QUERY SELECT k, k = ANY (v_held) FROM unnest(v_keys) k;
END;
$$;

COMMENT ON FUNCTION idemq._wait_markers(text[], text, boolean) IS
  'The waiting markers of these queues (wait_for_jobs), at most _wait_marker_limit() per session, and whether this session holds each.';

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
  IF NOT idemq._names_valid(queues) THEN
    PERFORM idemq._raise_bad_names('claim', 'queues', queues, 'all queues', 'Pass NULL to claim from every queue.');
  END IF;
  IF NOT idemq._names_valid(tasks) THEN
    PERFORM idemq._raise_bad_names('claim', 'tasks', tasks, 'any task',
      'Pass the names of the tasks this worker has, or NULL to claim jobs of any task.');
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

-- ---- sql/functions/complete_many.sql ----
-- idemq.complete_many(job_ids bigint[], attempts int[]) RETURNS SETOF bigint
--
-- Marks many jobs succeeded in one statement; returns the ids it completed.
--
-- Guarantees:
--   * locked_by keeps the worker whose attempt succeeded (for the job's timeline).
--   * Pairs job_ids[i] with attempts[i]; completes each pair whose attempt
--     still holds its job, and skips the others (lease lost, unknown id)
--     without raising: for batched completion of jobs whose effects are
--     already committed (or idempotent). A caller that needs all-or-nothing
--     uses complete() in its transaction.
--   * Keys, continuations and retention 0 as complete(): with retention 0
--     the completed rows are deleted (jobs with children are updated and
--     left to apply_retention); retention is read once per call.
--   * An id given more than once counts once, with its highest attempt
--     (attempts only grow: only the latest can hold the job).
--   * Reads jobs by primary key only: the cost follows the batch, not the
--     rows the table keeps.
-- Concurrency: updates the rows in id order (no deadlock between two batches).
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths or more than 10,000 ids
--   (both checked by _pairs_by_id).
-- Tests: test/sql/complete.test.ts, test/sql/claim.test.ts (no sequential scan),
--   test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq.complete_many(job_ids bigint[], attempts int[])
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_attempts int[];
  v_r record;
  v_gone bigint[];
BEGIN
  -- The pairs checked and sorted by id (_pairs_by_id), so width_bucket() finds an id's
  -- attempt by binary search. The UPDATE itself selects by "id = ANY (ids)", a primary-key probe
  -- per job whatever the table holds: joined to the arrays instead, the planner
  -- hashed or scanned the whole table for batches of a few hundred (seen in
  -- EXPLAIN). The held-check and the attempt sit in the UPDATE's own WHERE, so
  -- a row changed concurrently (rescue, a new claim) is re-checked on its newest
  -- version and skipped if no longer held by that attempt. No row lock first:
  -- that wrote a WAL record per job for nothing. "Held" is _held(), the lease
  -- columns, not "state = 'processing'", which matches the jobs_leases partial
  -- index: the planner then scanned every job in flight once per pair.
  SELECT p.ids, p.attempts_by_id INTO v_ids, v_attempts
  FROM idemq._pairs_by_id(job_ids, attempts, 'complete_many',
                          'Pass two arrays of equal length: the ids and attempts claim() returned.') p;

  SELECT * INTO v_r FROM idemq._success_retention() z;
  IF v_r.any_zero THEN
    -- Retention 0: delete instead of update, with the ledger write the
    -- trigger would make (as in complete()). The ids left (children, another
    -- retention, lost leases) take the UPDATE below in a statement of its
    -- own, so a row changed meanwhile (an enqueue setting has_children) is
    -- judged on its newest version; when every id went, it is skipped.
    WITH gone AS (
      DELETE FROM idemq.jobs AS j
      WHERE j.id = ANY (v_ids)
        AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
        AND idemq._held(j.lease_expires_at, j.locked_by)
        AND NOT j.has_children
        AND idemq._gone_on_success(j.task, j.queue, v_r.default_zero, v_r.zero_tasks, v_r.kept_tasks,
                                   v_r.zero_queues, v_r.kept_queues)
      RETURNING j.id, j.idempotency_key
    ), ledger AS (
      UPDATE idemq.keys AS k SET finished_state = 'succeeded', finished_at = now()
      FROM gone g WHERE k.key = g.idempotency_key AND k.job_id = g.id
    )
    SELECT coalesce(array_agg(g.id), '{}') INTO v_gone FROM gone g;
    RETURN QUERY SELECT unnest(v_gone);
    IF cardinality(v_gone) = cardinality(v_ids) THEN
      RETURN;
    END IF;
    -- What is left, still sorted by id (width_bucket needs the order).
    SELECT array_agg(p.id ORDER BY p.id), array_agg(p.attempt ORDER BY p.id) INTO v_ids, v_attempts
    FROM unnest(v_ids, v_attempts) p(id, attempt) WHERE NOT p.id = ANY (v_gone);
  END IF;

  RETURN QUERY
  UPDATE idemq.jobs AS j
  SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
  WHERE j.id = ANY (v_ids)
    AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.complete_many(bigint[], int[]) IS
  'Mark many (job_id, attempt) pairs succeeded; returns the ids completed, skipping lost leases.';

-- ---- sql/functions/effect_claim.sql ----
-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes',
--                    job_id bigint DEFAULT NULL, attempt int DEFAULT NULL)
--   RETURNS TABLE(status text, result jsonb)
--
-- The claim-first record for an effect outside the database (an email, a
-- charge, a webhook). Call it in its own transaction (autocommit) before the
-- external call, then effect_done() or effect_release().
--
-- Guarantees: status is one of
--   claimed   no record existed: this owner may make the call;
--   reclaimed an earlier claim is older than stale_after (its owner likely
--             died, perhaps after the call), or was made by an earlier
--             attempt of the caller's own job (job_id, attempt given and the
--             caller holds that attempt: the earlier one is fenced out, so
--             there is no need to wait out stale_after): check with the
--             external system first, or resend with the same idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at (or on the claim's job and attempt),
--   re-checked after a concurrent reclaimer commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner, key or owner over key_bytes
--   bytes (idemq._limit), stale_after <= 0 or over duration_days, or only one
--   of job_id and attempt given.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(
  key text,
  owner text,
  stale_after interval DEFAULT '10 minutes',
  job_id bigint DEFAULT NULL,
  attempt int DEFAULT NULL)
RETURNS TABLE(status text, result jsonb)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_round int := 0;
  v_row record;
BEGIN
  IF effect_claim.key IS NULL OR effect_claim.owner IS NULL OR effect_claim.stale_after IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'effect_claim: key, owner and stale_after must not be NULL',
      HINT = 'key names the effect (e.g. ''invoice-email:42''), owner names this attempt (e.g. ''job:7:2'').';
  END IF;
  IF effect_claim.key = '' OR effect_claim.owner = '' OR effect_claim.stale_after <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: key and owner must be non-empty and stale_after positive',
      HINT = 'stale_after should exceed the longest the external call can take.';
  END IF;
  IF (effect_claim.job_id IS NULL) <> (effect_claim.attempt IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: job_id and attempt go together',
      HINT = 'Pass both (the job and attempt this claim is made for, as claim() returned them) or neither.';
  END IF;
  PERFORM idemq._check_key_bytes('effect_claim', effect_claim.key, effect_claim.owner);
  PERFORM idemq._check_duration('effect_claim', 'stale_after', effect_claim.stale_after);

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at, job_id, attempt)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp(), effect_claim.job_id, effect_claim.attempt)
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    -- Stale, or left by an earlier attempt of the job the caller holds now
    -- (fencing: that attempt can no longer finish, so its claim is dead).
    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1,
        job_id = effect_claim.job_id, attempt = effect_claim.attempt
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND (e.claimed_at < clock_timestamp() - effect_claim.stale_after
           OR (e.job_id = effect_claim.job_id AND e.attempt < effect_claim.attempt
               AND EXISTS (SELECT 1 FROM idemq.jobs j
                           WHERE j.id = effect_claim.job_id AND j.attempt = effect_claim.attempt
                             AND idemq._held(j.lease_expires_at, j.locked_by))));
    IF FOUND THEN
      status := 'reclaimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    SELECT e.status, e.result INTO v_row FROM idemq.effects e WHERE e.key = effect_claim.key;
    IF FOUND THEN
      status := CASE WHEN v_row.status = 'done' THEN 'done' ELSE 'busy' END;
      result := v_row.result;
      RETURN NEXT; RETURN;
    END IF;
    -- released between our statements: claim again
    IF v_round >= 10 THEN
      status := 'busy'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval, bigint, int) IS
  'Claim-first record for an external effect: claimed | reclaimed (stale) | done (with result) | busy.';

-- ---- sql/functions/effect_done.sql ----
-- idemq.effect_done(key text, owner text, result jsonb) RETURNS void
--
-- Records that the claimed external effect happened, with what it returned.
--
-- Guarantees: afterwards effect_claim(key, ...) answers `done` with this
--   result, forever (until prune_keys passes its retention). Repeating the
--   call by the same owner is a no-op.
-- Concurrency: row lock on the record.
-- Errors: IQ410 the claim is not this owner's (reclaimed by another, or
--   never claimed; DETAIL {"key","owner"}); 22004 NULL key/owner; 22023 empty key/owner,
--   key or owner over key_bytes bytes (idemq._limit).
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_done(key text, owner text, result jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_owner text;
BEGIN
  PERFORM idemq._check_key_owner('effect_done', effect_done.key, effect_done.owner);
  UPDATE idemq.effects AS e
  SET status = 'done', done_at = now(), result = effect_done.result
  WHERE e.key = effect_done.key AND e.owner = effect_done.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  SELECT e.owner INTO v_owner FROM idemq.effects e
  WHERE e.key = effect_done.key AND e.status = 'done';
  IF v_owner IS NOT DISTINCT FROM effect_done.owner AND v_owner IS NOT NULL THEN
    RETURN;
  END IF;
  PERFORM idemq._raise_not_owner('effect_done', effect_done.key, effect_done.owner,
    'Another owner reclaimed it after it went stale: raise stale_after above the longest call.');
END;
$$;

COMMENT ON FUNCTION idemq.effect_done(text, text, jsonb) IS
  'Record that the claimed external effect happened (with its result); IQ410 if the claim is not this owner''s.';

-- ---- sql/functions/effect_release.sql ----
-- idemq.effect_release(key text, owner text) RETURNS void
--
-- Gives up a claim: the external call definitely did not happen, so a new
-- claim may make it.
--
-- Guarantees: deletes the claim record; the next effect_claim answers `claimed`.
-- Concurrency: row lock on the record.
-- Errors: IQ410 the claim is not this owner's (or does not exist; DETAIL
--   {"key","owner"}); IQ412 the effect is already done (it cannot be undone
--   by releasing; DETAIL {"key","status"}); 22004 NULL key/owner; 22023 empty key/owner,
--   key or owner over key_bytes bytes (idemq._limit).
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_release(key text, owner text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM idemq._check_key_owner('effect_release', effect_release.key, effect_release.owner);
  DELETE FROM idemq.effects AS e
  WHERE e.key = effect_release.key AND e.owner = effect_release.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM idemq.effects e WHERE e.key = effect_release.key AND e.status = 'done') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('effect_release: effect "%s" is already done and cannot be released', idemq._excerpt(effect_release.key)),
      DETAIL = jsonb_build_object('key', effect_release.key, 'status', 'done')::text,
      HINT = 'A done effect happened; do not retry it.';
  END IF;
  PERFORM idemq._raise_not_owner('effect_release', effect_release.key, effect_release.owner,
    'Another owner reclaimed it after it went stale; leave it to them.');
END;
$$;

COMMENT ON FUNCTION idemq.effect_release(text, text) IS
  'Give up a claim whose external call did not happen; IQ410 if not this owner''s.';

-- ---- sql/functions/enqueue.sql ----
-- idemq.enqueue(task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
--   run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, max_attempts int DEFAULT 10,
--   idempotency_key text DEFAULT NULL,
--   duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
--   backoff jsonb DEFAULT NULL, expires_at timestamptz DEFAULT NULL, after bigint[] DEFAULT NULL,
--   key_retention interval DEFAULT '14 days', traceparent text DEFAULT NULL)
--   RETURNS TABLE(job_id bigint, deduplicated boolean, job_traceparent text)
--
-- Adds a job, or returns the active job that already holds its idempotency key.
--
-- Guarantees:
--   * Without a key: always a new job.
--   * A key held by an active job (scheduled, enqueued, processing, awaiting)
--     returns that job with deduplicated = true, whatever the policy.
--   * A key whose latest job is terminal: duplicate_policy decides
--     (idemq._policy_rejects): a new job, or IQ409.
--   * run_at NULL means now; a job runnable now NOTIFYs idemq_jobs at commit
--     when a listener waits for its queue (wait_for_jobs; _notify_waiting),
--     so enqueueing inside the caller's transaction works like an outbox.
--   * after: the job waits in `awaiting` until every parent succeeded.
--   * key_retention (with a key): how long the key ledger keeps the key after
--     its job finished; prune_keys() never releases it sooner, whatever its
--     own older_than (which can only make it longer). Stored on the key row,
--     so apps with different retentions share one database. A later job
--     that takes the key over sets its own.
--   * expires_at may already be past: the job is never claimed, and rescue()
--     marks it expired.
--   * traceparent: the W3C trace context of the producer's span (version 00,
--     _is_traceparent), stored on a new job and handed to its worker by
--     claim(), which continues the trace. A duplicate stores nothing: the job
--     keeps the context of the enqueue that created it.
--   * job_traceparent: the trace context stored on the job returned: the
--     caller's own for a new job; for a duplicate (deduplicated = true) the
--     existing job's (NULL when it has none), so the duplicate's enqueue span
--     can link to the trace that created the job.
-- Concurrency: N concurrent calls with one key create exactly one job and all
--   get its id; if the first inserter rolls back, a waiter creates it (the key
--   row's primary key serialises them; see _resolve_keys).
-- Errors: 22004 a required argument is NULL; 22023 bad argument (empty task,
--   payload not an object, max_attempts < 1, malformed backoff, a queue name
--   over 1000 characters, run_at infinite, traceparent not a W3C
--   traceparent...) or over a limit of
--   idemq.settings (task_bytes, payload_bytes, key_bytes, parents_per_job:
--   _enqueue_limits, read once per call);
--   IQ409 the policy rejects (DETAIL {"key","existing_job_id","existing_state","policy"});
--   IQ422 the key is held by an active job for a different task or payload
--   (DETAIL {"key","existing_job_id"}); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts, test/sql/continuations.test.ts,
--   test/sql/bad-input.test.ts, test/sql/limits.test.ts, test/sql/traceparent.test.ts
CREATE OR REPLACE FUNCTION idemq.enqueue(
  task text,
  payload jsonb DEFAULT '{}',
  queue text DEFAULT 'default',
  run_at timestamptz DEFAULT NULL,
  priority int DEFAULT 0,
  max_attempts int DEFAULT 10,
  idempotency_key text DEFAULT NULL,
  duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
  backoff jsonb DEFAULT NULL,
  expires_at timestamptz DEFAULT NULL,
  after bigint[] DEFAULT NULL,
  key_retention interval DEFAULT '14 days',
  traceparent text DEFAULT NULL)
RETURNS TABLE(job_id bigint, deduplicated boolean, job_traceparent text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_null text;
  v_job idemq._planned_job;
  v_problem text[];
  v_limits idemq._enqueue_limits;
  v_key_job bigint;
  v_state idemq.job_state;
BEGIN
  v_null := CASE
    WHEN enqueue.task IS NULL THEN 'task'
    WHEN enqueue.payload IS NULL THEN 'payload'
    WHEN enqueue.queue IS NULL THEN 'queue'
    WHEN enqueue.priority IS NULL THEN 'priority'
    WHEN enqueue.max_attempts IS NULL THEN 'max_attempts'
    WHEN enqueue.duplicate_policy IS NULL THEN 'duplicate_policy'
    WHEN enqueue.key_retention IS NULL THEN 'key_retention'
  END;
  IF v_null IS NOT NULL THEN
    PERFORM idemq._raise_null_argument('enqueue', v_null);
  END IF;

  -- Parse and check: the arguments are typed already; the rules are the
  -- ones every enqueue_many element meets.
  v_job.ordinal := 1;
  v_job.outcome := 'created';
  v_job.task := enqueue.task;
  v_job.payload := enqueue.payload;
  v_job.queue := enqueue.queue;
  v_job.run_at := coalesce(enqueue.run_at, now());
  v_job.priority := enqueue.priority;
  v_job.max_attempts := enqueue.max_attempts;
  v_job.idempotency_key := enqueue.idempotency_key;
  v_job.duplicate_policy := enqueue.duplicate_policy;
  v_job.backoff := nullif(enqueue.backoff, 'null');
  v_job.expires_at := enqueue.expires_at;
  v_job.after := CASE WHEN cardinality(enqueue.after) > 0 THEN enqueue.after END;
  v_job.key_retention := enqueue.key_retention;
  v_job.traceparent := enqueue.traceparent;
  -- The limits in a variable first (one query, _enqueue_limits inlined):
  -- passed as _job_problem(v_job, idemq._enqueue_limits()), a function call
  -- as an argument its body uses more than once, the planner would not
  -- inline _job_problem, and a SQL function called per enqueue costs about
  -- 20 us (5,000 calls: 55 against 35 us each, backend CPU).
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  v_problem := idemq._job_problem(v_job, v_limits);
  IF v_problem IS NULL AND v_job.backoff IS NOT NULL THEN
    v_problem := ARRAY[idemq._backoff_problem(v_job.backoff), NULL];
  END IF;
  IF v_problem[1] IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem[1], NULL, v_problem[2]);
  END IF;
  v_job.job_id := nextval('idemq.jobs_id_seq');

  -- The fast path: no parents, and no key or a key nobody holds: one or two
  -- INSERTs. The pipeline's parts (_enqueue_planned) cost about 15 us more per
  -- call for a job without key and 70 us more with a new key (backend CPU, 5,000
  -- calls), which single-enqueue throughput shows. A key that exists, or a
  -- concurrent inserter that committed it, goes to the pipeline, which decides;
  -- the test "writes the same row as enqueue_many" keeps the two INSERTs alike.
  IF v_job.after IS NULL THEN
    IF v_job.idempotency_key IS NOT NULL THEN
      -- A new key: the key row's primary key serialises concurrent callers
      -- (ON CONFLICT waits for an inserter's transaction).
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
      VALUES (v_job.idempotency_key, v_job.job_id, v_job.task, md5(v_job.payload::text), v_job.key_retention)
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.job_id INTO v_key_job;
    END IF;
    IF v_job.idempotency_key IS NULL OR v_key_job IS NOT NULL THEN
      v_state := idemq._initial_state(v_job.run_at);
      INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                   idempotency_key, backoff, expires_at, traceparent)
      VALUES (v_job.job_id, v_job.task, v_job.queue, v_job.payload, v_state, v_job.priority, v_job.run_at,
              v_job.max_attempts, v_job.idempotency_key, v_job.backoff, v_job.expires_at, v_job.traceparent);
      IF v_state = 'enqueued' THEN
        PERFORM idemq._notify_waiting(v_job.queue);
      END IF;
      job_id := v_job.job_id;
      deduplicated := false;
      job_traceparent := v_job.traceparent;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;

  v_job := (idemq._enqueue_planned(ARRAY[v_job], v_job.idempotency_key IS NOT NULL, v_job.after IS NOT NULL))[1];

  IF v_job.outcome = 'rejected' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ409',
      MESSAGE = format('idempotency key "%s" was used by job %s, which %s; duplicate_policy %s rejects a new job',
                       enqueue.idempotency_key, v_job.job_id, v_job.existing_state, v_job.duplicate_policy),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id,
                                  'existing_state', v_job.existing_state, 'policy', v_job.duplicate_policy)::text,
      HINT = format('Read job %s for its outcome; to run the work again, enqueue with a policy that allows it '
                    '(allow_after_failed) or retry job %s.', v_job.job_id, v_job.job_id);
  ELSIF v_job.outcome = 'conflict' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ422',
      MESSAGE = format('idempotency key "%s" is held by active job %s for different work (task or payload differ)',
                       enqueue.idempotency_key, v_job.job_id),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id)::text,
      HINT = 'A key must name one piece of work: derive it from the task and the payload''s identity, '
             'or wait until the existing job finishes.';
  END IF;

  job_id := v_job.job_id;
  deduplicated := v_job.outcome = 'deduplicated';
  job_traceparent := v_job.traceparent;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue(text, jsonb, text, timestamptz, int, int, text, idemq.duplicate_policy, jsonb, timestamptz, bigint[], interval, text) IS
  'Add a job, or return the active job holding its idempotency key; the duplicate policy decides after a terminal job.';

-- ---- sql/functions/guard.sql ----
-- idemq.guard(key text, task text DEFAULT NULL) RETURNS boolean
--
-- The guard row for a database effect: call it in the same transaction as the
-- effect. true: go ahead (this transaction now owns the key); false: another
-- delivery already committed this effect, so skip it.
--
-- Guarantees:
--   * Inserts key into idemq.processed (ON CONFLICT DO NOTHING). The row
--     commits or rolls back with the caller's effect, so there is no window
--     in which one exists without the other: N deliveries, one effect.
--   * Usable by any at-least-once consumer (Kafka, SQS, RabbitMQ, Celery...),
--     not only idemq jobs.
--   * task (optional) names the work, so stats() can count guard duplicates per task.
--   * Guard rows live until prune_keys() passes their retention.
-- Concurrency: a concurrent second caller with the same key waits for the
--   first transaction: if it commits, the second gets false; if it rolls back,
--   the second gets true. Under REPEATABLE READ the second raises 40001 instead.
-- Errors: 22004 NULL key; 22023 empty key or empty task (NULL task is fine), a key
--   over key_bytes bytes (idemq._limit; a btree entry cannot hold much more).
-- Tests: test/sql/guard.test.ts, test/sql/stats.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.guard(key text, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF guard.key IS NULL OR guard.key = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN guard.key IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'guard: key must be a non-empty string',
      HINT = 'Use a key that names the effect, e.g. ''credit:order-42''.';
  END IF;
  IF guard.task = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'guard: task must be NULL or a non-empty string',
      HINT = 'Pass the task name (counted per task in stats()), or leave task out.';
  END IF;
  PERFORM idemq._check_key_bytes('guard', guard.key, NULL);
  INSERT INTO idemq.processed AS p (key) VALUES (guard.key)
  ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING;
  IF FOUND THEN
    RETURN true;
  END IF;
  IF guard.task IS NOT NULL THEN
    -- Append-only (see idemq.counters): no row lock held until commit.
    INSERT INTO idemq.counters (task, event, n) VALUES (guard.task, 'guard_duplicate', 1);
  END IF;
  RETURN false;
END;
$$;

COMMENT ON FUNCTION idemq.guard(text, text) IS
  'Insert a guard row in the caller''s transaction: true = do the effect, false = already done by another delivery.';

-- ---- sql/functions/heartbeat.sql ----
-- idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds')
--   RETURNS SETOF bigint
--
-- Extends the leases still held; returns the ids extended.
--
-- Guarantees:
--   * For each (job_ids[i], attempts[i]) still holding its job (processing,
--     same attempt), lease_expires_at = now() + lease. A job missing from the
--     answer was lost (rescued, cancelled, or taken by a newer attempt): its
--     handler should stop, and its complete() will raise IQ410.
--   * A lease that ran out but was not yet rescued is still held, and is extended.
--   * An id given more than once counts once, with its highest attempt.
--   * Reads jobs by primary key only (cost follows the batch, not the table).
-- Concurrency: updates rows in id order; SKIP LOCKED is not used, so a job
--   being completed or rescued concurrently is waited for, then judged on its
--   committed state.
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths or more than 10,000
--   ids (both checked by _pairs_by_id); bad lease.
-- Tests: test/sql/heartbeat.test.ts, test/sql/fencing.test.ts,
--   test/sql/claim.test.ts (no sequential scan)
CREATE OR REPLACE FUNCTION idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_attempts int[];
BEGIN
  -- As in complete_many: the pairs checked and sorted by id (_pairs_by_id),
  -- width_bucket() finding an id's attempt by binary search, and "id = ANY
  -- (ids)", a primary-key probe per job whatever the table holds (joined to
  -- the arrays, the planner hashed or scanned the whole table). The attempt
  -- and the held-check are re-checked on the newest row version.
  SELECT p.ids, p.attempts_by_id INTO v_ids, v_attempts
  FROM idemq._pairs_by_id(job_ids, attempts, 'heartbeat',
                          'Pass two arrays of equal length: the ids and attempts of the jobs this worker runs.') p;
  PERFORM idemq._check_lease(lease, 'heartbeat');

  RETURN QUERY
  UPDATE idemq.jobs AS j
  SET lease_expires_at = now() + lease
  WHERE j.id = ANY (v_ids)
    AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.heartbeat(bigint[], int[], interval) IS
  'Extend the leases of (job_id, attempt) pairs still held; ids missing from the answer were lost.';

-- ---- sql/functions/schedule.sql ----
-- idemq.schedule(name text, cron text, task text, payload jsonb DEFAULT NULL, queue text DEFAULT NULL,
--   timezone text DEFAULT 'UTC', overlap idemq.schedule_overlap DEFAULT 'skip',
--   misfire idemq.schedule_misfire DEFAULT 'once', misfire_grace interval DEFAULT '1 minute',
--   priority int DEFAULT NULL, max_attempts int DEFAULT NULL)
--   RETURNS timestamptz
--
-- Creates or replaces the recurring schedule `name`: tick() enqueues a job of
-- `task` for each of its cron slots. Returns the schedule's next slot.
--
-- Guarantees:
--   * Upsert by name. A schedule whose cron and timezone are unchanged keeps
--     its next_at, so re-declaring it (a worker at every start) loses no due
--     slot; a changed cron or timezone starts from the first slot after now().
--     Counters and the last job are kept. A definition equal to the stored
--     one writes nothing (updated_at stays: it is when the definition last
--     changed), so workers that declare their schedules at every start, any
--     number at once, change nothing.
--   * payload, queue, priority and max_attempts left NULL take enqueue()'s
--     defaults (idemq._job_defaults()), stored with the schedule.
--   * cron: see _cron_parse (5 or 6 fields, names, steps, @macros, @every);
--     timezone: an IANA name; slots are local times there (see _cron_instant
--     for DST). overlap and misfire: see _tick.
--   * Every argument is checked before anything is written: an error leaves
--     the schedules table as it was. The job its slots enqueue is checked by
--     enqueue's own rules (_job_problem, the limits of idemq.settings: task,
--     payload, and the slot's idempotency key against key_bytes), so tick()
--     does not meet a job enqueue refuses (unless an admin lowers a limit
--     later).
-- Concurrency: the upsert locks the schedule row; it waits for a tick() that
--   holds it, and a tick after it sees the new definition.
-- Errors: 22004 a required argument is NULL; 22023 a bad cron (naming the
--   field, e.g. cron field 2 (hour) "25" is out of range 0-23), an unknown
--   time zone, an empty name or task, a name over 200 characters, a payload
--   that is not an object, a bad queue, max_attempts < 1, misfire_grace
--   outside 1 second..1 day, a job over a limit (task_bytes, payload_bytes,
--   key_bytes for the slot key); each with a HINT.
-- Tests: test/sql/schedules.test.ts, test/sql/schedules-tick.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.schedule(
  name text,
  cron text,
  task text,
  payload jsonb DEFAULT NULL,
  queue text DEFAULT NULL,
  timezone text DEFAULT 'UTC',
  overlap idemq.schedule_overlap DEFAULT 'skip',
  misfire idemq.schedule_misfire DEFAULT 'once',
  misfire_grace interval DEFAULT '1 minute',
  priority int DEFAULT NULL,
  max_attempts int DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_defaults jsonb := idemq._job_defaults();
  v_null text;
  v_problem text;
  v_hint text;
  v_spec jsonb;
  v_next timestamptz;
  v_payload jsonb := coalesce(schedule.payload, v_defaults -> 'payload');
  v_queue text := coalesce(schedule.queue, v_defaults ->> 'queue');
  v_priority int := coalesce(schedule.priority, (v_defaults ->> 'priority')::int);
  v_max_attempts int := coalesce(schedule.max_attempts, (v_defaults ->> 'max_attempts')::int);
  v_job idemq._planned_job;
  v_limits idemq._enqueue_limits;
  v_job_problem text[];
BEGIN
  v_null := CASE
    WHEN schedule.name IS NULL THEN 'name'
    WHEN schedule.cron IS NULL THEN 'cron'
    WHEN schedule.task IS NULL THEN 'task'
    WHEN schedule.overlap IS NULL THEN 'overlap'
    WHEN schedule.misfire IS NULL THEN 'misfire'
    WHEN schedule.misfire_grace IS NULL THEN 'misfire_grace'
  END;
  IF v_null IS NOT NULL THEN
    PERFORM idemq._raise_null_argument('schedule', v_null);
  END IF;
  SELECT p.problem, p.hint INTO v_problem, v_hint FROM (VALUES
    (schedule.name = '', 'name must not be empty', 'Name the schedule, e.g. ''nightly-report''; it is part of each slot''s idempotency key.'),
    (length(schedule.name) > 200, 'name must be at most 200 characters', 'Use a shorter name; it is part of each slot''s idempotency key.'),
    (schedule.task = '', 'task must not be empty', 'Pass the task name a worker handles.'),
    (jsonb_typeof(v_payload) <> 'object', format('payload must be a JSON object, not %s', v_payload), 'Wrap the value in an object, e.g. {"value": ...}.'),
    (v_queue = '' OR length(v_queue) > idemq._queue_name_limit(),
     format('queue must be 1 to %s characters', idemq._queue_name_limit()), 'Leave queue out for the default queue, or pass a short name.'),
    (v_max_attempts < 1, format('max_attempts must be at least 1, not %s', v_max_attempts), 'Leave it out for the default, or pass 1 or more.'),
    (schedule.misfire_grace < interval '1 second' OR schedule.misfire_grace > interval '1 day',
     format('misfire_grace must be between 1 second and 1 day, not %s', schedule.misfire_grace),
     'misfire_grace is how late a slot may run and still count as on time; call tick() more often than that.')
  ) AS p(bad, problem, hint)
  WHERE p.bad
  LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'schedule: ' || v_problem, HINT = v_hint;
  END IF;
  -- The job a slot enqueues (_tick: key schedule:<name>:<UTC slot>, its
  -- timestamp always 20 characters), checked by enqueue's rules.
  v_job.task := schedule.task;
  v_job.payload := v_payload;
  v_job.queue := v_queue;
  v_job.run_at := now();
  v_job.priority := v_priority;
  v_job.max_attempts := v_max_attempts;
  v_job.idempotency_key := format('schedule:%s:%s', schedule.name, '0000-00-00T00:00:00Z');
  v_job.duplicate_policy := 'reject_always';
  v_job.key_retention := (v_defaults ->> 'key_retention')::interval;
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  v_job_problem := idemq._job_problem(v_job, v_limits);
  IF v_job_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'schedule: its jobs would be refused: ' || v_job_problem[1],
      HINT = coalesce(v_job_problem[2] || ' ', '') || 'Nothing was scheduled.';
  END IF;
  PERFORM idemq._check_timezone(schedule.timezone, 'schedule');
  v_spec := idemq._cron_parse(schedule.cron);
  v_next := idemq._cron_next(v_spec, schedule.timezone, now());
  IF v_next IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('schedule: cron "%s" does not fire within 50 years', schedule.cron),
      HINT = 'Check the day-of-month, month and day-of-week fields together.';
  END IF;

  INSERT INTO idemq.schedules AS s (name, cron, timezone, task, payload, queue, priority, max_attempts,
                                    overlap, misfire, misfire_grace, next_at)
  VALUES (schedule.name, schedule.cron, schedule.timezone, schedule.task, v_payload, v_queue, v_priority,
          v_max_attempts, schedule.overlap, schedule.misfire, schedule.misfire_grace, v_next)
  ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
  SET cron = excluded.cron, timezone = excluded.timezone, task = excluded.task, payload = excluded.payload,
      queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
      overlap = excluded.overlap, misfire = excluded.misfire, misfire_grace = excluded.misfire_grace,
      next_at = CASE WHEN s.cron = excluded.cron AND s.timezone = excluded.timezone THEN s.next_at
                     ELSE excluded.next_at END,
      updated_at = now()
  WHERE (s.cron, s.timezone, s.task, s.payload, s.queue, s.priority, s.max_attempts, s.overlap, s.misfire, s.misfire_grace)
        IS DISTINCT FROM (excluded.cron, excluded.timezone, excluded.task, excluded.payload, excluded.queue,
                          excluded.priority, excluded.max_attempts, excluded.overlap, excluded.misfire, excluded.misfire_grace)
  RETURNING s.next_at INTO v_next;
  IF NOT FOUND THEN
    -- The same definition: ON CONFLICT locked the row and left it as it was.
    SELECT s.next_at INTO v_next FROM idemq.schedules AS s WHERE s.name = schedule.name;
  END IF;
  RETURN v_next;
END;
$$;

COMMENT ON FUNCTION idemq.schedule(text, text, text, jsonb, text, text, idemq.schedule_overlap, idemq.schedule_misfire, interval, int, int) IS
  'Create or replace a recurring schedule (cron, time zone, overlap and misfire policies); returns its next slot.';

-- ---- sql/functions/worker_seen.sql ----
-- idemq.worker_seen(worker_id text, queues text[] DEFAULT NULL, tasks text[] DEFAULT NULL) RETURNS void
--
-- Records that a worker is alive and which queues and tasks it claims: its
-- row in idemq.workers is created, or refreshed with last_seen_at = now().
--
-- Guarantees:
--   * One row per worker_id: the first call sets started_at, every call sets
--     queues, tasks and last_seen_at. queues NULL means every queue, tasks
--     NULL any task, as in claim(); lists are stored sorted, without
--     duplicates.
--   * Writes only the caller's named row of idemq.workers, nothing else: the
--     worker role has no table privilege, so this is its only way to say it
--     is there (workers() and unserved_jobs() read it; apply_retention()
--     deletes rows not seen for worker_retention_seconds).
--   * One statement, no session state: works through a transaction pooler,
--     and after a database restart the next call registers the worker again.
-- Concurrency: an upsert of one row: callers with the same worker_id take
--   turns on its row lock; different workers never wait for each other.
-- Errors: 22004 NULL worker_id; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes, an empty list or an empty or NULL name in it, a
--   queue name over 1000 characters, a task name over task_bytes bytes, more
--   than worker_names names in queues and tasks together.
-- Tests: test/sql/workers.test.ts, test/worker/presence.test.ts
CREATE OR REPLACE FUNCTION idemq.worker_seen(
  worker_id text,
  queues text[] DEFAULT NULL,
  tasks text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_names bigint := idemq._limit('worker_names');
  v_task text;
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'worker_seen: worker_id must be a non-empty string',
      HINT = 'Pass the worker id the worker claims with (claim''s worker_id).';
  END IF;
  PERFORM idemq._check_size('worker_seen', 'worker_id', worker_id, 'worker_id_bytes',
    'Use a shorter worker id, e.g. hostname:pid; claim() refuses the same.');
  IF coalesce(cardinality(queues), 0) + coalesce(cardinality(tasks), 0) > v_names THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: %s queue and task names, over the limit of %s (worker_names)',
                       coalesce(cardinality(queues), 0) + coalesce(cardinality(tasks), 0), v_names),
      HINT = 'Pass NULL for every queue or any task, or raise worker_names in idemq.settings.';
  END IF;
  IF NOT idemq._names_valid(queues)
     OR EXISTS (SELECT 1 FROM unnest(queues) q WHERE length(q) > idemq._queue_name_limit()) THEN
    PERFORM idemq._raise_bad_names('worker_seen', 'queues', queues, 'every queue',
      'Pass the queues the worker claims from, as claim() gets them.', idemq._queue_name_limit());
  END IF;
  IF NOT idemq._names_valid(tasks) THEN
    PERFORM idemq._raise_bad_names('worker_seen', 'tasks', tasks, 'any task',
      'Pass the task names the worker has, as claim() gets them.');
  END IF;
  FOREACH v_task IN ARRAY coalesce(tasks, '{}') LOOP
    PERFORM idemq._check_size('worker_seen', 'a task name', v_task, 'task_bytes',
      'Task names longer than task_bytes cannot be enqueued: no job needs this one.');
  END LOOP;

  INSERT INTO idemq.workers AS w (worker_id, queues, tasks)
  VALUES (worker_seen.worker_id,
          (SELECT array_agg(DISTINCT q ORDER BY q) FROM unnest(worker_seen.queues) q),
          (SELECT array_agg(DISTINCT t ORDER BY t) FROM unnest(worker_seen.tasks) t))
  ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
    SET queues = excluded.queues, tasks = excluded.tasks, last_seen_at = now();
END;
$$;

COMMENT ON FUNCTION idemq.worker_seen(text, text[], text[]) IS
  'Register or refresh a worker''s presence (idemq.workers): its queues and tasks, last_seen_at = now().';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._check_key_bytes FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_key_owner FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._names_valid FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._raise_bad_names FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._raise_not_owner FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._raise_null_argument FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._pairs_by_id FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._pairs_by_id;
-- sql/functions/_pairs_by_id.sql as of 0015_pairs_plpgsql
-- idemq._pairs_by_id(job_ids bigint[], attempts int[], OUT ids bigint[], OUT attempts_by_id int[])
--
-- The (job_ids[i], attempts[i]) pairs of complete_many and heartbeat, sorted
-- by id for width_bucket(): attempts_by_id[width_bucket(id, ids)] is the
-- attempt given for id, found by binary search.
--
-- Guarantees: each id once, with its highest attempt (attempts only grow: only
--   the latest can hold the job); NULL ids dropped; empty arrays for no pairs.
-- Concurrency: none (reads only its arguments).
-- Errors: none (callers check lengths).
-- Tests: test/sql/complete.test.ts, test/sql/heartbeat.test.ts
CREATE OR REPLACE FUNCTION idemq._pairs_by_id(job_ids bigint[], attempts int[],
                                              OUT ids bigint[], OUT attempts_by_id int[])
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  -- plpgsql, not LANGUAGE sql: a SQL function with a SET clause is never
  -- inlined, and PostgreSQL 15-17 parse and plan its body again at every
  -- call from complete_many's or heartbeat's statement (18 caches it);
  -- plpgsql keeps the plan for the session. As LANGUAGE sql, `npm run bench
  -- -- profile` (process.c10, 20,000 jobs, PG15): 180 us per call, 19.3 us
  -- per completed job.
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}')
    INTO ids, attempts_by_id
  FROM (SELECT u.id, max(u.attempt) AS attempt
        FROM unnest(job_ids, attempts) AS u(id, attempt)
        WHERE u.id IS NOT NULL
        GROUP BY u.id) t;
END;
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[]) IS
  '(job_id, attempt) pairs sorted by id, each id once with its highest attempt, for width_bucket() lookups.';

-- sql/functions/_wait_markers.sql as of 0008_no_freeze
-- idemq._wait_markers(queues text[], operation text, taking boolean)
--   RETURNS TABLE(marker bigint, held boolean)
--
-- The waiting markers of `queues` (NULL: the all-queues marker), each once,
-- and whether this session holds it: what wait_for_jobs takes (`taking`) and
-- stop_waiting releases.
--
-- Guarantees:
--   * Validates `queues` first; `operation` names the caller in errors.
--   * Bounded: more than _wait_marker_limit() distinct queues stand for the
--     all-queues marker instead, and so, when `taking`, do queues whose new
--     markers would take this session past that many markers held. A session
--     therefore holds at most _wait_marker_limit() + 1 markers whatever lists
--     it passes. Waiting for every queue is always safe: it only costs NOTIFYs
--     for queues the session does not claim from.
-- Concurrency: reads this session's own locks in pg_locks, once.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_markers(queues text[], operation text, taking boolean)
RETURNS TABLE(marker bigint, held boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_held bigint[];
  v_keys bigint[];
BEGIN
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: queues must be NULL (all queues) or a non-empty list of queue names, not %s', operation, queues),
      HINT = 'Pass the queues you claim from, or NULL for every queue.';
  END IF;
  -- pg_locks copies the whole lock table: read it once, not once per key.
  SELECT coalesce(array_agg((l.classid::bigint << 32) | l.objid::bigint), '{}') INTO v_held
  FROM pg_locks l
  WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock'
    AND l.objsubid = 1 AND l.granted;
  SELECT array_agg(DISTINCT idemq._wait_key(q)) INTO v_keys
  FROM unnest(coalesce(queues, ARRAY[NULL::text])) q;
  IF cardinality(v_keys) > idemq._wait_marker_limit()
     OR (taking AND cardinality(v_held) + (SELECT count(*) FROM unnest(v_keys) k WHERE k <> ALL (v_held))
                    > idemq._wait_marker_limit()) THEN
    v_keys := ARRAY[idemq._wait_key(NULL)];
  END IF;
  RETURN QUERY SELECT k, k = ANY (v_held) FROM unnest(v_keys) k;
END;
$$;

COMMENT ON FUNCTION idemq._wait_markers(text[], text, boolean) IS
  'The waiting markers of these queues (wait_for_jobs), at most _wait_marker_limit() per session, and whether this session holds each.';

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

-- sql/functions/complete_many.sql as of 0012_retention
-- idemq.complete_many(job_ids bigint[], attempts int[]) RETURNS SETOF bigint
--
-- Marks many jobs succeeded in one statement; returns the ids it completed.
--
-- Guarantees:
--   * locked_by keeps the worker whose attempt succeeded (for the job's timeline).
--   * Pairs job_ids[i] with attempts[i]; completes each pair whose attempt
--     still holds its job, and skips the others (lease lost, unknown id)
--     without raising: for batched completion of jobs whose effects are
--     already committed (or idempotent). A caller that needs all-or-nothing
--     uses complete() in its transaction.
--   * Keys, continuations and retention 0 as complete(): with retention 0
--     the completed rows are deleted (jobs with children are updated and
--     left to apply_retention); retention is read once per call.
--   * An id given more than once counts once, with its highest attempt
--     (attempts only grow: only the latest can hold the job).
--   * Reads jobs by primary key only: the cost follows the batch, not the
--     rows the table keeps.
-- Concurrency: updates the rows in id order (no deadlock between two batches).
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths or more than 10,000 ids.
-- Tests: test/sql/complete.test.ts, test/sql/claim.test.ts (no sequential scan),
--   test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq.complete_many(job_ids bigint[], attempts int[])
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_attempts int[];
  v_r record;
  v_gone bigint[];
BEGIN
  IF job_ids IS NULL OR attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'complete_many: job_ids and attempts must not be NULL',
      HINT = 'Pass two arrays of equal length: the ids and attempts claim() returned.';
  END IF;
  IF cardinality(job_ids) <> cardinality(attempts) OR cardinality(job_ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('complete_many: job_ids (%s) and attempts (%s) must have the same length, at most 10000',
                       cardinality(job_ids), cardinality(attempts)),
      HINT = 'attempts[i] is the attempt that claimed job_ids[i].';
  END IF;

  -- The pairs sorted by id (_pairs_by_id), so width_bucket() finds an id's
  -- attempt by binary search. The UPDATE itself selects by "id = ANY (ids)", a primary-key probe
  -- per job whatever the table holds: joined to the arrays instead, the planner
  -- hashed or scanned the whole table for batches of a few hundred (seen in
  -- EXPLAIN). The held-check and the attempt sit in the UPDATE's own WHERE, so
  -- a row changed concurrently (rescue, a new claim) is re-checked on its newest
  -- version and skipped if no longer held by that attempt. No row lock first:
  -- that wrote a WAL record per job for nothing. "Held" is _held(), the lease
  -- columns, not "state = 'processing'", which matches the jobs_leases partial
  -- index: the planner then scanned every job in flight once per pair.
  SELECT p.ids, p.attempts_by_id INTO v_ids, v_attempts FROM idemq._pairs_by_id(job_ids, attempts) p;

  SELECT * INTO v_r FROM idemq._success_retention() z;
  IF v_r.any_zero THEN
    -- Retention 0: delete instead of update, with the ledger write the
    -- trigger would make (as in complete()). The ids left (children, another
    -- retention, lost leases) take the UPDATE below in a statement of its
    -- own, so a row changed meanwhile (an enqueue setting has_children) is
    -- judged on its newest version; when every id went, it is skipped.
    WITH gone AS (
      DELETE FROM idemq.jobs AS j
      WHERE j.id = ANY (v_ids)
        AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
        AND idemq._held(j.lease_expires_at, j.locked_by)
        AND NOT j.has_children
        AND idemq._gone_on_success(j.task, j.queue, v_r.default_zero, v_r.zero_tasks, v_r.kept_tasks,
                                   v_r.zero_queues, v_r.kept_queues)
      RETURNING j.id, j.idempotency_key
    ), ledger AS (
      UPDATE idemq.keys AS k SET finished_state = 'succeeded', finished_at = now()
      FROM gone g WHERE k.key = g.idempotency_key AND k.job_id = g.id
    )
    SELECT coalesce(array_agg(g.id), '{}') INTO v_gone FROM gone g;
    RETURN QUERY SELECT unnest(v_gone);
    IF cardinality(v_gone) = cardinality(v_ids) THEN
      RETURN;
    END IF;
    -- What is left, still sorted by id (width_bucket needs the order).
    SELECT array_agg(p.id ORDER BY p.id), array_agg(p.attempt ORDER BY p.id) INTO v_ids, v_attempts
    FROM unnest(v_ids, v_attempts) p(id, attempt) WHERE NOT p.id = ANY (v_gone);
  END IF;

  RETURN QUERY
  UPDATE idemq.jobs AS j
  SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
  WHERE j.id = ANY (v_ids)
    AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.complete_many(bigint[], int[]) IS
  'Mark many (job_id, attempt) pairs succeeded; returns the ids completed, skipping lost leases.';

-- sql/functions/effect_claim.sql as of 0007_limits
-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes',
--                    job_id bigint DEFAULT NULL, attempt int DEFAULT NULL)
--   RETURNS TABLE(status text, result jsonb)
--
-- The claim-first record for an effect outside the database (an email, a
-- charge, a webhook). Call it in its own transaction (autocommit) before the
-- external call, then effect_done() or effect_release().
--
-- Guarantees: status is one of
--   claimed   no record existed: this owner may make the call;
--   reclaimed an earlier claim is older than stale_after (its owner likely
--             died, perhaps after the call), or was made by an earlier
--             attempt of the caller's own job (job_id, attempt given and the
--             caller holds that attempt: the earlier one is fenced out, so
--             there is no need to wait out stale_after): check with the
--             external system first, or resend with the same idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at (or on the claim's job and attempt),
--   re-checked after a concurrent reclaimer commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner, key or owner over key_bytes
--   bytes (idemq._limit), stale_after <= 0 or over duration_days, or only one
--   of job_id and attempt given.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(
  key text,
  owner text,
  stale_after interval DEFAULT '10 minutes',
  job_id bigint DEFAULT NULL,
  attempt int DEFAULT NULL)
RETURNS TABLE(status text, result jsonb)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_round int := 0;
  v_row record;
BEGIN
  IF effect_claim.key IS NULL OR effect_claim.owner IS NULL OR effect_claim.stale_after IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'effect_claim: key, owner and stale_after must not be NULL',
      HINT = 'key names the effect (e.g. ''invoice-email:42''), owner names this attempt (e.g. ''job:7:2'').';
  END IF;
  IF effect_claim.key = '' OR effect_claim.owner = '' OR effect_claim.stale_after <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: key and owner must be non-empty and stale_after positive',
      HINT = 'stale_after should exceed the longest the external call can take.';
  END IF;
  IF (effect_claim.job_id IS NULL) <> (effect_claim.attempt IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: job_id and attempt go together',
      HINT = 'Pass both (the job and attempt this claim is made for, as claim() returned them) or neither.';
  END IF;
  PERFORM idemq._check_size('effect_claim', 'key', effect_claim.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  PERFORM idemq._check_duration('effect_claim', 'stale_after', effect_claim.stale_after);
  PERFORM idemq._check_size('effect_claim', 'owner', effect_claim.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at, job_id, attempt)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp(), effect_claim.job_id, effect_claim.attempt)
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    -- Stale, or left by an earlier attempt of the job the caller holds now
    -- (fencing: that attempt can no longer finish, so its claim is dead).
    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1,
        job_id = effect_claim.job_id, attempt = effect_claim.attempt
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND (e.claimed_at < clock_timestamp() - effect_claim.stale_after
           OR (e.job_id = effect_claim.job_id AND e.attempt < effect_claim.attempt
               AND EXISTS (SELECT 1 FROM idemq.jobs j
                           WHERE j.id = effect_claim.job_id AND j.attempt = effect_claim.attempt
                             AND idemq._held(j.lease_expires_at, j.locked_by))));
    IF FOUND THEN
      status := 'reclaimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    SELECT e.status, e.result INTO v_row FROM idemq.effects e WHERE e.key = effect_claim.key;
    IF FOUND THEN
      status := CASE WHEN v_row.status = 'done' THEN 'done' ELSE 'busy' END;
      result := v_row.result;
      RETURN NEXT; RETURN;
    END IF;
    -- released between our statements: claim again
    IF v_round >= 10 THEN
      status := 'busy'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval, bigint, int) IS
  'Claim-first record for an external effect: claimed | reclaimed (stale) | done (with result) | busy.';

-- sql/functions/effect_done.sql as of 0007_limits
-- idemq.effect_done(key text, owner text, result jsonb) RETURNS void
--
-- Records that the claimed external effect happened, with what it returned.
--
-- Guarantees: afterwards effect_claim(key, ...) answers `done` with this
--   result, forever (until prune_keys passes its retention). Repeating the
--   call by the same owner is a no-op.
-- Concurrency: row lock on the record.
-- Errors: IQ410 the claim is not this owner's (reclaimed by another, or
--   never claimed; DETAIL {"key","owner"}); 22004 NULL key/owner; 22023 empty key/owner,
--   key or owner over key_bytes bytes (idemq._limit).
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_done(key text, owner text, result jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_owner text;
BEGIN
  IF effect_done.key IS NULL OR effect_done.owner IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'effect_done: key and owner must not be NULL',
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  IF effect_done.key = '' OR effect_done.owner = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_done: key and owner must be non-empty',
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  PERFORM idemq._check_size('effect_done', 'key', effect_done.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  PERFORM idemq._check_size('effect_done', 'owner', effect_done.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
  UPDATE idemq.effects AS e
  SET status = 'done', done_at = now(), result = effect_done.result
  WHERE e.key = effect_done.key AND e.owner = effect_done.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  SELECT e.owner INTO v_owner FROM idemq.effects e
  WHERE e.key = effect_done.key AND e.status = 'done';
  IF v_owner IS NOT DISTINCT FROM effect_done.owner AND v_owner IS NOT NULL THEN
    RETURN;
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('effect_done: the claim on effect "%s" is not held by %s',
                   idemq._excerpt(effect_done.key), idemq._excerpt(effect_done.owner)),
    DETAIL = jsonb_build_object('key', effect_done.key, 'owner', effect_done.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale: raise stale_after above the longest call.';
END;
$$;

COMMENT ON FUNCTION idemq.effect_done(text, text, jsonb) IS
  'Record that the claimed external effect happened (with its result); IQ410 if the claim is not this owner''s.';

-- sql/functions/effect_release.sql as of 0007_limits
-- idemq.effect_release(key text, owner text) RETURNS void
--
-- Gives up a claim: the external call definitely did not happen, so a new
-- claim may make it.
--
-- Guarantees: deletes the claim record; the next effect_claim answers `claimed`.
-- Concurrency: row lock on the record.
-- Errors: IQ410 the claim is not this owner's (or does not exist; DETAIL
--   {"key","owner"}); IQ412 the effect is already done (it cannot be undone
--   by releasing; DETAIL {"key","status"}); 22004 NULL key/owner; 22023 empty key/owner,
--   key or owner over key_bytes bytes (idemq._limit).
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_release(key text, owner text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF effect_release.key IS NULL OR effect_release.owner IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'effect_release: key and owner must not be NULL',
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  IF effect_release.key = '' OR effect_release.owner = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_release: key and owner must be non-empty',
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  PERFORM idemq._check_size('effect_release', 'key', effect_release.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  PERFORM idemq._check_size('effect_release', 'owner', effect_release.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
  DELETE FROM idemq.effects AS e
  WHERE e.key = effect_release.key AND e.owner = effect_release.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM idemq.effects e WHERE e.key = effect_release.key AND e.status = 'done') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('effect_release: effect "%s" is already done and cannot be released', idemq._excerpt(effect_release.key)),
      DETAIL = jsonb_build_object('key', effect_release.key, 'status', 'done')::text,
      HINT = 'A done effect happened; do not retry it.';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('effect_release: the claim on effect "%s" is not held by %s',
                   idemq._excerpt(effect_release.key), idemq._excerpt(effect_release.owner)),
    DETAIL = jsonb_build_object('key', effect_release.key, 'owner', effect_release.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale; leave it to them.';
END;
$$;

COMMENT ON FUNCTION idemq.effect_release(text, text) IS
  'Give up a claim whose external call did not happen; IQ410 if not this owner''s.';

-- sql/functions/enqueue.sql as of 0018_traces
-- idemq.enqueue(task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
--   run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, max_attempts int DEFAULT 10,
--   idempotency_key text DEFAULT NULL,
--   duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
--   backoff jsonb DEFAULT NULL, expires_at timestamptz DEFAULT NULL, after bigint[] DEFAULT NULL,
--   key_retention interval DEFAULT '14 days', traceparent text DEFAULT NULL)
--   RETURNS TABLE(job_id bigint, deduplicated boolean, job_traceparent text)
--
-- Adds a job, or returns the active job that already holds its idempotency key.
--
-- Guarantees:
--   * Without a key: always a new job.
--   * A key held by an active job (scheduled, enqueued, processing, awaiting)
--     returns that job with deduplicated = true, whatever the policy.
--   * A key whose latest job is terminal: duplicate_policy decides
--     (idemq._policy_rejects): a new job, or IQ409.
--   * run_at NULL means now; a job runnable now NOTIFYs idemq_jobs at commit
--     when a listener waits for its queue (wait_for_jobs; _notify_waiting),
--     so enqueueing inside the caller's transaction works like an outbox.
--   * after: the job waits in `awaiting` until every parent succeeded.
--   * key_retention (with a key): how long the key ledger keeps the key after
--     its job finished; prune_keys() never releases it sooner, whatever its
--     own older_than (which can only make it longer). Stored on the key row,
--     so apps with different retentions share one database. A later job
--     that takes the key over sets its own.
--   * expires_at may already be past: the job is never claimed, and rescue()
--     marks it expired.
--   * traceparent: the W3C trace context of the producer's span (version 00,
--     _is_traceparent), stored on a new job and handed to its worker by
--     claim(), which continues the trace. A duplicate stores nothing: the job
--     keeps the context of the enqueue that created it.
--   * job_traceparent: the trace context stored on the job returned: the
--     caller's own for a new job; for a duplicate (deduplicated = true) the
--     existing job's (NULL when it has none), so the duplicate's enqueue span
--     can link to the trace that created the job.
-- Concurrency: N concurrent calls with one key create exactly one job and all
--   get its id; if the first inserter rolls back, a waiter creates it (the key
--   row's primary key serialises them; see _resolve_keys).
-- Errors: 22004 a required argument is NULL; 22023 bad argument (empty task,
--   payload not an object, max_attempts < 1, malformed backoff, a queue name
--   over 1000 characters, run_at infinite, traceparent not a W3C
--   traceparent...) or over a limit of
--   idemq.settings (task_bytes, payload_bytes, key_bytes, parents_per_job:
--   _enqueue_limits, read once per call);
--   IQ409 the policy rejects (DETAIL {"key","existing_job_id","existing_state","policy"});
--   IQ422 the key is held by an active job for a different task or payload
--   (DETAIL {"key","existing_job_id"}); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts, test/sql/continuations.test.ts,
--   test/sql/bad-input.test.ts, test/sql/limits.test.ts, test/sql/traceparent.test.ts
CREATE OR REPLACE FUNCTION idemq.enqueue(
  task text,
  payload jsonb DEFAULT '{}',
  queue text DEFAULT 'default',
  run_at timestamptz DEFAULT NULL,
  priority int DEFAULT 0,
  max_attempts int DEFAULT 10,
  idempotency_key text DEFAULT NULL,
  duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
  backoff jsonb DEFAULT NULL,
  expires_at timestamptz DEFAULT NULL,
  after bigint[] DEFAULT NULL,
  key_retention interval DEFAULT '14 days',
  traceparent text DEFAULT NULL)
RETURNS TABLE(job_id bigint, deduplicated boolean, job_traceparent text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_null text;
  v_job idemq._planned_job;
  v_problem text[];
  v_limits idemq._enqueue_limits;
  v_key_job bigint;
  v_state idemq.job_state;
BEGIN
  v_null := CASE
    WHEN enqueue.task IS NULL THEN 'task'
    WHEN enqueue.payload IS NULL THEN 'payload'
    WHEN enqueue.queue IS NULL THEN 'queue'
    WHEN enqueue.priority IS NULL THEN 'priority'
    WHEN enqueue.max_attempts IS NULL THEN 'max_attempts'
    WHEN enqueue.duplicate_policy IS NULL THEN 'duplicate_policy'
    WHEN enqueue.key_retention IS NULL THEN 'key_retention'
  END;
  IF v_null IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('enqueue: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
  END IF;

  -- Parse and check: the arguments are typed already; the rules are the
  -- ones every enqueue_many element meets.
  v_job.ordinal := 1;
  v_job.outcome := 'created';
  v_job.task := enqueue.task;
  v_job.payload := enqueue.payload;
  v_job.queue := enqueue.queue;
  v_job.run_at := coalesce(enqueue.run_at, now());
  v_job.priority := enqueue.priority;
  v_job.max_attempts := enqueue.max_attempts;
  v_job.idempotency_key := enqueue.idempotency_key;
  v_job.duplicate_policy := enqueue.duplicate_policy;
  v_job.backoff := nullif(enqueue.backoff, 'null');
  v_job.expires_at := enqueue.expires_at;
  v_job.after := CASE WHEN cardinality(enqueue.after) > 0 THEN enqueue.after END;
  v_job.key_retention := enqueue.key_retention;
  v_job.traceparent := enqueue.traceparent;
  -- The limits in a variable first (one query, _enqueue_limits inlined):
  -- passed as _job_problem(v_job, idemq._enqueue_limits()), a function call
  -- as an argument its body uses more than once, the planner would not
  -- inline _job_problem, and a SQL function called per enqueue costs about
  -- 20 us (5,000 calls: 55 against 35 us each, backend CPU).
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  v_problem := idemq._job_problem(v_job, v_limits);
  IF v_problem IS NULL AND v_job.backoff IS NOT NULL THEN
    v_problem := ARRAY[idemq._backoff_problem(v_job.backoff), NULL];
  END IF;
  IF v_problem[1] IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem[1], NULL, v_problem[2]);
  END IF;
  v_job.job_id := nextval('idemq.jobs_id_seq');

  -- The fast path: no parents, and no key or a key nobody holds: one or two
  -- INSERTs. The pipeline's parts (_enqueue_planned) cost about 15 us more per
  -- call for a job without key and 70 us more with a new key (backend CPU, 5,000
  -- calls), which single-enqueue throughput shows. A key that exists, or a
  -- concurrent inserter that committed it, goes to the pipeline, which decides;
  -- the test "writes the same row as enqueue_many" keeps the two INSERTs alike.
  IF v_job.after IS NULL THEN
    IF v_job.idempotency_key IS NOT NULL THEN
      -- A new key: the key row's primary key serialises concurrent callers
      -- (ON CONFLICT waits for an inserter's transaction).
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
      VALUES (v_job.idempotency_key, v_job.job_id, v_job.task, md5(v_job.payload::text), v_job.key_retention)
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.job_id INTO v_key_job;
    END IF;
    IF v_job.idempotency_key IS NULL OR v_key_job IS NOT NULL THEN
      v_state := idemq._initial_state(v_job.run_at);
      INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                   idempotency_key, backoff, expires_at, traceparent)
      VALUES (v_job.job_id, v_job.task, v_job.queue, v_job.payload, v_state, v_job.priority, v_job.run_at,
              v_job.max_attempts, v_job.idempotency_key, v_job.backoff, v_job.expires_at, v_job.traceparent);
      IF v_state = 'enqueued' THEN
        PERFORM idemq._notify_waiting(v_job.queue);
      END IF;
      job_id := v_job.job_id;
      deduplicated := false;
      job_traceparent := v_job.traceparent;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;

  v_job := (idemq._enqueue_planned(ARRAY[v_job], v_job.idempotency_key IS NOT NULL, v_job.after IS NOT NULL))[1];

  IF v_job.outcome = 'rejected' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ409',
      MESSAGE = format('idempotency key "%s" was used by job %s, which %s; duplicate_policy %s rejects a new job',
                       enqueue.idempotency_key, v_job.job_id, v_job.existing_state, v_job.duplicate_policy),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id,
                                  'existing_state', v_job.existing_state, 'policy', v_job.duplicate_policy)::text,
      HINT = format('Read job %s for its outcome; to run the work again, enqueue with a policy that allows it '
                    '(allow_after_failed) or retry job %s.', v_job.job_id, v_job.job_id);
  ELSIF v_job.outcome = 'conflict' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ422',
      MESSAGE = format('idempotency key "%s" is held by active job %s for different work (task or payload differ)',
                       enqueue.idempotency_key, v_job.job_id),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id)::text,
      HINT = 'A key must name one piece of work: derive it from the task and the payload''s identity, '
             'or wait until the existing job finishes.';
  END IF;

  job_id := v_job.job_id;
  deduplicated := v_job.outcome = 'deduplicated';
  job_traceparent := v_job.traceparent;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue(text, jsonb, text, timestamptz, int, int, text, idemq.duplicate_policy, jsonb, timestamptz, bigint[], interval, text) IS
  'Add a job, or return the active job holding its idempotency key; the duplicate policy decides after a terminal job.';

-- sql/functions/guard.sql as of 0007_limits
-- idemq.guard(key text, task text DEFAULT NULL) RETURNS boolean
--
-- The guard row for a database effect: call it in the same transaction as the
-- effect. true: go ahead (this transaction now owns the key); false: another
-- delivery already committed this effect, so skip it.
--
-- Guarantees:
--   * Inserts key into idemq.processed (ON CONFLICT DO NOTHING). The row
--     commits or rolls back with the caller's effect, so there is no window
--     in which one exists without the other: N deliveries, one effect.
--   * Usable by any at-least-once consumer (Kafka, SQS, RabbitMQ, Celery...),
--     not only idemq jobs.
--   * task (optional) names the work, so stats() can count guard duplicates per task.
--   * Guard rows live until prune_keys() passes their retention.
-- Concurrency: a concurrent second caller with the same key waits for the
--   first transaction: if it commits, the second gets false; if it rolls back,
--   the second gets true. Under REPEATABLE READ the second raises 40001 instead.
-- Errors: 22004 NULL key; 22023 empty key or empty task (NULL task is fine), a key
--   over key_bytes bytes (idemq._limit; a btree entry cannot hold much more).
-- Tests: test/sql/guard.test.ts, test/sql/stats.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.guard(key text, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF guard.key IS NULL OR guard.key = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN guard.key IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'guard: key must be a non-empty string',
      HINT = 'Use a key that names the effect, e.g. ''credit:order-42''.';
  END IF;
  IF guard.task = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'guard: task must be NULL or a non-empty string',
      HINT = 'Pass the task name (counted per task in stats()), or leave task out.';
  END IF;
  PERFORM idemq._check_size('guard', 'key', guard.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  INSERT INTO idemq.processed AS p (key) VALUES (guard.key)
  ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING;
  IF FOUND THEN
    RETURN true;
  END IF;
  IF guard.task IS NOT NULL THEN
    -- Append-only (see idemq.counters): no row lock held until commit.
    INSERT INTO idemq.counters (task, event, n) VALUES (guard.task, 'guard_duplicate', 1);
  END IF;
  RETURN false;
END;
$$;

COMMENT ON FUNCTION idemq.guard(text, text) IS
  'Insert a guard row in the caller''s transaction: true = do the effect, false = already done by another delivery.';

-- sql/functions/heartbeat.sql as of 0005_least_privilege
-- idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds')
--   RETURNS SETOF bigint
--
-- Extends the leases still held; returns the ids extended.
--
-- Guarantees:
--   * For each (job_ids[i], attempts[i]) still holding its job (processing,
--     same attempt), lease_expires_at = now() + lease. A job missing from the
--     answer was lost (rescued, cancelled, or taken by a newer attempt): its
--     handler should stop, and its complete() will raise IQ410.
--   * A lease that ran out but was not yet rescued is still held, and is extended.
--   * An id given more than once counts once, with its highest attempt.
--   * Reads jobs by primary key only (cost follows the batch, not the table).
-- Concurrency: updates rows in id order; SKIP LOCKED is not used, so a job
--   being completed or rescued concurrently is waited for, then judged on its
--   committed state.
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths; bad lease.
-- Tests: test/sql/heartbeat.test.ts, test/sql/fencing.test.ts,
--   test/sql/claim.test.ts (no sequential scan)
CREATE OR REPLACE FUNCTION idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_attempts int[];
BEGIN
  IF job_ids IS NULL OR attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'heartbeat: job_ids and attempts must not be NULL',
      HINT = 'Pass two arrays of equal length: the ids and attempts of the jobs this worker runs.';
  END IF;
  IF cardinality(job_ids) <> cardinality(attempts) OR cardinality(job_ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('heartbeat: job_ids (%s) and attempts (%s) must have the same length, at most 10000',
                       cardinality(job_ids), cardinality(attempts)),
      HINT = 'attempts[i] is the attempt that claimed job_ids[i].';
  END IF;
  PERFORM idemq._check_lease(lease, 'heartbeat');

  -- As in complete_many: the pairs sorted by id (_pairs_by_id), width_bucket()
  -- finding an id's attempt by binary search, and "id = ANY (ids)", a
  -- primary-key probe per job whatever the table holds (joined to the arrays,
  -- the planner hashed or scanned the whole table). The attempt and the
  -- held-check are re-checked on the newest row version.
  SELECT p.ids, p.attempts_by_id INTO v_ids, v_attempts FROM idemq._pairs_by_id(job_ids, attempts) p;

  RETURN QUERY
  UPDATE idemq.jobs AS j
  SET lease_expires_at = now() + lease
  WHERE j.id = ANY (v_ids)
    AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.heartbeat(bigint[], int[], interval) IS
  'Extend the leases of (job_id, attempt) pairs still held; ids missing from the answer were lost.';

-- sql/functions/schedule.sql as of 0013_schedules_ts
-- idemq.schedule(name text, cron text, task text, payload jsonb DEFAULT NULL, queue text DEFAULT NULL,
--   timezone text DEFAULT 'UTC', overlap idemq.schedule_overlap DEFAULT 'skip',
--   misfire idemq.schedule_misfire DEFAULT 'once', misfire_grace interval DEFAULT '1 minute',
--   priority int DEFAULT NULL, max_attempts int DEFAULT NULL)
--   RETURNS timestamptz
--
-- Creates or replaces the recurring schedule `name`: tick() enqueues a job of
-- `task` for each of its cron slots. Returns the schedule's next slot.
--
-- Guarantees:
--   * Upsert by name. A schedule whose cron and timezone are unchanged keeps
--     its next_at, so re-declaring it (a worker at every start) loses no due
--     slot; a changed cron or timezone starts from the first slot after now().
--     Counters and the last job are kept. A definition equal to the stored
--     one writes nothing (updated_at stays: it is when the definition last
--     changed), so workers that declare their schedules at every start, any
--     number at once, change nothing.
--   * payload, queue, priority and max_attempts left NULL take enqueue()'s
--     defaults (idemq._job_defaults()), stored with the schedule.
--   * cron: see _cron_parse (5 or 6 fields, names, steps, @macros, @every);
--     timezone: an IANA name; slots are local times there (see _cron_instant
--     for DST). overlap and misfire: see _tick.
--   * Every argument is checked before anything is written: an error leaves
--     the schedules table as it was. The job its slots enqueue is checked by
--     enqueue's own rules (_job_problem, the limits of idemq.settings: task,
--     payload, and the slot's idempotency key against key_bytes), so tick()
--     does not meet a job enqueue refuses (unless an admin lowers a limit
--     later).
-- Concurrency: the upsert locks the schedule row; it waits for a tick() that
--   holds it, and a tick after it sees the new definition.
-- Errors: 22004 a required argument is NULL; 22023 a bad cron (naming the
--   field, e.g. cron field 2 (hour) "25" is out of range 0-23), an unknown
--   time zone, an empty name or task, a name over 200 characters, a payload
--   that is not an object, a bad queue, max_attempts < 1, misfire_grace
--   outside 1 second..1 day, a job over a limit (task_bytes, payload_bytes,
--   key_bytes for the slot key); each with a HINT.
-- Tests: test/sql/schedules.test.ts, test/sql/schedules-tick.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.schedule(
  name text,
  cron text,
  task text,
  payload jsonb DEFAULT NULL,
  queue text DEFAULT NULL,
  timezone text DEFAULT 'UTC',
  overlap idemq.schedule_overlap DEFAULT 'skip',
  misfire idemq.schedule_misfire DEFAULT 'once',
  misfire_grace interval DEFAULT '1 minute',
  priority int DEFAULT NULL,
  max_attempts int DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_defaults jsonb := idemq._job_defaults();
  v_null text;
  v_problem text;
  v_hint text;
  v_spec jsonb;
  v_next timestamptz;
  v_payload jsonb := coalesce(schedule.payload, v_defaults -> 'payload');
  v_queue text := coalesce(schedule.queue, v_defaults ->> 'queue');
  v_priority int := coalesce(schedule.priority, (v_defaults ->> 'priority')::int);
  v_max_attempts int := coalesce(schedule.max_attempts, (v_defaults ->> 'max_attempts')::int);
  v_job idemq._planned_job;
  v_limits idemq._enqueue_limits;
  v_job_problem text[];
BEGIN
  v_null := CASE
    WHEN schedule.name IS NULL THEN 'name'
    WHEN schedule.cron IS NULL THEN 'cron'
    WHEN schedule.task IS NULL THEN 'task'
    WHEN schedule.overlap IS NULL THEN 'overlap'
    WHEN schedule.misfire IS NULL THEN 'misfire'
    WHEN schedule.misfire_grace IS NULL THEN 'misfire_grace'
  END;
  IF v_null IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('schedule: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
  END IF;
  SELECT p.problem, p.hint INTO v_problem, v_hint FROM (VALUES
    (schedule.name = '', 'name must not be empty', 'Name the schedule, e.g. ''nightly-report''; it is part of each slot''s idempotency key.'),
    (length(schedule.name) > 200, 'name must be at most 200 characters', 'Use a shorter name; it is part of each slot''s idempotency key.'),
    (schedule.task = '', 'task must not be empty', 'Pass the task name a worker handles.'),
    (jsonb_typeof(v_payload) <> 'object', format('payload must be a JSON object, not %s', v_payload), 'Wrap the value in an object, e.g. {"value": ...}.'),
    (v_queue = '' OR length(v_queue) > idemq._queue_name_limit(),
     format('queue must be 1 to %s characters', idemq._queue_name_limit()), 'Leave queue out for the default queue, or pass a short name.'),
    (v_max_attempts < 1, format('max_attempts must be at least 1, not %s', v_max_attempts), 'Leave it out for the default, or pass 1 or more.'),
    (schedule.misfire_grace < interval '1 second' OR schedule.misfire_grace > interval '1 day',
     format('misfire_grace must be between 1 second and 1 day, not %s', schedule.misfire_grace),
     'misfire_grace is how late a slot may run and still count as on time; call tick() more often than that.')
  ) AS p(bad, problem, hint)
  WHERE p.bad
  LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'schedule: ' || v_problem, HINT = v_hint;
  END IF;
  -- The job a slot enqueues (_tick: key schedule:<name>:<UTC slot>, its
  -- timestamp always 20 characters), checked by enqueue's rules.
  v_job.task := schedule.task;
  v_job.payload := v_payload;
  v_job.queue := v_queue;
  v_job.run_at := now();
  v_job.priority := v_priority;
  v_job.max_attempts := v_max_attempts;
  v_job.idempotency_key := format('schedule:%s:%s', schedule.name, '0000-00-00T00:00:00Z');
  v_job.duplicate_policy := 'reject_always';
  v_job.key_retention := (v_defaults ->> 'key_retention')::interval;
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  v_job_problem := idemq._job_problem(v_job, v_limits);
  IF v_job_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'schedule: its jobs would be refused: ' || v_job_problem[1],
      HINT = coalesce(v_job_problem[2] || ' ', '') || 'Nothing was scheduled.';
  END IF;
  PERFORM idemq._check_timezone(schedule.timezone, 'schedule');
  v_spec := idemq._cron_parse(schedule.cron);
  v_next := idemq._cron_next(v_spec, schedule.timezone, now());
  IF v_next IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('schedule: cron "%s" does not fire within 50 years', schedule.cron),
      HINT = 'Check the day-of-month, month and day-of-week fields together.';
  END IF;

  INSERT INTO idemq.schedules AS s (name, cron, timezone, task, payload, queue, priority, max_attempts,
                                    overlap, misfire, misfire_grace, next_at)
  VALUES (schedule.name, schedule.cron, schedule.timezone, schedule.task, v_payload, v_queue, v_priority,
          v_max_attempts, schedule.overlap, schedule.misfire, schedule.misfire_grace, v_next)
  ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
  SET cron = excluded.cron, timezone = excluded.timezone, task = excluded.task, payload = excluded.payload,
      queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
      overlap = excluded.overlap, misfire = excluded.misfire, misfire_grace = excluded.misfire_grace,
      next_at = CASE WHEN s.cron = excluded.cron AND s.timezone = excluded.timezone THEN s.next_at
                     ELSE excluded.next_at END,
      updated_at = now()
  WHERE (s.cron, s.timezone, s.task, s.payload, s.queue, s.priority, s.max_attempts, s.overlap, s.misfire, s.misfire_grace)
        IS DISTINCT FROM (excluded.cron, excluded.timezone, excluded.task, excluded.payload, excluded.queue,
                          excluded.priority, excluded.max_attempts, excluded.overlap, excluded.misfire, excluded.misfire_grace)
  RETURNING s.next_at INTO v_next;
  IF NOT FOUND THEN
    -- The same definition: ON CONFLICT locked the row and left it as it was.
    SELECT s.next_at INTO v_next FROM idemq.schedules AS s WHERE s.name = schedule.name;
  END IF;
  RETURN v_next;
END;
$$;

COMMENT ON FUNCTION idemq.schedule(text, text, text, jsonb, text, text, idemq.schedule_overlap, idemq.schedule_misfire, interval, int, int) IS
  'Create or replace a recurring schedule (cron, time zone, overlap and misfire policies); returns its next slot.';

-- sql/functions/worker_seen.sql as of 0017_worker_presence
-- idemq.worker_seen(worker_id text, queues text[] DEFAULT NULL, tasks text[] DEFAULT NULL) RETURNS void
--
-- Records that a worker is alive and which queues and tasks it claims: its
-- row in idemq.workers is created, or refreshed with last_seen_at = now().
--
-- Guarantees:
--   * One row per worker_id: the first call sets started_at, every call sets
--     queues, tasks and last_seen_at. queues NULL means every queue, tasks
--     NULL any task, as in claim(); lists are stored sorted, without
--     duplicates.
--   * Writes only the caller's named row of idemq.workers, nothing else: the
--     worker role has no table privilege, so this is its only way to say it
--     is there (workers() and unserved_jobs() read it; apply_retention()
--     deletes rows not seen for worker_retention_seconds).
--   * One statement, no session state: works through a transaction pooler,
--     and after a database restart the next call registers the worker again.
-- Concurrency: an upsert of one row: callers with the same worker_id take
--   turns on its row lock; different workers never wait for each other.
-- Errors: 22004 NULL worker_id; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes, an empty list or an empty or NULL name in it, a
--   queue name over 1000 characters, a task name over task_bytes bytes, more
--   than worker_names names in queues and tasks together.
-- Tests: test/sql/workers.test.ts, test/worker/presence.test.ts
CREATE OR REPLACE FUNCTION idemq.worker_seen(
  worker_id text,
  queues text[] DEFAULT NULL,
  tasks text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_names bigint := idemq._limit('worker_names');
  v_task text;
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'worker_seen: worker_id must be a non-empty string',
      HINT = 'Pass the worker id the worker claims with (claim''s worker_id).';
  END IF;
  PERFORM idemq._check_size('worker_seen', 'worker_id', worker_id, 'worker_id_bytes',
    'Use a shorter worker id, e.g. hostname:pid; claim() refuses the same.');
  IF coalesce(cardinality(queues), 0) + coalesce(cardinality(tasks), 0) > v_names THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: %s queue and task names, over the limit of %s (worker_names)',
                       coalesce(cardinality(queues), 0) + coalesce(cardinality(tasks), 0), v_names),
      HINT = 'Pass NULL for every queue or any task, or raise worker_names in idemq.settings.';
  END IF;
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '' OR length(q) > idemq._queue_name_limit())) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: queues must be NULL (every queue) or a non-empty list of queue names of 1 to %s characters, not %s',
                       idemq._queue_name_limit(), idemq._excerpt(queues::text)),
      HINT = 'Pass the queues the worker claims from, as claim() gets them.';
  END IF;
  IF tasks IS NOT NULL AND (cardinality(tasks) = 0 OR EXISTS (
       SELECT 1 FROM unnest(tasks) t WHERE t IS NULL OR t = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: tasks must be NULL (any task) or a non-empty list of task names, not %s',
                       idemq._excerpt(tasks::text)),
      HINT = 'Pass the task names the worker has, as claim() gets them.';
  END IF;
  FOREACH v_task IN ARRAY coalesce(tasks, '{}') LOOP
    PERFORM idemq._check_size('worker_seen', 'a task name', v_task, 'task_bytes',
      'Task names longer than task_bytes cannot be enqueued: no job needs this one.');
  END LOOP;

  INSERT INTO idemq.workers AS w (worker_id, queues, tasks)
  VALUES (worker_seen.worker_id,
          (SELECT array_agg(DISTINCT q ORDER BY q) FROM unnest(worker_seen.queues) q),
          (SELECT array_agg(DISTINCT t ORDER BY t) FROM unnest(worker_seen.tasks) t))
  ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
    SET queues = excluded.queues, tasks = excluded.tasks, last_seen_at = now();
END;
$$;

COMMENT ON FUNCTION idemq.worker_seen(text, text[], text[]) IS
  'Register or refresh a worker''s presence (idemq.workers): its queues and tasks, last_seen_at = now().';

DROP FUNCTION idemq._check_key_owner;
DROP FUNCTION idemq._raise_null_argument;
DROP FUNCTION idemq._raise_not_owner;
DROP FUNCTION idemq._raise_bad_names;
DROP FUNCTION idemq._names_valid;
DROP FUNCTION idemq._check_key_bytes;
REVOKE EXECUTE ON FUNCTION idemq._pairs_by_id FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Hand-written reversal of the schema changes above goes here, after the functions.
