-- idemq._insert_jobs(jobs idemq._planned_job[], keyed boolean, parents boolean, as_children boolean DEFAULT false)
--   RETURNS void
--
-- Insert, the last part of an enqueue: writes the plan's `created` jobs,
-- wires their continuations, counts the other outcomes, and wakes waiting
-- consumers. `keyed` / `parents` (see _enqueue_planned): some element has a
-- key (so outcomes other than created may need counting) / parents;
-- `as_children`: the jobs are about to be linked as children (spawn,
-- enqueue_batch), so they are written with has_children set.
--
-- Guarantees:
--   * Each created job starts `awaiting` when a parent in `after` has not
--     succeeded, else in _initial_state(run_at); a parent already failed,
--     cancelled or expired (_unsuccessful_states) cancels its new child at
--     once, through an UPDATE so the key ledger and grandchildren follow, with
--     the reason in its errors. An awaiting child records what it waits on
--     in job_dependencies.
--   * A created job with a concurrency key and no parent waiting starts
--     `awaiting` too, and _key_promote then admits the best of each key's
--     waiting jobs up to its room (docs/design.md, "Concurrency keys").
--   * With as_children, each created job is written with has_children (its
--     finish runs the jobs trigger, which records it for its parent): once,
--     not inserted and then updated.
--   * Outcomes other than created are counted per task for stats().
--   * NOTIFY idemq_jobs (payload: queue) once per queue with a job runnable
--     now, when a session waits for it (_notify_waiting).
--   * No key logic: _resolve_keys decided the outcomes; parents are locked
--     by _lock_parents, so the states read here hold until commit.
-- Concurrency: plain inserts; see _notify_waiting for its advisory locks.
-- Errors: none of its own.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/continuations.test.ts, test/sql/wake-up.test.ts, test/sql/concurrency-keys.test.ts
CREATE OR REPLACE FUNCTION idemq._insert_jobs(jobs idemq._planned_job[], keyed boolean, parents boolean,
                                              as_children boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the jobs array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_notified bigint;
BEGIN
  WITH ins AS (
    INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                 idempotency_key, backoff, expires_at, traceparent, concurrency_key, timeout,
                                 has_children)
    SELECT p.job_id, p.task, p.queue, p.payload,
           CASE WHEN parents AND p.after IS NOT NULL AND EXISTS (
                  SELECT 1 FROM idemq.jobs pj WHERE pj.id = ANY (p.after) AND pj.state <> 'succeeded')
                THEN 'awaiting'::idemq.job_state
                WHEN p.concurrency_key IS NOT NULL THEN 'awaiting'::idemq.job_state
                ELSE idemq._initial_state(p.run_at) END,
           p.priority, p.run_at, p.max_attempts, p.idempotency_key, p.backoff, p.expires_at, p.traceparent,
           p.concurrency_key, p.timeout, _insert_jobs.as_children
    FROM unnest(jobs) p
    WHERE p.outcome = 'created'
    RETURNING j.queue, j.state
  )
  SELECT count(idemq._notify_waiting(q.queue)) INTO v_notified
  FROM (SELECT DISTINCT i.queue FROM ins i WHERE i.state = 'enqueued') q;

  IF keyed THEN
    INSERT INTO idemq.counters AS c (task, event, n)
    SELECT p.task, p.outcome, count(*)
    FROM unnest(jobs) p
    WHERE p.outcome <> 'created'
    GROUP BY 1, 2;
  END IF;

  IF parents THEN
    INSERT INTO idemq.job_dependencies (parent_id, child_id)
    SELECT DISTINCT pj.id, p.job_id
    FROM unnest(jobs) p
    JOIN idemq.jobs pj ON pj.id = ANY (p.after)
    WHERE p.outcome = 'created' AND pj.state <> 'succeeded'
      AND NOT EXISTS (SELECT 1 FROM idemq.jobs u
                      WHERE u.id = ANY (p.after) AND u.state = ANY (idemq._unsuccessful_states()));

    UPDATE idemq.jobs AS j
    SET state = 'cancelled', finished_at = now(),
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
          'message', format('parent job %s ended %s before this job could run', f.parent_id, f.parent_state)))
    FROM (SELECT DISTINCT ON (p.job_id) p.job_id, pj.id AS parent_id, pj.state AS parent_state
          FROM unnest(jobs) p
          JOIN idemq.jobs pj ON pj.id = ANY (p.after)
          WHERE p.outcome = 'created' AND pj.state = ANY (idemq._unsuccessful_states())
          ORDER BY p.job_id, pj.id) f
    WHERE j.id = f.job_id;
  END IF;
  -- Concurrency keys: the new jobs of each key wait; admit what fits. After the
  -- continuations: a child waiting for parents has its job_dependencies rows
  -- by now, and _key_promote leaves it alone.
  IF EXISTS (SELECT FROM unnest(jobs) p WHERE p.outcome = 'created' AND p.concurrency_key IS NOT NULL) THEN
    PERFORM idemq._key_promote(ARRAY(SELECT p.concurrency_key FROM unnest(jobs) p
                                     WHERE p.outcome = 'created' AND p.concurrency_key IS NOT NULL));
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._insert_jobs(idemq._planned_job[], boolean, boolean, boolean) IS
  'Write a plan''s created jobs (state, continuations), count the other outcomes, and notify waiting consumers.';
