-- idemq._count_jobs() RETURNS trigger
--
-- Trigger (AFTER INSERT, AFTER UPDATE, AFTER DELETE ON idemq.jobs, FOR EACH
-- STATEMENT, with the statement's rows as the transition tables old_jobs and
-- new_jobs; and AFTER TRUNCATE): keeps idemq.job_counts, the number of jobs
-- per (queue, task, state) that stats() and overview() read instead of
-- counting the jobs table; gives back the flow-control slots of attempts
-- that leave processing (idemq.limit_releases); admits the next waiting jobs of
-- concurrency keys whose admitted jobs finished or were deleted
-- (_key_promote); and moves a keyed job it left runnable before its key's
-- hold ends (idemq.key_holds, hold(..., scope => 'key')) to that end.
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
--   * A job of a held key (key_holds.held_until after now()) that the
--     statement inserted or left enqueued or scheduled with an earlier
--     run_at is scheduled at held_until in the same transaction, whoever
--     wrote it; a job that came out of processing is judged under its key's
--     lock (_key_lock), which hold() holds while it writes, so a hold in
--     flight is seen (docs/design.md, "Concurrency keys").
-- Concurrency: takes the locks of the keys whose jobs the statement
--   released (_key_promote) or returned from processing, in one call in
--   hash order. The counts: appends rows and updates none, so concurrent
--   writers never wait for each other here (a counter row updated in place
--   would queue every transaction of one queue and task behind the one
--   holding it).
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
--   test/sql/concurrency-keys.test.ts, test/sql/concurrency-keys-concurrency.test.ts,
--   test/sql/hold-key.test.ts
CREATE OR REPLACE FUNCTION idemq._count_jobs()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_keys text[];
  v_runnable text[];
  v_retried text[];
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
  -- statement without a keyed job on either side pays one probe of each
  -- transition table and nothing more here. The keys of the keyed jobs the statement left
  -- runnable (v_runnable), and of those among them that came out of
  -- processing (v_retried: a retry, snooze, rescue or hold), are for the
  -- held keys below.
  IF TG_OP = 'UPDATE' THEN
    -- No keyed job on either side (most statements): none of the probes
    -- below can find anything, and each costs the executor's set-up of a
    -- query (one probe here instead of three: 6.2% of a one-job claim and
    -- its completion, bench/FINDINGS.md, "The keyed completion's cost").
    IF EXISTS (SELECT FROM new_jobs w WHERE w.concurrency_key IS NOT NULL)
       OR EXISTS (SELECT FROM old_jobs o WHERE o.concurrency_key IS NOT NULL) THEN
      -- Per key, from each side grouped, never joined (the planner trap of the
      -- slots above: a join of the transition tables nests loops), and only
      -- when it can find something: v_keys, the keys with fewer admitted jobs
      -- after the statement than before (only if a keyed job left the
      -- admitted states: a claim's or a promotion's cannot have); v_retried,
      -- the keys with a job processing before and one runnable after.
      IF EXISTS (SELECT FROM new_jobs w
                 WHERE w.concurrency_key IS NOT NULL AND w.state NOT IN ('enqueued', 'scheduled', 'processing'))
         AND EXISTS (SELECT FROM old_jobs o
                     WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing')) THEN
        SELECT array_agg(g.k) INTO v_keys
        FROM (SELECT d.k
              FROM (SELECT o.concurrency_key AS k, count(*) AS n FROM old_jobs o
                    WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing')
                    GROUP BY o.concurrency_key
                    UNION ALL
                    SELECT w.concurrency_key, -count(*) FROM new_jobs w
                    WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled', 'processing')
                    GROUP BY w.concurrency_key) d
              GROUP BY d.k
              HAVING sum(d.n) > 0) g;
      END IF;
      IF EXISTS (SELECT FROM old_jobs o WHERE o.concurrency_key IS NOT NULL AND o.state = 'processing')
         AND EXISTS (SELECT FROM new_jobs w WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled')) THEN
        SELECT array_agg(g.k) INTO v_retried
        FROM (SELECT d.k
              FROM (SELECT DISTINCT o.concurrency_key AS k, 1 AS side FROM old_jobs o
                    WHERE o.concurrency_key IS NOT NULL AND o.state = 'processing'
                    UNION ALL
                    SELECT DISTINCT w.concurrency_key, 2 FROM new_jobs w
                    WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled')) d
              GROUP BY d.k
              HAVING count(*) = 2) g;
      END IF;
      -- The keys of the keyed jobs left runnable, for the held keys below:
      -- all of them while some key is held; otherwise those back from
      -- processing, whose key's lock (below) may wait for a hold in flight,
      -- which this probe, before the lock, cannot see.
      IF EXISTS (SELECT FROM idemq.key_holds h WHERE h.held_until > now()) THEN
        SELECT array_agg(DISTINCT w.concurrency_key) INTO v_runnable
        FROM new_jobs w
        WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled');
      ELSE
        v_runnable := v_retried;
      END IF;
    END IF;
  ELSIF TG_OP = 'INSERT' THEN
    -- Only enqueue's fast path inserts a keyed job runnable, and it holds the
    -- key's lock (_key_admits); without a live key hold, one probe of the
    -- empty idemq.key_holds and no scan of new_jobs.
    IF EXISTS (SELECT FROM idemq.key_holds h WHERE h.held_until > now()) THEN
      SELECT array_agg(DISTINCT w.concurrency_key) INTO v_runnable
      FROM new_jobs w
      WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled');
    END IF;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(DISTINCT o.concurrency_key) INTO v_keys
    FROM old_jobs o
    WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing');
  END IF;
  -- A job back from processing may be one hold() did not move (it was
  -- processing then): the key's lock, before the probe below, orders this
  -- statement after a hold of its key in flight (hold() writes under it),
  -- or that hold after this one (its own statement then sees this job
  -- runnable and moves it). Every other way in holds the lock already
  -- (enqueue, _key_promote) or the job's row lock, which hold() takes too.
  IF v_retried IS NOT NULL THEN
    IF cardinality(v_retried) = 1 AND v_keys IS NULL THEN
      -- _key_lock's lock for one key, taken here directly (as _key_admits
      -- does: a call, an unnest and a sort less; 4 against 25-40 us).
      PERFORM pg_advisory_xact_lock(1801812339, hashtext(v_retried[1]));
    ELSE
      PERFORM idemq._key_lock(v_retried || v_keys);
    END IF;
  END IF;
  IF v_keys IS NOT NULL THEN
    PERFORM idemq._key_promote(v_keys);
  END IF;
  -- Held keys (hold(..., scope => 'key')): a keyed job this statement left
  -- runnable before its key's hold ends runs at the hold's end instead,
  -- whoever wrote it (an admission, a promotion, a retry, a snooze, a
  -- reschedule, direct SQL). Without a live hold of any key: one probe of
  -- the empty idemq.key_holds (3 us, as the idemq.limits guard above; the
  -- probe by these keys costs 8-20). The UPDATE fires this trigger again,
  -- which finds every job of it at its hold's end already.
  -- v_runnable alone first: a condition with a subquery runs through the
  -- executor, set-up included, even when its first operand is false.
  IF v_runnable IS NULL THEN
    NULL;
  ELSIF EXISTS (SELECT FROM idemq.key_holds h WHERE h.held_until > now())
     AND EXISTS (SELECT FROM idemq.key_holds h WHERE h.concurrency_key = ANY (v_runnable) AND h.held_until > now()) THEN
    UPDATE idemq.jobs AS j SET run_at = h.held_until, state = 'scheduled'
    FROM new_jobs w JOIN idemq.key_holds h ON h.concurrency_key = w.concurrency_key
    WHERE j.id = w.id AND j.state IN ('enqueued', 'scheduled') AND j.run_at < h.held_until
      AND h.held_until > now();
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
