-- Migration 0028_runnable_index_name_keys: jobs_runnable_by_task_queue keyed by fixed-width 64-bit keys of the task and queue names (_name_key) instead of the names, so an index insertion compares its entries in place: 84.4k -> 71.4k instructions per job of a 10,000-job enqueue_many (callgrind, PostgreSQL 15); claim's walks compare the keys and then the names.
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

-- ---- sql/functions/_name_key.sql ----
-- idemq._name_key(name text) RETURNS bigint
--
-- The fixed-width key of a task or queue name in the runnable index
-- jobs_runnable_by_task_queue (_name_key(task), _name_key(queue), priority
-- DESC, run_at, id): a 64-bit hash of the name.
--
-- Why: with the names themselves as its first columns, every comparison of
-- an index insertion walked the variable-width names to reach priority,
-- run_at and id (nocache_index_getattr) and compared text: 13,000
-- instructions of a job's 84,000 in a 10,000-job enqueue_many (callgrind,
-- PostgreSQL 15, bench/FINDINGS.md). Fixed-width keys are compared in place.
--
-- Guarantees:
--   * The same key for the same name in every session and on every server of
--     one PostgreSQL major version (hashtextextended, the hash PostgreSQL's
--     hash partitioning relies on). The index is an expression index on it:
--     a major-version upgrade that changed the hash would need it rebuilt
--     (REINDEX), as hash-partitioned tables would.
--   * Every walk of the index compares the names as well as their keys, so
--     two names with one key (about one chance in 10^11 among 10,000
--     names) never mix their jobs. What such a collision costs: a walk reads
--     the other name's jobs and passes over them, and the loose scans that
--     list the names present (claim without a task or queue list) see one
--     of the two names per key, so the other's jobs wait for claims that
--     name it, or for the first name's runnable jobs to run out.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/claim-keys.test.ts, test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq._name_key(name text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(name, 0);

COMMENT ON FUNCTION idemq._name_key(text) IS
  'The 64-bit key of a task or queue name in the runnable index jobs_runnable_by_task_queue (its names are compared too).';

-- ---- sql/functions/_claim_merge.sql ----
-- idemq._claim_merge(key_tasks text[], key_queues text[], batch_size int,
--   OUT ids bigint[], OUT lost bigint[])
--
-- claim()'s jobs when it may take them from several (task, queue) keys: up
-- to batch_size runnable jobs in the global claim order (priority desc,
-- run_at, id), each key read only as far as that order needs, the jobs taken
-- locked FOR UPDATE SKIP LOCKED. claim() checks the arguments, finds the
-- keys, takes a single key's jobs itself and updates what this returns.
--
-- Guarantees:
--   * ids: the jobs taken, in claim order; lost: those of them whose
--     previous attempt lost its lease (claim() reports them as reclaimed).
--   * Every job in ids is runnable (state enqueued or scheduled, run_at <=
--     now(), not past expires_at) and locked by this transaction; no job
--     not taken is locked.
--   * No runnable job of these keys that this transaction could lock
--     precedes, in claim order, a job in ids that it did not take.
--   * Cost: the first round reads at most k + 2 x batch_size jobs for k
--     keys, one index descent per key (the method and its measurements are
--     in the body); no worst-case bound below k x batch_size is proven for
--     the later rounds.
-- Concurrency: FOR UPDATE SKIP LOCKED over jobs_runnable_by_task_queue:
--   jobs another transaction holds are passed over, never waited for.
-- Errors: none (claim() checks its arguments).
-- Tests: test/sql/claim-keys.test.ts, test/sql/claim-concurrency.test.ts, test/sql/claim.test.ts
CREATE OR REPLACE FUNCTION idemq._claim_merge(key_tasks text[], key_queues text[], batch_size int,
                                              OUT ids bigint[], OUT lost bigint[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, as claim() (its header says why: the statements below
-- were planned at every call with custom plans).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_key_tasks text[] := _claim_merge.key_tasks;
  v_key_queues text[] := _claim_merge.key_queues;
  v_ids bigint[];
  v_lost bigint[];
  v_need int;
  v_first int;
  v_take int[];
  v_after_priority int[];
  v_after_run_at timestamptz[];
  v_after_id bigint[];
  v_pool_ids bigint[];
  v_pool_priority int[];
  v_pool_run_at timestamptz[];
  v_bound_priority int;
  v_bound_run_at timestamptz;
  v_bound_id bigint;
  v_unbounded boolean;
  v_front_priority int;
  v_front_run_at timestamptz;
  v_front_id bigint;
  v_candidates bigint[];
BEGIN
  -- Several keys: a merge that reads each key only as far as the claim
  -- order needs (the former merge read batch_size jobs of every key: k x
  -- batch_size for k keys). Each key is read in blocks, in claim order;
  -- the jobs read and not yet handed out wait in a pool. A key whose block
  -- came back short of an unbounded read has no runnable job left
  -- (exhausted); otherwise its cursor is where its reading stopped. The
  -- frontier is the first cursor in claim order: no job not yet read can
  -- precede it, so the pool up to the frontier is in exact global order.
  -- Those candidates are locked in claim order, SKIP LOCKED, up to the jobs
  -- still needed: a job another claimer holds, or that stopped being
  -- runnable, is passed over and the next round looks past it. Locking
  -- inside each key's walk would lock jobs the merge then leaves (a row
  -- lock is a WAL record, and other claimers skip those jobs).
  -- Round 1 reads a first block of max(1, ceil(2 x batch_size / k)) jobs of
  -- every key: at most k + 2 x batch_size jobs, one index descent per key.
  -- A later round takes as its bound the need-th job of the pool (need:
  -- the jobs still wanted; with a smaller pool, no bound), and reads only
  -- the keys whose cursor precedes it, from just after the cursor and never
  -- past the bound, up to max(twice the key's last block, ceil(2 x need /
  -- the keys read)) jobs, at most need; a key with no job left before the
  -- bound gets the bound as its cursor. Evenly spread work ends after one
  -- or two rounds. 50,000 runnable jobs, claim(batch_size => 100), medians
  -- of 200 calls on a loaded 2-core machine, EXPLAIN (ANALYZE, BUFFERS) of
  -- the call: 50 pairs 4.2 ms, 2,198 buffers (this merge's predecessor
  -- 7.3 ms, 6,893 buffers); 200 pairs 9.2 ms, 3,789 buffers (26 ms, 23,038
  -- buffers); 10 pairs 2.6 ms either way. All jobs in one of 50 pairs, the
  -- others with one job each: two rounds, 3.0 ms against 2.2 ms (one
  -- round of 149 jobs): the second round's statements cost more than the
  -- jobs they save.
  -- "After the cursor" in claim order (priority desc, run_at, id) mixes
  -- directions, so no row comparison says it; it is a merge of index walks,
  -- each bounded by Index Conds after the equalities on task and queue: the
  -- rest of the cursor's priority (priority = cursor's AND (run_at, id) >
  -- cursor's, and <= the bound's when the bound has that priority), the
  -- priorities between (priority < cursor's AND priority > bound's), and the
  -- bound's priority up to it (priority = bound's AND (run_at, id) <=
  -- bound's). Spelt as one walk, "priority < p OR (priority = p AND (run_at,
  -- id) > (r, i))" is a Filter on a walk from the key's first entry:
  -- EXPLAIN (ANALYZE, BUFFERS), generic plan, a key of 2,000 jobs, 50 jobs
  -- after its 901st: Rows Removed by Filter: 901, 962 buffers, 0.41 ms; the
  -- walks below, 0 rows removed, 57 buffers, 0.18 ms.
  v_ids := '{}';
  v_lost := '{}';
  v_need := batch_size;
  v_first := least(v_need, greatest(1, ceil(2.0 * v_need / cardinality(v_key_tasks))::int));
  -- The first block of every key, from its start.
  WITH fresh AS MATERIALIZED (
    SELECT k.n, w.id, w.priority, w.run_at
    FROM unnest(v_key_tasks, v_key_queues) WITH ORDINALITY AS k(task, queue, n)
    CROSS JOIN LATERAL (
      SELECT j.id, j.priority, j.run_at
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND idemq._name_key(j.task) = idemq._name_key(k.task)
        AND idemq._name_key(j.queue) = idemq._name_key(k.queue)
        AND j.task = k.task
        AND j.queue = k.queue
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT v_first
    ) w
  ),
  tails AS (
    SELECT DISTINCT ON (f.n) f.n, f.id, f.priority, f.run_at, count(*) OVER (PARTITION BY f.n) AS read
    FROM fresh f
    ORDER BY f.n, f.priority, f.run_at DESC, f.id DESC
  )
  -- A key whose block came back short is exhausted (take 0).
  SELECT array_agg(CASE WHEN t.read = v_first THEN v_first ELSE 0 END ORDER BY k.n),
         array_agg(t.priority ORDER BY k.n),
         array_agg(t.run_at ORDER BY k.n),
         array_agg(t.id ORDER BY k.n),
         (SELECT coalesce(array_agg(f.id), '{}') FROM fresh f),
         (SELECT coalesce(array_agg(f.priority), '{}') FROM fresh f),
         (SELECT coalesce(array_agg(f.run_at), '{}') FROM fresh f)
  INTO v_take, v_after_priority, v_after_run_at, v_after_id,
       v_pool_ids, v_pool_priority, v_pool_run_at
  FROM generate_series(1, cardinality(v_key_tasks)) AS k(n)
  LEFT JOIN tails t ON t.n = k.n;
  LOOP
    -- The frontier: the first cursor of a key not exhausted (none: every
    -- runnable job of every key is in the pool).
    v_front_id := NULL;
    SELECT c.priority, c.run_at, c.id
    INTO v_front_priority, v_front_run_at, v_front_id
    FROM unnest(v_take, v_after_priority, v_after_run_at, v_after_id) AS c(take, priority, run_at, id)
    WHERE c.take > 0
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT 1;

    -- Candidates: the pool up to the frontier; the rest stays in the pool.
    SELECT coalesce(array_agg(p.id) FILTER (WHERE p.ready), '{}'),
           coalesce(array_agg(p.id) FILTER (WHERE NOT p.ready), '{}'),
           coalesce(array_agg(p.priority) FILTER (WHERE NOT p.ready), '{}'),
           coalesce(array_agg(p.run_at) FILTER (WHERE NOT p.ready), '{}')
    INTO v_candidates, v_pool_ids, v_pool_priority, v_pool_run_at
    FROM (
      SELECT u.id, u.priority, u.run_at,
             v_front_id IS NULL OR u.priority > v_front_priority
               OR (u.priority = v_front_priority AND (u.run_at, u.id) <= (v_front_run_at, v_front_id)) AS ready
      FROM unnest(v_pool_ids, v_pool_priority, v_pool_run_at) AS u(id, priority, run_at)
    ) p;

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
      LIMIT v_need
      FOR UPDATE SKIP LOCKED
    ) p;
    v_need := batch_size - cardinality(v_ids);
    EXIT WHEN v_need = 0 OR v_front_id IS NULL;

    -- The bound: the need-th job of the pool in claim order; with fewer
    -- jobs in the pool, none (past every job: lowest priority, run_at
    -- infinity, the largest id).
    v_bound_id := NULL;
    SELECT u.priority, u.run_at, u.id
    INTO v_bound_priority, v_bound_run_at, v_bound_id
    FROM unnest(v_pool_ids, v_pool_priority, v_pool_run_at) AS u(id, priority, run_at)
    ORDER BY u.priority DESC, u.run_at, u.id
    OFFSET v_need - 1
    LIMIT 1;
    v_unbounded := v_bound_id IS NULL;
    IF v_unbounded THEN
      v_bound_priority := -2147483648;
      v_bound_run_at := 'infinity';
      v_bound_id := 9223372036854775807;
    END IF;

    -- Read the keys not exhausted whose cursor precedes the bound, from
    -- just after the cursor up to the bound: each reads up to its block.
    WITH refill AS (
      SELECT k.task, k.queue, k.after_priority, k.after_run_at, k.after_id, k.n,
             least(v_need, greatest(2 * k.take, ceil(2.0 * v_need / count(*) OVER ())::int)) AS take
      FROM unnest(v_key_tasks, v_key_queues, v_take, v_after_priority, v_after_run_at, v_after_id)
           WITH ORDINALITY AS k(task, queue, take, after_priority, after_run_at, after_id, n)
      WHERE k.take > 0
        AND (k.after_priority > v_bound_priority
             OR (k.after_priority = v_bound_priority AND (k.after_run_at, k.after_id) < (v_bound_run_at, v_bound_id)))
    ),
    fresh AS MATERIALIZED (
      SELECT k.n, w.id, w.priority, w.run_at
      FROM refill k
      CROSS JOIN LATERAL (
        (SELECT j.id, j.priority, j.run_at
         FROM idemq.jobs j
         WHERE j.state IN ('enqueued', 'scheduled')
           AND idemq._name_key(j.task) = idemq._name_key(k.task)
           AND idemq._name_key(j.queue) = idemq._name_key(k.queue)
           AND j.task = k.task
           AND j.queue = k.queue
           AND j.priority = k.after_priority
           AND (j.run_at, j.id) > (k.after_run_at, k.after_id)
           AND (j.run_at, j.id) <= (CASE WHEN k.after_priority = v_bound_priority THEN v_bound_run_at ELSE 'infinity' END,
                                    CASE WHEN k.after_priority = v_bound_priority THEN v_bound_id ELSE 9223372036854775807 END)
           AND j.run_at <= now()
           AND (j.expires_at IS NULL OR j.expires_at > now())
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT k.take)
        UNION ALL
        (SELECT j.id, j.priority, j.run_at
         FROM idemq.jobs j
         WHERE j.state IN ('enqueued', 'scheduled')
           AND idemq._name_key(j.task) = idemq._name_key(k.task)
           AND idemq._name_key(j.queue) = idemq._name_key(k.queue)
           AND j.task = k.task
           AND j.queue = k.queue
           AND j.priority < k.after_priority
           AND j.priority > v_bound_priority
           AND j.run_at <= now()
           AND (j.expires_at IS NULL OR j.expires_at > now())
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT k.take)
        UNION ALL
        (SELECT j.id, j.priority, j.run_at
         FROM idemq.jobs j
         WHERE k.after_priority > v_bound_priority
           AND j.state IN ('enqueued', 'scheduled')
           AND idemq._name_key(j.task) = idemq._name_key(k.task)
           AND idemq._name_key(j.queue) = idemq._name_key(k.queue)
           AND j.task = k.task
           AND j.queue = k.queue
           AND j.priority = v_bound_priority
           AND (j.run_at, j.id) <= (v_bound_run_at, v_bound_id)
           AND j.run_at <= now()
           AND (j.expires_at IS NULL OR j.expires_at > now())
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT k.take)
        ORDER BY 2 DESC, 3, 1
        LIMIT k.take
      ) w
    ),
    tails AS (
      SELECT DISTINCT ON (f.n) f.n, f.id, f.priority, f.run_at, count(*) OVER (PARTITION BY f.n) AS read
      FROM fresh f
      ORDER BY f.n, f.priority, f.run_at DESC, f.id DESC
    )
    -- A key read: cut at its block (its cursor is its last job read); or
    -- short of it: it has no job up to the bound (its cursor is the bound),
    -- and none at all if there is no bound (exhausted: take 0).
    SELECT array_agg(CASE WHEN r.n IS NULL THEN k.take
                          WHEN coalesce(t.read, 0) = r.take THEN r.take
                          WHEN v_unbounded THEN 0
                          ELSE k.take END ORDER BY k.n),
           array_agg(CASE WHEN r.n IS NULL THEN k.after_priority
                          WHEN coalesce(t.read, 0) = r.take THEN t.priority ELSE v_bound_priority END ORDER BY k.n),
           array_agg(CASE WHEN r.n IS NULL THEN k.after_run_at
                          WHEN coalesce(t.read, 0) = r.take THEN t.run_at ELSE v_bound_run_at END ORDER BY k.n),
           array_agg(CASE WHEN r.n IS NULL THEN k.after_id
                          WHEN coalesce(t.read, 0) = r.take THEN t.id ELSE v_bound_id END ORDER BY k.n),
           v_pool_ids || (SELECT coalesce(array_agg(f.id), '{}') FROM fresh f),
           v_pool_priority || (SELECT coalesce(array_agg(f.priority), '{}') FROM fresh f),
           v_pool_run_at || (SELECT coalesce(array_agg(f.run_at), '{}') FROM fresh f)
    INTO v_take, v_after_priority, v_after_run_at, v_after_id,
         v_pool_ids, v_pool_priority, v_pool_run_at
    FROM unnest(v_take, v_after_priority, v_after_run_at, v_after_id)
         WITH ORDINALITY AS k(take, after_priority, after_run_at, after_id, n)
    LEFT JOIN refill r ON r.n = k.n
    LEFT JOIN tails t ON t.n = k.n;
  END LOOP;
  ids := v_ids;
  lost := v_lost;
END;
$$;

COMMENT ON FUNCTION idemq._claim_merge(text[], text[], int) IS
  'claim() over several (task, queue) keys: up to batch_size runnable jobs in global claim order, each key read only as far as needed, locked SKIP LOCKED.';

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
--   like any other (test/sql/claim-keys.test.ts).
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
  -- Why keys and not the names (migration 0028): with the variable-width
  -- names first, every comparison of an index insertion walked them to
  -- reach priority, run_at and id: 84.4k -> 71.4k instructions per job of
  -- a 10,000-job enqueue_many (callgrind, PostgreSQL 15).
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
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSE
    -- Several keys: _claim_merge reads each key only as far as the claim
    -- order needs and locks the jobs it takes (its header says how, and
    -- what it costs). Only a claim of several keys pays its call.
    SELECT m.ids, m.lost INTO v_ids, v_lost
    FROM idemq._claim_merge(v_key_tasks, v_key_queues, batch_size) m;
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

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._name_key FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- The runnable index on the keys of the names, rebuilt after _name_key exists.
-- Built without CONCURRENTLY (migrations run in a transaction): enqueues and
-- claims wait for the build, as they did for 0019's.
DROP INDEX idemq.jobs_runnable_by_task_queue;
CREATE INDEX jobs_runnable_by_task_queue
  ON idemq.jobs (idemq._name_key(task), idemq._name_key(queue), priority DESC, run_at, id)
  WITH (deduplicate_items = off)
  WHERE state IN ('enqueued', 'scheduled');

-- Down Migration

-- Back to the names, before _name_key is dropped below.
DROP INDEX idemq.jobs_runnable_by_task_queue;
CREATE INDEX jobs_runnable_by_task_queue ON idemq.jobs (task, queue, priority DESC, run_at, id)
  WITH (deduplicate_items = off)
  WHERE state IN ('enqueued', 'scheduled');

-- sql/functions/_claim_merge.sql as of 0021_one_runnable_index
-- idemq._claim_merge(key_tasks text[], key_queues text[], batch_size int,
--   OUT ids bigint[], OUT lost bigint[])
--
-- claim()'s jobs when it may take them from several (task, queue) keys: up
-- to batch_size runnable jobs in the global claim order (priority desc,
-- run_at, id), each key read only as far as that order needs, the jobs taken
-- locked FOR UPDATE SKIP LOCKED. claim() checks the arguments, finds the
-- keys, takes a single key's jobs itself and updates what this returns.
--
-- Guarantees:
--   * ids: the jobs taken, in claim order; lost: those of them whose
--     previous attempt lost its lease (claim() reports them as reclaimed).
--   * Every job in ids is runnable (state enqueued or scheduled, run_at <=
--     now(), not past expires_at) and locked by this transaction; no job
--     not taken is locked.
--   * No runnable job of these keys that this transaction could lock
--     precedes, in claim order, a job in ids that it did not take.
--   * Cost: the first round reads at most k + 2 x batch_size jobs for k
--     keys, one index descent per key (the method and its measurements are
--     in the body); no worst-case bound below k x batch_size is proven for
--     the later rounds.
-- Concurrency: FOR UPDATE SKIP LOCKED over jobs_runnable_by_task_queue:
--   jobs another transaction holds are passed over, never waited for.
-- Errors: none (claim() checks its arguments).
-- Tests: test/sql/claim-keys.test.ts, test/sql/claim-concurrency.test.ts, test/sql/claim.test.ts
CREATE OR REPLACE FUNCTION idemq._claim_merge(key_tasks text[], key_queues text[], batch_size int,
                                              OUT ids bigint[], OUT lost bigint[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, as claim() (its header says why: the statements below
-- were planned at every call with custom plans).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_key_tasks text[] := _claim_merge.key_tasks;
  v_key_queues text[] := _claim_merge.key_queues;
  v_ids bigint[];
  v_lost bigint[];
  v_need int;
  v_first int;
  v_take int[];
  v_after_priority int[];
  v_after_run_at timestamptz[];
  v_after_id bigint[];
  v_pool_ids bigint[];
  v_pool_priority int[];
  v_pool_run_at timestamptz[];
  v_bound_priority int;
  v_bound_run_at timestamptz;
  v_bound_id bigint;
  v_unbounded boolean;
  v_front_priority int;
  v_front_run_at timestamptz;
  v_front_id bigint;
  v_candidates bigint[];
BEGIN
  -- Several keys: a merge that reads each key only as far as the claim
  -- order needs (the former merge read batch_size jobs of every key: k x
  -- batch_size for k keys). Each key is read in blocks, in claim order;
  -- the jobs read and not yet handed out wait in a pool. A key whose block
  -- came back short of an unbounded read has no runnable job left
  -- (exhausted); otherwise its cursor is where its reading stopped. The
  -- frontier is the first cursor in claim order: no job not yet read can
  -- precede it, so the pool up to the frontier is in exact global order.
  -- Those candidates are locked in claim order, SKIP LOCKED, up to the jobs
  -- still needed: a job another claimer holds, or that stopped being
  -- runnable, is passed over and the next round looks past it. Locking
  -- inside each key's walk would lock jobs the merge then leaves (a row
  -- lock is a WAL record, and other claimers skip those jobs).
  -- Round 1 reads a first block of max(1, ceil(2 x batch_size / k)) jobs of
  -- every key: at most k + 2 x batch_size jobs, one index descent per key.
  -- A later round takes as its bound the need-th job of the pool (need:
  -- the jobs still wanted; with a smaller pool, no bound), and reads only
  -- the keys whose cursor precedes it, from just after the cursor and never
  -- past the bound, up to max(twice the key's last block, ceil(2 x need /
  -- the keys read)) jobs, at most need; a key with no job left before the
  -- bound gets the bound as its cursor. Evenly spread work ends after one
  -- or two rounds. 50,000 runnable jobs, claim(batch_size => 100), medians
  -- of 200 calls on a loaded 2-core machine, EXPLAIN (ANALYZE, BUFFERS) of
  -- the call: 50 pairs 4.2 ms, 2,198 buffers (this merge's predecessor
  -- 7.3 ms, 6,893 buffers); 200 pairs 9.2 ms, 3,789 buffers (26 ms, 23,038
  -- buffers); 10 pairs 2.6 ms either way. All jobs in one of 50 pairs, the
  -- others with one job each: two rounds, 3.0 ms against 2.2 ms (one
  -- round of 149 jobs): the second round's statements cost more than the
  -- jobs they save.
  -- "After the cursor" in claim order (priority desc, run_at, id) mixes
  -- directions, so no row comparison says it; it is a merge of index walks,
  -- each bounded by Index Conds after the equalities on task and queue: the
  -- rest of the cursor's priority (priority = cursor's AND (run_at, id) >
  -- cursor's, and <= the bound's when the bound has that priority), the
  -- priorities between (priority < cursor's AND priority > bound's), and the
  -- bound's priority up to it (priority = bound's AND (run_at, id) <=
  -- bound's). Spelt as one walk, "priority < p OR (priority = p AND (run_at,
  -- id) > (r, i))" is a Filter on a walk from the key's first entry:
  -- EXPLAIN (ANALYZE, BUFFERS), generic plan, a key of 2,000 jobs, 50 jobs
  -- after its 901st: Rows Removed by Filter: 901, 962 buffers, 0.41 ms; the
  -- walks below, 0 rows removed, 57 buffers, 0.18 ms.
  v_ids := '{}';
  v_lost := '{}';
  v_need := batch_size;
  v_first := least(v_need, greatest(1, ceil(2.0 * v_need / cardinality(v_key_tasks))::int));
  -- The first block of every key, from its start.
  WITH fresh AS MATERIALIZED (
    SELECT k.n, w.id, w.priority, w.run_at
    FROM unnest(v_key_tasks, v_key_queues) WITH ORDINALITY AS k(task, queue, n)
    CROSS JOIN LATERAL (
      SELECT j.id, j.priority, j.run_at
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.task = k.task
        AND j.queue = k.queue
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT v_first
    ) w
  ),
  tails AS (
    SELECT DISTINCT ON (f.n) f.n, f.id, f.priority, f.run_at, count(*) OVER (PARTITION BY f.n) AS read
    FROM fresh f
    ORDER BY f.n, f.priority, f.run_at DESC, f.id DESC
  )
  -- A key whose block came back short is exhausted (take 0).
  SELECT array_agg(CASE WHEN t.read = v_first THEN v_first ELSE 0 END ORDER BY k.n),
         array_agg(t.priority ORDER BY k.n),
         array_agg(t.run_at ORDER BY k.n),
         array_agg(t.id ORDER BY k.n),
         (SELECT coalesce(array_agg(f.id), '{}') FROM fresh f),
         (SELECT coalesce(array_agg(f.priority), '{}') FROM fresh f),
         (SELECT coalesce(array_agg(f.run_at), '{}') FROM fresh f)
  INTO v_take, v_after_priority, v_after_run_at, v_after_id,
       v_pool_ids, v_pool_priority, v_pool_run_at
  FROM generate_series(1, cardinality(v_key_tasks)) AS k(n)
  LEFT JOIN tails t ON t.n = k.n;
  LOOP
    -- The frontier: the first cursor of a key not exhausted (none: every
    -- runnable job of every key is in the pool).
    v_front_id := NULL;
    SELECT c.priority, c.run_at, c.id
    INTO v_front_priority, v_front_run_at, v_front_id
    FROM unnest(v_take, v_after_priority, v_after_run_at, v_after_id) AS c(take, priority, run_at, id)
    WHERE c.take > 0
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT 1;

    -- Candidates: the pool up to the frontier; the rest stays in the pool.
    SELECT coalesce(array_agg(p.id) FILTER (WHERE p.ready), '{}'),
           coalesce(array_agg(p.id) FILTER (WHERE NOT p.ready), '{}'),
           coalesce(array_agg(p.priority) FILTER (WHERE NOT p.ready), '{}'),
           coalesce(array_agg(p.run_at) FILTER (WHERE NOT p.ready), '{}')
    INTO v_candidates, v_pool_ids, v_pool_priority, v_pool_run_at
    FROM (
      SELECT u.id, u.priority, u.run_at,
             v_front_id IS NULL OR u.priority > v_front_priority
               OR (u.priority = v_front_priority AND (u.run_at, u.id) <= (v_front_run_at, v_front_id)) AS ready
      FROM unnest(v_pool_ids, v_pool_priority, v_pool_run_at) AS u(id, priority, run_at)
    ) p;

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
      LIMIT v_need
      FOR UPDATE SKIP LOCKED
    ) p;
    v_need := batch_size - cardinality(v_ids);
    EXIT WHEN v_need = 0 OR v_front_id IS NULL;

    -- The bound: the need-th job of the pool in claim order; with fewer
    -- jobs in the pool, none (past every job: lowest priority, run_at
    -- infinity, the largest id).
    v_bound_id := NULL;
    SELECT u.priority, u.run_at, u.id
    INTO v_bound_priority, v_bound_run_at, v_bound_id
    FROM unnest(v_pool_ids, v_pool_priority, v_pool_run_at) AS u(id, priority, run_at)
    ORDER BY u.priority DESC, u.run_at, u.id
    OFFSET v_need - 1
    LIMIT 1;
    v_unbounded := v_bound_id IS NULL;
    IF v_unbounded THEN
      v_bound_priority := -2147483648;
      v_bound_run_at := 'infinity';
      v_bound_id := 9223372036854775807;
    END IF;

    -- Read the keys not exhausted whose cursor precedes the bound, from
    -- just after the cursor up to the bound: each reads up to its block.
    WITH refill AS (
      SELECT k.task, k.queue, k.after_priority, k.after_run_at, k.after_id, k.n,
             least(v_need, greatest(2 * k.take, ceil(2.0 * v_need / count(*) OVER ())::int)) AS take
      FROM unnest(v_key_tasks, v_key_queues, v_take, v_after_priority, v_after_run_at, v_after_id)
           WITH ORDINALITY AS k(task, queue, take, after_priority, after_run_at, after_id, n)
      WHERE k.take > 0
        AND (k.after_priority > v_bound_priority
             OR (k.after_priority = v_bound_priority AND (k.after_run_at, k.after_id) < (v_bound_run_at, v_bound_id)))
    ),
    fresh AS MATERIALIZED (
      SELECT k.n, w.id, w.priority, w.run_at
      FROM refill k
      CROSS JOIN LATERAL (
        (SELECT j.id, j.priority, j.run_at
         FROM idemq.jobs j
         WHERE j.state IN ('enqueued', 'scheduled')
           AND j.task = k.task
           AND j.queue = k.queue
           AND j.priority = k.after_priority
           AND (j.run_at, j.id) > (k.after_run_at, k.after_id)
           AND (j.run_at, j.id) <= (CASE WHEN k.after_priority = v_bound_priority THEN v_bound_run_at ELSE 'infinity' END,
                                    CASE WHEN k.after_priority = v_bound_priority THEN v_bound_id ELSE 9223372036854775807 END)
           AND j.run_at <= now()
           AND (j.expires_at IS NULL OR j.expires_at > now())
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT k.take)
        UNION ALL
        (SELECT j.id, j.priority, j.run_at
         FROM idemq.jobs j
         WHERE j.state IN ('enqueued', 'scheduled')
           AND j.task = k.task
           AND j.queue = k.queue
           AND j.priority < k.after_priority
           AND j.priority > v_bound_priority
           AND j.run_at <= now()
           AND (j.expires_at IS NULL OR j.expires_at > now())
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT k.take)
        UNION ALL
        (SELECT j.id, j.priority, j.run_at
         FROM idemq.jobs j
         WHERE k.after_priority > v_bound_priority
           AND j.state IN ('enqueued', 'scheduled')
           AND j.task = k.task
           AND j.queue = k.queue
           AND j.priority = v_bound_priority
           AND (j.run_at, j.id) <= (v_bound_run_at, v_bound_id)
           AND j.run_at <= now()
           AND (j.expires_at IS NULL OR j.expires_at > now())
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT k.take)
        ORDER BY 2 DESC, 3, 1
        LIMIT k.take
      ) w
    ),
    tails AS (
      SELECT DISTINCT ON (f.n) f.n, f.id, f.priority, f.run_at, count(*) OVER (PARTITION BY f.n) AS read
      FROM fresh f
      ORDER BY f.n, f.priority, f.run_at DESC, f.id DESC
    )
    -- A key read: cut at its block (its cursor is its last job read); or
    -- short of it: it has no job up to the bound (its cursor is the bound),
    -- and none at all if there is no bound (exhausted: take 0).
    SELECT array_agg(CASE WHEN r.n IS NULL THEN k.take
                          WHEN coalesce(t.read, 0) = r.take THEN r.take
                          WHEN v_unbounded THEN 0
                          ELSE k.take END ORDER BY k.n),
           array_agg(CASE WHEN r.n IS NULL THEN k.after_priority
                          WHEN coalesce(t.read, 0) = r.take THEN t.priority ELSE v_bound_priority END ORDER BY k.n),
           array_agg(CASE WHEN r.n IS NULL THEN k.after_run_at
                          WHEN coalesce(t.read, 0) = r.take THEN t.run_at ELSE v_bound_run_at END ORDER BY k.n),
           array_agg(CASE WHEN r.n IS NULL THEN k.after_id
                          WHEN coalesce(t.read, 0) = r.take THEN t.id ELSE v_bound_id END ORDER BY k.n),
           v_pool_ids || (SELECT coalesce(array_agg(f.id), '{}') FROM fresh f),
           v_pool_priority || (SELECT coalesce(array_agg(f.priority), '{}') FROM fresh f),
           v_pool_run_at || (SELECT coalesce(array_agg(f.run_at), '{}') FROM fresh f)
    INTO v_take, v_after_priority, v_after_run_at, v_after_id,
         v_pool_ids, v_pool_priority, v_pool_run_at
    FROM unnest(v_take, v_after_priority, v_after_run_at, v_after_id)
         WITH ORDINALITY AS k(take, after_priority, after_run_at, after_id, n)
    LEFT JOIN refill r ON r.n = k.n
    LEFT JOIN tails t ON t.n = k.n;
  END LOOP;
  ids := v_ids;
  lost := v_lost;
END;
$$;

COMMENT ON FUNCTION idemq._claim_merge(text[], text[], int) IS
  'claim() over several (task, queue) keys: up to batch_size runnable jobs in global claim order, each key read only as far as needed, locked SKIP LOCKED.';

-- sql/functions/claim.sql as of 0021_one_runnable_index
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
--   jobs_runnable_by_task_queue, walked one (task, queue) key at a time:
--   concurrent claimers never block each other and never get the same job.
--   Jobs locked by another transaction (being claimed, cancelled...) are
--   skipped, not waited for. A claim of several keys locks only the jobs it
--   takes, and a held job at its merge's frontier or bound is passed over
--   like any other (test/sql/claim-keys.test.ts).
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
    -- Several keys: _claim_merge reads each key only as far as the claim
    -- order needs and locks the jobs it takes (its header says how, and
    -- what it costs). Only a claim of several keys pays its call.
    SELECT m.ids, m.lost INTO v_ids, v_lost
    FROM idemq._claim_merge(v_key_tasks, v_key_queues, batch_size) m;
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

DROP FUNCTION idemq._name_key;

-- Hand-written reversal of the schema changes above goes here, after the functions.
