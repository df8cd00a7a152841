-- Migration 0017_worker_presence (issue 14 item 4): workers say they are there (idemq.workers, worker_seen, worker_stopped; workers() and unserved_jobs() for the admin), so `idemq doctor` finds runnable jobs no live worker claims; stale rows go with apply_retention(); stats() is granted to idemq_worker (counts only), whose --metrics-port read it.
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

-- Two limits: how many names one worker_seen() may list (queues and tasks
-- together), and how long the row of a worker not seen is kept before
-- apply_retention() deletes it (a crashed worker never says it stopped).
INSERT INTO idemq.settings (name, value, min_value, max_value, description) VALUES
  ('worker_names', 10000, 1, 100000,
   'most queue and task names one worker_seen() call may list, together'),
  ('worker_retention_seconds', 86400, 60, 3153600000,
   'how long the row of a worker not seen is kept in idemq.workers, in seconds (default a day)');

-- One row per worker that said it is there (worker_seen, on the worker's
-- presence timer); NULL queues: every queue, NULL tasks: any task, as in
-- claim(). Written only through worker_seen() and worker_stopped(); small
-- (one row per running worker, plus crashed ones for a day), so no index
-- but the key.
CREATE TABLE idemq.workers (
  worker_id     text PRIMARY KEY,
  queues        text[],
  tasks         text[],
  started_at    timestamptz NOT NULL DEFAULT now(),
  last_seen_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT workers_id_not_empty CHECK (worker_id <> ''),
  CONSTRAINT workers_queues_not_empty CHECK (cardinality(queues) > 0),
  CONSTRAINT workers_tasks_not_empty CHECK (cardinality(tasks) > 0)
);

-- ---- sql/functions/_grant_roles.sql ----
-- idemq._grant_roles() RETURNS TABLE(role text, privilege text)
--
-- Gives the idemq group roles that exist what their names say and nothing
-- more, and PUBLIC nothing; returns each privilege it granted. The one
-- definition of who may call what (docs/design.md, "Roles").
--
-- Guarantees:
--   * PUBLIC has EXECUTE on no function of idemq, public or private.
--   * idemq_producer: enqueue, enqueue_many. idemq_worker: claim, complete,
--     complete_many, fail, heartbeat, snooze, guard, effect_claim,
--     effect_done, effect_release, rescue, wait_for_jobs, stop_waiting,
--     prune_keys, tick (the workers' maintenance timer runs the schedules),
--     apply_retention (and deletes finished jobs past their retention),
--     worker_seen and worker_stopped (its presence), stats (counts only, no
--     payload: a worker's --metrics-port serves them).
--     idemq_admin: every public function (set_retention among them),
--     SELECT on the tables of idemq (reading jobs), and UPDATE of idemq.settings.value
--     (the limits). All three: USAGE on schema idemq and the
--     constants active_states() and terminal_states().
--   * No other table privilege: the public functions are SECURITY DEFINER
--     (owned by the schema owner, search_path pinned), so a role needs only
--     EXECUTE; a worker reads payloads only through claim().
--   * A role that does not exist is skipped (`idemq roles sql` prints the
--     script a DBA runs to create the roles and call this again); running it
--     again grants the same and changes nothing.
-- Concurrency: GRANT updates the functions' catalog rows; migrations run it
--   under node-pg-migrate's lock, one per database.
-- Errors: 42501 when the caller neither owns the functions nor is a superuser.
-- Tests: test/sql/roles.test.ts, test/install/non-superuser.test.ts
CREATE OR REPLACE FUNCTION idemq._grant_roles()
RETURNS TABLE(role text, privilege text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_fn regprocedure;
  v_name text;
  v_role text;
  v_constants text[] := ARRAY['active_states', 'terminal_states'];
  v_producer text[] := ARRAY['enqueue', 'enqueue_many'];
  v_worker text[] := ARRAY['claim', 'complete', 'complete_many', 'fail', 'heartbeat', 'snooze',
                           'guard', 'effect_claim', 'effect_done', 'effect_release', 'rescue',
                           'wait_for_jobs', 'stop_waiting', 'prune_keys', 'tick', 'apply_retention',
                           'worker_seen', 'worker_stopped', 'stats'];
BEGIN
  FOR v_fn IN
    SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
  END LOOP;
  FOREACH v_role IN ARRAY ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'] LOOP
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    EXECUTE format('GRANT USAGE ON SCHEMA idemq TO %I', v_role);
    role := v_role;
    privilege := 'USAGE ON SCHEMA idemq';
    RETURN NEXT;
    FOR v_fn, v_name IN
      SELECT p.oid::regprocedure, p.proname FROM pg_proc p
      WHERE p.pronamespace = 'idemq'::regnamespace AND left(p.proname, 1) <> '_'
      ORDER BY p.proname
    LOOP
      CONTINUE WHEN NOT (v_name = ANY (v_constants)
                         OR (v_role = 'idemq_producer' AND v_name = ANY (v_producer))
                         OR (v_role = 'idemq_worker' AND v_name = ANY (v_worker))
                         OR v_role = 'idemq_admin');
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
      privilege := format('EXECUTE ON FUNCTION %s', v_fn);
      RETURN NEXT;
    END LOOP;
    IF v_role = 'idemq_admin' THEN
      EXECUTE 'GRANT SELECT ON ALL TABLES IN SCHEMA idemq TO idemq_admin';
      privilege := 'SELECT ON ALL TABLES IN SCHEMA idemq';
      RETURN NEXT;
      -- The limits are the admin's to change (their ranges are CHECKed).
      IF to_regclass('idemq.settings') IS NOT NULL THEN
        EXECUTE 'GRANT UPDATE (value) ON idemq.settings TO idemq_admin';
        privilege := 'UPDATE (value) ON idemq.settings';
        RETURN NEXT;
      END IF;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._grant_roles() IS
  'Grant idemq_producer, idemq_worker and idemq_admin (those that exist) what their names say, PUBLIC nothing; returns what it granted.';

-- ---- sql/functions/_runnable_jobs.sql ----
-- idemq._runnable_jobs() RETURNS TABLE(queue text, task text, jobs bigint, oldest_seconds bigint)
--
-- The jobs claim() would hand out now, counted per queue and task, with the
-- age of the oldest: the one definition of "runnable" that stats() and
-- unserved_jobs() report.
--
-- Guarantees:
--   * Runnable: state enqueued or scheduled, run_at <= now(), not past
--     expires_at (claim()'s own predicate, which its partial index needs
--     spelt out there).
--   * oldest_seconds is whole epoch seconds since the oldest run_at, capped
--     at the largest bigint: now() - min(run_at) fails (22008) for a run_at
--     of -infinity or one far in the past, and one bad row must not take
--     every count away.
-- Concurrency: plain reads; no locks beyond the snapshot. PARALLEL SAFE: as
--   a parallel-unsafe function it kept stats() from its parallel scan (on
--   100,000 runnable of 150,000 jobs, stats() took 1.26x as long as with
--   the same query inline; PARALLEL SAFE, 0.93-1.05x, in the same runs;
--   PostgreSQL 15, a loaded 2-core machine).
-- Errors: none.
-- Tests: test/sql/stats.test.ts, test/sql/workers.test.ts
CREATE OR REPLACE FUNCTION idemq._runnable_jobs()
RETURNS TABLE(queue text, task text, jobs bigint, oldest_seconds bigint)
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
  SELECT j.queue, j.task, count(*),
         least(floor(extract(epoch FROM now()) - extract(epoch FROM min(j.run_at))),
               9223372036854775807)::bigint
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
    AND (j.expires_at IS NULL OR j.expires_at > now())
  GROUP BY j.queue, j.task;
END;

COMMENT ON FUNCTION idemq._runnable_jobs() IS
  'Runnable jobs (what claim() would hand out now) per queue and task: count and age of the oldest, in seconds.';

-- ---- sql/functions/apply_retention.sql ----
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
--     that crashed never said it stopped); they are not in the count.
-- Concurrency: FOR UPDATE SKIP LOCKED: rows a concurrent transaction holds
--   (a retry, a purge, another worker's apply_retention, a worker_seen) are left for the
--   next call; concurrent callers never wait for each other.
-- Errors: 22004 NULL batch_size; 22023 batch_size outside 1..10000.
-- Tests: test/sql/retention-policy.test.ts, test/worker/retention.test.ts
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
    LIMIT batch_size
    FOR UPDATE SKIP LOCKED);

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
  RETURN batch_size - v_left;
END;
$$;

COMMENT ON FUNCTION idemq.apply_retention(int) IS
  'Delete at most batch_size finished jobs past their retention (task, queue override or state default); keys stay.';

-- ---- sql/functions/stats.sql ----
-- idemq.stats() RETURNS TABLE(queue text, task text, metric text, value bigint)
--
-- Counts for dashboards and scripts, one row per (queue, task, metric):
--   metric = a job state: jobs in that state (only non-zero rows);
--   metric = 'lease_expired': processing jobs whose lease ran out, not yet rescued;
--   metric = 'oldest_runnable_seconds': age of the oldest runnable job (run_at passed,
--     not past expires_at: what claim() would hand out; idemq._runnable_jobs());
--   metric = 'deduplicated' | 'rejected' | 'conflict' | 'guard_duplicate'
--     (queue NULL): events counted per task since install. A rejection raised
--     by enqueue() rolls back with the caller's statement and is not counted
--     here; clients count those as events.
--
-- Guarantees: a consistent snapshot of the jobs table (one statement). No
--   stored value makes it fail: a run_at of -infinity (stored before the
--   functions refused it) counts as the largest age a bigint holds.
--   It reveals counts, names of queues and tasks, never a payload: the
--   worker role may call it too (its metrics).
-- Concurrency: plain reads; no locks beyond the snapshot.
-- Errors: none.
-- Tests: test/sql/stats.test.ts, test/contract/examples.test.ts
CREATE OR REPLACE FUNCTION idemq.stats()
RETURNS TABLE(queue text, task text, metric text, value bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT j.queue, j.task, j.state::text, count(*)
  FROM idemq.jobs j
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT j.queue, j.task, 'lease_expired', count(*)
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT r.queue, r.task, 'oldest_runnable_seconds', r.oldest_seconds
  FROM idemq._runnable_jobs() r
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint
  FROM idemq.counters c
  GROUP BY c.task, c.event
  ORDER BY 1, 2, 3;
END;
$$;

COMMENT ON FUNCTION idemq.stats() IS
  'Counts per queue, task and state, expired leases, oldest runnable age, and duplicate/rejection events per task.';

-- ---- sql/functions/unserved_jobs.sql ----
-- idemq.unserved_jobs(seen_within interval) RETURNS TABLE(queue text, task text,
--   jobs bigint, oldest_runnable_seconds bigint, last_seen_at timestamptz)
--
-- Runnable jobs that no live worker claims, per queue and task: no worker
-- seen (worker_seen) within seen_within has their queue and their task.
--
-- Guarantees:
--   * Runnable as stats() counts it (idemq._runnable_jobs: what claim() would
--     hand out now); jobs and oldest_runnable_seconds are that group's.
--   * A worker covers a job when its queues are NULL or hold the job's
--     queue, and its tasks are NULL or hold the job's task (as claim()
--     filters), and its last_seen_at is within seen_within of now().
--   * last_seen_at: when the most recently seen worker that would cover the
--     group was seen (older than seen_within: stale), NULL when none ever
--     registered with it.
--   * Consumers that never call worker_seen() (a plain SQL client calling
--     claim()) are not seen: their groups are reported too.
-- Concurrency: plain reads.
-- Errors: 22004 NULL seen_within; 22023 seen_within not positive or over
--   duration_days.
-- Tests: test/sql/workers.test.ts, test/cli/doctor.test.ts
CREATE OR REPLACE FUNCTION idemq.unserved_jobs(seen_within interval)
RETURNS TABLE(queue text, task text, jobs bigint, oldest_runnable_seconds bigint, last_seen_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_since timestamptz;
BEGIN
  IF seen_within IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'unserved_jobs: seen_within must not be NULL',
      HINT = 'Pass how recently a worker must have been seen to count, e.g. ''2 minutes''.';
  END IF;
  IF seen_within <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('unserved_jobs: seen_within must be positive, not %s', seen_within),
      HINT = 'Workers refresh their row every 15 seconds by default: pass a few times that, e.g. ''2 minutes''.';
  END IF;
  PERFORM idemq._check_duration('unserved_jobs', 'seen_within', seen_within);
  v_since := now() - seen_within;

  RETURN QUERY
  SELECT r.queue, r.task, r.jobs, r.oldest_seconds, c.last_seen_at
  FROM idemq._runnable_jobs() r
  LEFT JOIN LATERAL (
    SELECT max(w.last_seen_at) AS last_seen_at
    FROM idemq.workers w
    WHERE (w.queues IS NULL OR r.queue = ANY (w.queues))
      AND (w.tasks IS NULL OR r.task = ANY (w.tasks))) c ON true
  WHERE c.last_seen_at IS NULL OR c.last_seen_at < v_since
  ORDER BY r.oldest_seconds DESC, r.queue, r.task;
END;
$$;

COMMENT ON FUNCTION idemq.unserved_jobs(interval) IS
  'Runnable jobs per queue and task that no worker seen within seen_within claims (count, oldest age, last seen).';

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

-- ---- sql/functions/worker_stopped.sql ----
-- idemq.worker_stopped(worker_id text) RETURNS boolean
--
-- Removes a worker's row from idemq.workers when it stops cleanly; returns
-- whether there was one.
--
-- Guarantees: deletes only the row of worker_id; a worker that crashed
--   never calls it, and its row goes stale instead (unserved_jobs() no
--   longer counts it once it is older than the caller's threshold;
--   apply_retention() deletes it after worker_retention_seconds).
-- Concurrency: a delete of one row; a concurrent worker_seen() of the same
--   id waits for it and then registers the worker again.
-- Errors: 22004 NULL worker_id.
-- Tests: test/sql/workers.test.ts, test/worker/presence.test.ts
CREATE OR REPLACE FUNCTION idemq.worker_stopped(worker_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF worker_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'worker_stopped: worker_id must not be NULL',
      HINT = 'Pass the worker id the worker registered with worker_seen().';
  END IF;
  DELETE FROM idemq.workers w WHERE w.worker_id = worker_stopped.worker_id;
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.worker_stopped(text) IS
  'Remove a cleanly stopped worker''s presence row (idemq.workers); true when it had one.';

-- ---- sql/functions/workers.sql ----
-- idemq.workers() RETURNS TABLE(worker_id text, queues text[], tasks text[],
--   started_at timestamptz, last_seen_at timestamptz)
--
-- Lists the workers that said they are there (worker_seen), most recently
-- seen first.
--
-- Guarantees: every row of idemq.workers, stale ones included (a worker
--   that crashed stays until apply_retention() deletes it after
--   worker_retention_seconds); queues NULL means every queue, tasks NULL
--   any task. A worker refreshes its row on a timer (presenceInterval,
--   15 seconds by default), so a last_seen_at minutes old means it is gone
--   or cut off.
-- Concurrency: a plain read.
-- Errors: none.
-- Tests: test/sql/workers.test.ts
CREATE OR REPLACE FUNCTION idemq.workers()
RETURNS TABLE(worker_id text, queues text[], tasks text[], started_at timestamptz, last_seen_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT w.worker_id, w.queues, w.tasks, w.started_at, w.last_seen_at
  FROM idemq.workers w
  ORDER BY w.last_seen_at DESC, w.worker_id;
END;
$$;

COMMENT ON FUNCTION idemq.workers() IS
  'The workers registered with worker_seen(): queues, tasks, started_at, last_seen_at (stale rows included).';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._runnable_jobs FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- sql/functions/_grant_roles.sql as of 0012_retention
-- idemq._grant_roles() RETURNS TABLE(role text, privilege text)
--
-- Gives the idemq group roles that exist what their names say and nothing
-- more, and PUBLIC nothing; returns each privilege it granted. The one
-- definition of who may call what (docs/design.md, "Roles").
--
-- Guarantees:
--   * PUBLIC has EXECUTE on no function of idemq, public or private.
--   * idemq_producer: enqueue, enqueue_many. idemq_worker: claim, complete,
--     complete_many, fail, heartbeat, snooze, guard, effect_claim,
--     effect_done, effect_release, rescue, wait_for_jobs, stop_waiting,
--     prune_keys, tick (the workers' maintenance timer runs the schedules),
--     apply_retention (and deletes finished jobs past their retention).
--     idemq_admin: every public function (set_retention among them),
--     SELECT on the tables of idemq (reading jobs), and UPDATE of idemq.settings.value
--     (the limits). All three: USAGE on schema idemq and the
--     constants active_states() and terminal_states().
--   * No other table privilege: the public functions are SECURITY DEFINER
--     (owned by the schema owner, search_path pinned), so a role needs only
--     EXECUTE; a worker reads payloads only through claim().
--   * A role that does not exist is skipped (`idemq roles sql` prints the
--     script a DBA runs to create the roles and call this again); running it
--     again grants the same and changes nothing.
-- Concurrency: GRANT updates the functions' catalog rows; migrations run it
--   under node-pg-migrate's lock, one per database.
-- Errors: 42501 when the caller neither owns the functions nor is a superuser.
-- Tests: test/sql/roles.test.ts, test/install/non-superuser.test.ts
CREATE OR REPLACE FUNCTION idemq._grant_roles()
RETURNS TABLE(role text, privilege text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_fn regprocedure;
  v_name text;
  v_role text;
  v_constants text[] := ARRAY['active_states', 'terminal_states'];
  v_producer text[] := ARRAY['enqueue', 'enqueue_many'];
  v_worker text[] := ARRAY['claim', 'complete', 'complete_many', 'fail', 'heartbeat', 'snooze',
                           'guard', 'effect_claim', 'effect_done', 'effect_release', 'rescue',
                           'wait_for_jobs', 'stop_waiting', 'prune_keys', 'tick', 'apply_retention'];
BEGIN
  FOR v_fn IN
    SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
  END LOOP;
  FOREACH v_role IN ARRAY ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'] LOOP
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    EXECUTE format('GRANT USAGE ON SCHEMA idemq TO %I', v_role);
    role := v_role;
    privilege := 'USAGE ON SCHEMA idemq';
    RETURN NEXT;
    FOR v_fn, v_name IN
      SELECT p.oid::regprocedure, p.proname FROM pg_proc p
      WHERE p.pronamespace = 'idemq'::regnamespace AND left(p.proname, 1) <> '_'
      ORDER BY p.proname
    LOOP
      CONTINUE WHEN NOT (v_name = ANY (v_constants)
                         OR (v_role = 'idemq_producer' AND v_name = ANY (v_producer))
                         OR (v_role = 'idemq_worker' AND v_name = ANY (v_worker))
                         OR v_role = 'idemq_admin');
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
      privilege := format('EXECUTE ON FUNCTION %s', v_fn);
      RETURN NEXT;
    END LOOP;
    IF v_role = 'idemq_admin' THEN
      EXECUTE 'GRANT SELECT ON ALL TABLES IN SCHEMA idemq TO idemq_admin';
      privilege := 'SELECT ON ALL TABLES IN SCHEMA idemq';
      RETURN NEXT;
      -- The limits are the admin's to change (their ranges are CHECKed).
      IF to_regclass('idemq.settings') IS NOT NULL THEN
        EXECUTE 'GRANT UPDATE (value) ON idemq.settings TO idemq_admin';
        privilege := 'UPDATE (value) ON idemq.settings';
        RETURN NEXT;
      END IF;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._grant_roles() IS
  'Grant idemq_producer, idemq_worker and idemq_admin (those that exist) what their names say, PUBLIC nothing; returns what it granted.';

-- sql/functions/apply_retention.sql as of 0012_retention
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
-- Concurrency: FOR UPDATE SKIP LOCKED: rows a concurrent transaction holds
--   (a retry, a purge, another worker's apply_retention) are left for the
--   next call; concurrent callers never wait for each other.
-- Errors: 22004 NULL batch_size; 22023 batch_size outside 1..10000.
-- Tests: test/sql/retention-policy.test.ts, test/worker/retention.test.ts
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
  RETURN batch_size - v_left;
END;
$$;

COMMENT ON FUNCTION idemq.apply_retention(int) IS
  'Delete at most batch_size finished jobs past their retention (task, queue override or state default); keys stay.';

-- sql/functions/stats.sql as of 0007_limits
-- idemq.stats() RETURNS TABLE(queue text, task text, metric text, value bigint)
--
-- Counts for dashboards and scripts, one row per (queue, task, metric):
--   metric = a job state: jobs in that state (only non-zero rows);
--   metric = 'lease_expired': processing jobs whose lease ran out, not yet rescued;
--   metric = 'oldest_runnable_seconds': age of the oldest runnable job (run_at passed,
--     not past expires_at: what claim() would hand out);
--   metric = 'deduplicated' | 'rejected' | 'conflict' | 'guard_duplicate'
--     (queue NULL): events counted per task since install. A rejection raised
--     by enqueue() rolls back with the caller's statement and is not counted
--     here; clients count those as events.
--
-- Guarantees: a consistent snapshot of the jobs table (one statement). No
--   stored value makes it fail: a run_at of -infinity (stored before the
--   functions refused it) counts as the largest age a bigint holds.
-- Concurrency: plain reads; no locks beyond the snapshot.
-- Errors: none.
-- Tests: test/sql/stats.test.ts, test/contract/examples.test.ts
CREATE OR REPLACE FUNCTION idemq.stats()
RETURNS TABLE(queue text, task text, metric text, value bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT j.queue, j.task, j.state::text, count(*)
  FROM idemq.jobs j
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT j.queue, j.task, 'lease_expired', count(*)
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  -- Epoch seconds as numeric, capped: now() - min(run_at) fails (22008) for a
  -- run_at of -infinity or one far in the past, and one bad row must not
  -- take every count away.
  SELECT j.queue, j.task, 'oldest_runnable_seconds',
         least(floor(extract(epoch FROM now()) - extract(epoch FROM min(j.run_at))),
               9223372036854775807)::bigint
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
    AND (j.expires_at IS NULL OR j.expires_at > now())
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint
  FROM idemq.counters c
  GROUP BY c.task, c.event
  ORDER BY 1, 2, 3;
END;
$$;

COMMENT ON FUNCTION idemq.stats() IS
  'Counts per queue, task and state, expired leases, oldest runnable age, and duplicate/rejection events per task.';

DROP FUNCTION idemq.workers;
DROP FUNCTION idemq.worker_stopped;
DROP FUNCTION idemq.worker_seen;
DROP FUNCTION idemq.unserved_jobs;
DROP FUNCTION idemq._runnable_jobs;

-- Hand-written reversal of the schema changes above goes here, after the functions.

-- The restored _grant_roles() grants, never revokes: take back what this migration gave the worker role.
DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_roles r WHERE r.rolname = 'idemq_worker') THEN
    REVOKE EXECUTE ON FUNCTION idemq.stats() FROM idemq_worker;
  END IF;
END;
$$;
DROP TABLE idemq.workers;
DELETE FROM idemq.settings WHERE name IN ('worker_names', 'worker_retention_seconds');
