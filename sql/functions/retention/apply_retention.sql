-- idemq.apply_retention(batch_size int DEFAULT 1000) RETURNS int
--
-- Deletes at most batch_size finished jobs that are past their retention;
-- returns how many. Call it again while it returns batch_size (the workers'
-- maintenance timer does).
--
-- Guarantees:
--   * A job's retention is, for its terminal state, the override
--     (idemq.retention, set_retention) of its task, else of its queue, else
--     the default (settings retention_<state>_seconds: succeeded 7 days,
--     failed, cancelled, expired 30 days). A job is deleted once its
--     finished_at is more than that long ago; no active job is ever deleted.
--   * Never releases an idempotency key (prune_keys does, after the key
--     retention); dependency rows of deleted parents go with them.
--   * Each call is one short transaction: at most batch_size row locks and
--     deletions, oldest first within each rule.
--   * It also deletes up to batch_size rows of idemq.workers not seen
--     (worker_seen) for worker_retention_seconds (default a day: a worker
--     that crashed never said it stopped), or stopped (worker_stopped) more
--     than stopped_worker_seconds ago (default an hour); they are not in
--     the count.
--   * And up to batch_size events emitted more than event_retention_seconds
--     ago (_prune_events; default 7 days); not in the count either.
--   * Then it corrects the slot counts of up to batch_size concurrency
--     limits that disagree with the jobs processing (_repair_slots: a write
--     the jobs trigger missed); they are not in the count either.
--   * Last, it folds idemq.job_counts (the rows _count_jobs appends, one per
--     group and statement that changed a count) into one row per (queue,
--     task, state), dropping the groups that sum to 0: the sums, so
--     stats() and overview(), do not change; what they read shrinks back to
--     about one row per group. Every worker calls it on its maintenance
--     timer; a database without workers needs it scheduled (pg_cron), or
--     that table grows with every statement that changes a job's state.
--   * The fold adds each stamped row (its at: the statement's start) to its
--     minute of idemq.job_minutes, the dashboard's history (history()):
--     started (positive processing counts), succeeded and failed (positive
--     counts of those states), retried (the jobs that left processing less
--     those that succeeded or failed: retries, rescues, snoozes, holds,
--     and cancels or deletions of running jobs). Exactly once: a row is
--     deleted by the one call that folds it. Rows stamped more than a day
--     ago (the history kept) are folded without it. A statement that
--     commits after the fold that would have taken it is folded by the
--     next, into its own minute.
-- Concurrency: FOR UPDATE SKIP LOCKED: rows a concurrent transaction holds
--   (a retry, a purge, another worker's apply_retention, a worker_seen) are left for the
--   next call; concurrent callers never wait for each other (the slot
--   repair skips locked slots too). The fold takes
--   the count rows committed before it looked, skipping those another
--   caller's fold holds; writers only append, so it waits for none of them.
--   Two folds adding to the same minute of idemq.job_minutes (or a
--   roll_up() writing it) wait for each other there, briefly, in key order.
--   It runs after the jobs are locked, so a TRUNCATE of idemq.jobs (whose
--   trigger empties the counts) waits for the whole call, never the reverse.
-- Errors: 22004 NULL batch_size; 22023 batch_size outside 1..10000.
-- Tests: test/sql/retention-policy.test.ts, test/worker/retention.test.ts,
--   test/sql/job-counts.test.ts, test/sql/flow-control-repair.test.ts,
--   test/sql/history.test.ts
CREATE OR REPLACE FUNCTION idemq.apply_retention(batch_size int DEFAULT 1000)
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_left int := batch_size;
  v_rule record;
  v_ids bigint[];
  v_state idemq.job_state;
  v_cutoff timestamptz;
BEGIN
  PERFORM idemq._check_delete_batch('apply_retention', batch_size);

  DELETE FROM idemq.workers w
  WHERE w.worker_id IN (
    SELECT s.worker_id FROM idemq.workers s
    WHERE s.last_seen_at < now() - make_interval(secs => idemq._limit('worker_retention_seconds'))
       OR s.stopped_at < now() - make_interval(secs => idemq._limit('stopped_worker_seconds'))
    LIMIT batch_size
    FOR UPDATE SKIP LOCKED);

  PERFORM idemq._prune_events(batch_size);

  -- One rule at a time: the overrides of tasks, of queues, then each state's
  -- default, each rule excluding the rows a more specific one governs. Each
  -- lock query is a range scan of jobs_by_finish (state, finished_at) in
  -- index order. Planner trap: plpgsql caches a generic plan after five
  -- calls, and a generic plan estimates "finished_at < $2" at a third of the
  -- rows. Without the ORDER BY, on 100,000 finished jobs none of which was
  -- due (plus 5,000 enqueued), the generic plan was a sequential scan with
  -- LIMIT: 105,000 rows filtered, 2,993 buffers, 16 ms, to find nothing, on
  -- every timer tick. With it, a sort of the whole range is the only other
  -- plan, and the plan is the jobs_by_finish index scan: 3 buffers, 0.08 ms
  -- (EXPLAIN ANALYZE, plan_cache_mode = force_generic_plan, PostgreSQL 15).
  -- Cost: a rule steps over the rows of its state that are older than its
  -- cutoff but kept by a more specific rule (e.g. a queue kept a year is
  -- stepped over by the default's scan), in index entries and heap visits.
  FOR v_rule IN
    SELECT r.task, r.queue, r.state, r.keep FROM idemq.retention r
    ORDER BY r.task IS NULL, r.task, r.queue, r.state
  LOOP
    EXIT WHEN v_left = 0;
    v_cutoff := now() - v_rule.keep;
    IF v_rule.task IS NOT NULL THEN
      SELECT array_agg(x.id) INTO v_ids FROM (
        SELECT j.id FROM idemq.jobs j
        WHERE j.state = v_rule.state AND j.finished_at < v_cutoff AND j.task = v_rule.task
        ORDER BY j.finished_at
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED) x;
    ELSE
      SELECT array_agg(x.id) INTO v_ids FROM (
        SELECT j.id FROM idemq.jobs j
        WHERE j.state = v_rule.state AND j.finished_at < v_cutoff AND j.queue = v_rule.queue
          AND NOT EXISTS (SELECT 1 FROM idemq.retention r WHERE r.task = j.task AND r.state = j.state)
        ORDER BY j.finished_at
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED) x;
    END IF;
    v_left := v_left - idemq._delete_jobs(coalesce(v_ids, '{}'));
  END LOOP;

  FOREACH v_state IN ARRAY idemq.terminal_states() LOOP
    EXIT WHEN v_left = 0;
    v_cutoff := now() - idemq._default_retention(v_state);
    SELECT array_agg(x.id) INTO v_ids FROM (
      SELECT j.id FROM idemq.jobs j
      WHERE j.state = v_state AND j.finished_at < v_cutoff
        AND NOT EXISTS (SELECT 1 FROM idemq.retention r WHERE r.task = j.task AND r.state = j.state)
        AND NOT EXISTS (SELECT 1 FROM idemq.retention r WHERE r.queue = j.queue AND r.state = j.state)
      ORDER BY j.finished_at
      LIMIT v_left
      FOR UPDATE OF j SKIP LOCKED) x;
    v_left := v_left - idemq._delete_jobs(coalesce(v_ids, '{}'));
  END LOOP;

  -- Flow control: slot counts a write unseen by the trigger left off.
  PERFORM idemq._repair_slots(batch_size);

  -- Fold the appended count rows (their deletions above included). Rows a
  -- writer appends meanwhile are not seen and stay for the next call. The
  -- stamped rows' counts go to their minute of idemq.job_minutes first
  -- (added: each row is deleted here, by one caller, exactly once), in key
  -- order, so two folders lock the minute rows in the same order.
  WITH taken AS MATERIALIZED (
    SELECT c.ctid AS row_id FROM idemq.job_counts c FOR UPDATE SKIP LOCKED
  ), folded AS (
    DELETE FROM idemq.job_counts AS c USING taken t WHERE c.ctid = t.row_id
    RETURNING c.queue, c.task, c.state, c.n, c.at
  ), minutes AS (
    INSERT INTO idemq.job_minutes AS m (minute, queue, task, started, succeeded, failed, retried)
    SELECT x.minute, x.queue, x.task, x.started, x.succeeded, x.failed,
           -- Left processing without finishing: retried, rescued, snoozed, held.
           greatest(x.left_processing - x.succeeded - x.failed, 0)
    FROM (SELECT idemq._minute_of(f.at) AS minute, f.queue, f.task,
                 coalesce(sum(f.n) FILTER (WHERE f.state = 'processing' AND f.n > 0), 0) AS started,
                 coalesce(sum(f.n) FILTER (WHERE f.state = 'succeeded' AND f.n > 0), 0) AS succeeded,
                 coalesce(sum(f.n) FILTER (WHERE f.state = 'failed' AND f.n > 0), 0) AS failed,
                 coalesce(-sum(f.n) FILTER (WHERE f.state = 'processing' AND f.n < 0), 0) AS left_processing
          FROM folded f
          WHERE f.at >= now() - idemq._history_kept()
          GROUP BY 1, 2, 3) x
    WHERE x.started + x.succeeded + x.failed + x.left_processing > 0
    ORDER BY x.minute, x.queue, x.task
    ON CONFLICT (minute, queue, task) DO UPDATE
    SET started = m.started + excluded.started, succeeded = m.succeeded + excluded.succeeded,
        failed = m.failed + excluded.failed, retried = m.retried + excluded.retried
  )
  INSERT INTO idemq.job_counts (queue, task, state, n, at)
  SELECT f.queue, f.task, f.state, sum(f.n), NULL
  FROM folded f
  GROUP BY f.queue, f.task, f.state
  HAVING sum(f.n) <> 0;
  RETURN batch_size - v_left;
END;
$$;

COMMENT ON FUNCTION idemq.apply_retention(int) IS
  'Delete at most batch_size finished jobs past their retention (task, queue override or state default); keys stay.';
