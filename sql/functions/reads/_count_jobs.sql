-- idemq._count_jobs() RETURNS trigger
--
-- Trigger (AFTER INSERT, AFTER UPDATE, AFTER DELETE ON idemq.jobs, FOR EACH
-- STATEMENT, with the statement's rows as the transition tables old_jobs and
-- new_jobs; and AFTER TRUNCATE): keeps idemq.job_counts, the number of jobs
-- per (queue, task, state) that stats() and overview() read instead of
-- counting the jobs table; gives back the flow-control slots of attempts
-- that leave processing (idemq.limit_releases); and admits the next waiting jobs of
-- concurrency keys whose admitted jobs finished or were deleted
-- (_key_promote).
--
-- Guarantees:
--   * After every statement that inserts, updates or deletes jobs, whoever
--     makes it (every idemq function, a function of an older version still
--     running during an upgrade, an owner's direct SQL), the sum of
--     idemq.job_counts.n per (queue, task, state) equals the number of jobs
--     in that state, in the writer's transaction: a reader sees both or
--     neither. TRUNCATE of idemq.jobs empties it.
--   * One row per (queue, task, state) whose count the statement changed, n
--     the change (negative for jobs that left the state); none for a
--     statement that changed no state (a heartbeat). The rows are summed by
--     _job_counts() and folded into one per group by apply_retention().
-- Concurrency: appends rows and updates none, so concurrent writers never
--   wait for each other here (a counter row updated in place would queue
--   every transaction of one queue and task behind the one holding it).
--   apply_retention() folds only rows committed before it looked, skipping
--   any another folder holds.
-- Cost: a fixed cost per INSERT or UPDATE statement (the trigger call, its
--   transition tables, the grouped INSERT) plus each row's copy into the
--   transition tables, about a tenth of a single enqueue() and a few
--   percent per job of a batch (measured: bench/FINDINGS.md, "Why the SQL
--   is written as it is"; docs/design.md, "Job counts"). Why triggers and
--   not an INSERT in each function (a quarter of the cost): a write that
--   function did not make, such as a 0.1.0 function that waited on the
--   upgrade's lock and goes on with its old body, would stay uncounted for
--   good.
-- Errors: none of its own.
-- Tests: test/sql/job-counts.test.ts, test/contract/state-machine-code.test.ts,
--   test/sql/concurrency-keys.test.ts, test/sql/concurrency-keys-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._count_jobs()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_keys text[];
BEGIN
  -- Flow control: the concurrency slots of attempts that left processing
  -- (or were deleted) are given back in this same statement's transaction,
  -- by whoever moved them: one row appended to idemq.limit_releases per
  -- stripe, with the number of jobs (the next claim to lock the stripe folds
  -- it: _lock_slots). A job's stripe is the one claim() wrote on it
  -- (queue_slot, task_slot); one that names a stripe older than its limit's
  -- first (numbers only grow: idemq.limit_slot_numbers, no cache) or none
  -- was processing when set_limit made the limit, which counted it in
  -- first_slot. Appending takes no lock, so a completion never waits for a
  -- claim or another completion here. Skipped, after one read of the small
  -- idemq.limits, while no scope has a concurrency limit.
  IF TG_OP <> 'INSERT' AND EXISTS (SELECT FROM idemq.limits l WHERE l.slot_rows > 0) THEN
    IF TG_OP = 'UPDATE' THEN
      -- A claim's statement moved no job out of processing: one read of
      -- old_jobs, stopped early. Otherwise, per stripe, the jobs naming it
      -- that were processing before the statement less those processing
      -- after it: what left (a heartbeat's jobs cancel out; a claim's only
      -- come in, and claim() counted them). Planner trap: no join of
      -- old_jobs with new_jobs. A transition table has no statistics, so
      -- the plan (cached for the session) expects one row of each and
      -- nests the loops: EXPLAIN ANALYZE of the join on id under a worker's
      -- complete_many of 500 jobs, Rows Removed by Join Filter: 248502,
      -- 44-107 ms a statement (a worker at a non-binding limit ran at about
      -- half the speed of one without); grouped, as here, each side is read
      -- once.
      IF EXISTS (SELECT FROM old_jobs o WHERE o.state = 'processing') THEN
        INSERT INTO idemq.limit_releases (limit_id, slot, n)
        SELECT l.id, idemq._stripe_of(v.slot, l.first_slot), sum(d.n)
        FROM (SELECT o.queue, o.task, o.queue_slot, o.task_slot, count(*) AS n
              FROM old_jobs o WHERE o.state = 'processing'
              GROUP BY o.queue, o.task, o.queue_slot, o.task_slot
              UNION ALL
              SELECT w.queue, w.task, w.queue_slot, w.task_slot, -count(*)
              FROM new_jobs w WHERE w.state = 'processing'
              GROUP BY w.queue, w.task, w.queue_slot, w.task_slot) d
        CROSS JOIN LATERAL (VALUES ('queue', d.queue, d.queue_slot), ('task', d.task, d.task_slot)) AS v(kind, name, slot)
        JOIN idemq.limits l ON l.kind = v.kind AND l.name = v.name AND l.slot_rows > 0
        GROUP BY 1, 2
        HAVING sum(d.n) > 0;
      END IF;
    ELSIF TG_OP = 'DELETE' THEN
      INSERT INTO idemq.limit_releases (limit_id, slot, n)
      SELECT l.id, idemq._stripe_of(v.slot, l.first_slot), count(*)
      FROM old_jobs o
      CROSS JOIN LATERAL (VALUES ('queue', o.queue, o.queue_slot), ('task', o.task, o.task_slot)) AS v(kind, name, slot)
      JOIN idemq.limits l ON l.kind = v.kind AND l.name = v.name AND l.slot_rows > 0
      WHERE o.state = 'processing'
      GROUP BY 1, 2;
    ELSIF TG_OP = 'TRUNCATE' THEN
      -- No job is left: nothing holds a slot, and a draining limit's debt is
      -- gone with its jobs.
      DELETE FROM idemq.limit_releases;
      UPDATE idemq.limit_slots AS s SET held = 0 WHERE s.held <> 0;
      PERFORM idemq._size_slots(l.id, l.concurrency) FROM idemq.limits l WHERE l.concurrency IS NOT NULL;
    END IF;
  END IF;
  -- Concurrency keys: a job of a key that leaves the admitted states
  -- (finishes, or is deleted) makes room for the key's next waiting job,
  -- in this same transaction (_key_promote, after the key's lock). A
  -- statement without a keyed admitted job pays one scan of old_jobs.
  IF TG_OP = 'UPDATE' THEN
    IF EXISTS (SELECT FROM old_jobs o
               WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing')) THEN
      -- The keys with fewer admitted jobs after the statement than before
      -- (grouped per side, not joined: the planner trap above).
      SELECT array_agg(d.concurrency_key) INTO v_keys
      FROM (SELECT k.concurrency_key
            FROM (SELECT o.concurrency_key, count(*) AS n FROM old_jobs o
                  WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing')
                  GROUP BY o.concurrency_key
                  UNION ALL
                  SELECT w.concurrency_key, -count(*) FROM new_jobs w
                  WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled', 'processing')
                  GROUP BY w.concurrency_key) k
            GROUP BY k.concurrency_key
            HAVING sum(k.n) > 0) d;
    END IF;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(DISTINCT o.concurrency_key) INTO v_keys
    FROM old_jobs o
    WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing');
  END IF;
  IF v_keys IS NOT NULL THEN
    PERFORM idemq._key_promote(v_keys);
  END IF;
  -- Grouped, so a statement of many jobs (enqueue_many, a claim of 100,
  -- complete_many, apply_retention) appends a row per group, not per job.
  IF TG_OP = 'UPDATE' THEN
    INSERT INTO idemq.job_counts (queue, task, state, n)
    SELECT d.queue, d.task, d.state, sum(d.n)
    FROM (SELECT o.queue, o.task, o.state, -1 AS n FROM old_jobs o
          UNION ALL
          SELECT w.queue, w.task, w.state, 1 FROM new_jobs w) d
    GROUP BY d.queue, d.task, d.state
    HAVING sum(d.n) <> 0;
  ELSIF TG_OP = 'INSERT' THEN
    INSERT INTO idemq.job_counts (queue, task, state, n)
    SELECT w.queue, w.task, w.state, count(*)
    FROM new_jobs w
    GROUP BY w.queue, w.task, w.state;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO idemq.job_counts (queue, task, state, n)
    SELECT o.queue, o.task, o.state, -count(*)
    FROM old_jobs o
    GROUP BY o.queue, o.task, o.state;
  ELSE
    -- TRUNCATE: no job is left in any state.
    DELETE FROM idemq.job_counts;
  END IF;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._count_jobs() IS
  'Trigger on idemq.jobs (per statement): appends the change of each (queue, task, state) count to idemq.job_counts.';
