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
