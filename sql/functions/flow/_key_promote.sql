-- idemq._key_promote(keys text[]) RETURNS void
--
-- Admits waiting jobs of these concurrency keys while their keys have room:
-- for each key, the best jobs waiting for it (awaiting, no parent left in
-- job_dependencies; by priority desc, run_at, id: the order claim() takes
-- them in) become enqueued (or scheduled, _initial_state), as many as the
-- key has room for: K (_per_key of the best waiting job's queue and task)
-- less its admitted jobs (enqueued, scheduled or processing). Called by the trigger function _count_jobs when admitted
-- jobs leave (finish or are deleted), by enqueue and _insert_jobs for new
-- jobs, by _on_job_finished for children whose parents all succeeded, by
-- retry and by set_limit (a raised per_key).
--
-- Guarantees:
--   * Under the keys' locks (_key_lock) and in statements started after
--     them: at most K of a key are admitted once this returns (K read for
--     the key's best waiting job: jobs of one key in scopes with different
--     per_key are admitted by the K of the one at the head), and none of its
--     jobs waits for it while it has room.
--   * Set-based: one SELECT and one UPDATE for all the keys (one trigger
--     call), again only when a picked job changed meanwhile. With a hand-off
--     (below), one UPDATE for the handed jobs and the promotion's only when
--     some picked job was not handed.
--   * A promoted job runnable now wakes its queue's waiting consumers
--     (_notify_waiting).
--   * Costs a key with nothing waiting one probe of jobs_key_waiting.
--   * Hand-off (complete_and_take_next): while the transaction-local setting
--     idemq.hand_off names a worker (set only around that function's
--     completion), a picked job that claim() would hand that worker now goes
--     straight from awaiting to processing under its lease, one write instead
--     of the promotion's and the claim's two, and its id is appended to
--     idemq.handed. "Would hand": runnable now (run_at passed, not expired), of
--     the worker's tasks and queues, its previous attempt did not lose its
--     lease, no pause, concurrency limit, rate limit or hold on its queue or
--     task and no hold on its key, and no runnable job of its (task, queue)
--     before it in claim order. Every other picked job is promoted as above.
--     The lease, attempt and token are set as claim(token => true) sets them.
-- Concurrency: the count is exact because every admission of a key holds
--   its lock, and every release (_count_jobs) takes it after the released
--   job left: a release that commits after this one's count promotes after
--   this transaction ends; one counted as still admitted only delays. The
--   promoted row is updated only if still awaiting without parents (read on
--   its newest version), so a concurrent cancel is never undone.
-- Errors: none.
-- Tests: test/sql/concurrency-keys.test.ts, test/sql/concurrency-keys-concurrency.test.ts,
--   test/sql/take-next.test.ts
CREATE OR REPLACE FUNCTION idemq._key_promote(keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_keys text[];
  v_picked bigint[];
  v_picked_tasks text[];
  v_picked_queues text[];
  v_moved int;
  v_queues text[];
  -- Without any per_key set (the usual case) K is 1 for every job: no
  -- _per_key call per key.
  v_per_key_set boolean := EXISTS (SELECT FROM idemq.limits l WHERE l.per_key IS NOT NULL);
  -- Without any parent edge (no job enqueued with `after` is waiting), no
  -- probe of job_dependencies per job: two index probes a promoted job less.
  v_parents boolean := EXISTS (SELECT FROM idemq.job_dependencies);
  -- complete_and_take_next's worker: {"worker", "lease", "queues", "tasks"};
  -- NULL (the usual case) promotes every picked job.
  v_hand jsonb := nullif(current_setting('idemq.hand_off', true), '')::jsonb;
  v_worker text;
  v_lease interval;
  v_hand_queues text[];
  v_hand_tasks text[];
  v_scopes_limited boolean;
  v_keys_held boolean;
  v_handed bigint[];
BEGIN
  IF v_hand IS NOT NULL THEN
    v_worker := v_hand->>'worker';
    v_lease := (v_hand->>'lease')::interval;
    v_hand_queues := CASE WHEN jsonb_typeof(v_hand->'queues') = 'array'
                          THEN ARRAY(SELECT jsonb_array_elements_text(v_hand->'queues')) END;
    v_hand_tasks := CASE WHEN jsonb_typeof(v_hand->'tasks') = 'array'
                         THEN ARRAY(SELECT jsonb_array_elements_text(v_hand->'tasks')) END;
    -- One read each of the small tables: while no scope is paused, limited
    -- or held, and no key held, no probe per job.
    v_scopes_limited := EXISTS (SELECT FROM idemq.limits l
                                WHERE l.paused OR l.concurrency IS NOT NULL OR l.rate IS NOT NULL
                                   OR l.held_until > now());
    v_keys_held := EXISTS (SELECT FROM idemq.key_holds h WHERE h.held_until > now());
  END IF;
  PERFORM idemq._key_lock(keys);
  SELECT array_agg(DISTINCT k) INTO v_keys FROM unnest(keys) AS k WHERE k IS NOT NULL;
  LOOP
    -- One statement for every key (a complete_many of 100 jobs of 100 keys
    -- promotes 100 jobs in one UPDATE, one trigger call): per key, its
    -- admitted count, then as many of its best waiting jobs as K leaves
    -- room for. Started after the locks (see Concurrency).
    SELECT array_agg(p.id), array_agg(p.task), array_agg(p.queue) INTO v_picked, v_picked_tasks, v_picked_queues
    FROM unnest(v_keys) AS k(key)
    CROSS JOIN LATERAL (
      SELECT count(*) AS n FROM idemq.jobs h
      WHERE h.concurrency_key = k.key AND h.state IN ('enqueued', 'scheduled', 'processing')) AS a
    CROSS JOIN LATERAL (
      SELECT w.id, w.task, w.queue FROM idemq.jobs w
      WHERE w.concurrency_key = k.key AND w.state = 'awaiting'
        AND (NOT v_parents OR NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = w.id))
      ORDER BY w.priority DESC, w.run_at, w.id
      -- K is 1 unless a per_key is set; then the K of the best waiting job.
      LIMIT greatest(CASE WHEN NOT v_per_key_set THEN 1
                          ELSE (SELECT idemq._per_key(b.queue, b.task) FROM idemq.jobs b
                                WHERE b.concurrency_key = k.key AND b.state = 'awaiting'
                                  AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = b.id)
                                ORDER BY b.priority DESC, b.run_at, b.id
                                LIMIT 1) END - a.n, 0)) AS p;
    EXIT WHEN v_picked IS NULL;
    v_handed := '{}';
    IF v_hand IS NOT NULL THEN
      -- The picked jobs the completing worker's next claim would take,
      -- claimed here (as claim(token => true) claims: attempt, lease, token;
      -- the same columns and values as claim's UPDATE, held equal by
      -- test/sql/predicates.test.ts).
      -- Claim order within the job's (task, queue): the first runnable job
      -- there, one descent of jobs_runnable_by_task_queue, must not come
      -- before it, so a worker handed a key's jobs one after another never
      -- passes over older or higher-priority work of its task and queue.
      -- One descent per (task, queue) of the picked jobs (firsts), not one
      -- per job: the picked jobs of a completion are mostly of one task and
      -- queue, and a descent per job was 6.6% of a keyed completion's
      -- instructions (bench/FINDINGS.md, "The keyed completion's cost").
      -- Read in the UPDATE's own snapshot, as a per-row probe would be. A
      -- job's task and queue never change (no function writes them), so the
      -- picked version's pair is the updated version's.
      WITH firsts AS MATERIALIZED (
        SELECT t.task, t.queue, f.priority, f.run_at, f.id
        FROM (SELECT DISTINCT u.task, u.queue FROM unnest(v_picked_tasks, v_picked_queues) AS u(task, queue)) t
        CROSS JOIN LATERAL (
          SELECT r.priority, r.run_at, r.id FROM idemq.jobs r
          WHERE r.state IN ('enqueued', 'scheduled')
            AND idemq._name_key(r.task) = idemq._name_key(t.task)
            AND idemq._name_key(r.queue) = idemq._name_key(t.queue)
            AND r.task = t.task AND r.queue = t.queue
            AND r.run_at <= now() AND (r.expires_at IS NULL OR r.expires_at > now())
          ORDER BY r.priority DESC, r.run_at, r.id
          LIMIT 1) f
      ), handed AS (
        UPDATE idemq.jobs AS j
        SET state = 'processing', attempt = j.attempt + 1, locked_by = v_worker,
            locked_at = now(), lease_lost = false,
            lease_expires_at = idemq._lease_until(now(), j.timeout, v_lease),
            lease_token = gen_random_uuid(), queue_slot = NULL, task_slot = NULL, progress = NULL
        WHERE j.id = ANY (v_picked) AND j.state = 'awaiting'
          AND (NOT v_parents OR NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id))
          AND j.run_at <= now() AND (j.expires_at IS NULL OR j.expires_at > now())
          AND NOT j.lease_lost
          AND (v_hand_tasks IS NULL OR j.task = ANY (v_hand_tasks))
          AND (v_hand_queues IS NULL OR j.queue = ANY (v_hand_queues))
          AND (NOT v_scopes_limited OR NOT EXISTS (
                 SELECT FROM idemq.limits l
                 WHERE ((l.kind = 'queue' AND l.name = j.queue) OR (l.kind = 'task' AND l.name = j.task))
                   AND (l.paused OR l.concurrency IS NOT NULL OR l.rate IS NOT NULL OR l.held_until > now())))
          AND (NOT v_keys_held OR NOT EXISTS (
                 SELECT FROM idemq.key_holds h WHERE h.concurrency_key = j.concurrency_key AND h.held_until > now()))
          AND NOT EXISTS (
                 SELECT FROM firsts f
                 WHERE f.task = j.task AND f.queue = j.queue
                   AND (f.priority > j.priority OR (f.priority = j.priority AND (f.run_at, f.id) < (j.run_at, j.id))))
        RETURNING j.id
      )
      SELECT coalesce(array_agg(h.id), '{}') INTO v_handed FROM handed h;
      IF cardinality(v_handed) > 0 THEN
        PERFORM set_config('idemq.handed',
          concat_ws(',', nullif(current_setting('idemq.handed', true), ''), array_to_string(v_handed, ',')), true);
      END IF;
    END IF;
    -- Every picked job handed: no promotion statement (it would find no
    -- row, and still run the jobs trigger).
    EXIT WHEN cardinality(v_handed) = cardinality(v_picked);
    -- Re-judged on each row's newest version: a job cancelled or deleted
    -- meanwhile is left alone, and the keys are looked at again.
    WITH moved AS (
      UPDATE idemq.jobs AS j SET state = idemq._initial_state(j.run_at)
      WHERE j.id = ANY (v_picked) AND NOT j.id = ANY (v_handed) AND j.state = 'awaiting'
        AND (NOT v_parents OR NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id))
      RETURNING j.queue, j.state
    )
    SELECT count(*), array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued') INTO v_moved, v_queues
    FROM moved m;
    PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) AS q;
    EXIT WHEN v_moved + cardinality(v_handed) = cardinality(v_picked);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._key_promote(text[]) IS
  'Admit the best waiting jobs of these concurrency keys while fewer than K of each are admitted; called where a key''s place frees or its jobs arrive.';
