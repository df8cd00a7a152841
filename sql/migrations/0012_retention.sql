-- Migration 0012_retention (issue 13 item 3): retention that runs itself: per-state defaults in idemq.settings, per-queue and per-task overrides (idemq.retention, set_retention), apply_retention() in short SKIP LOCKED batches over a new index, retention 0 deleting succeeded jobs in complete()/complete_many(), and purge() in batches.
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

-- The default retention of each terminal state, in seconds (0: deleted at
-- once; for succeeded, by the completion itself). Read by
-- _default_retention(); written by set_retention() or an admin's UPDATE.
INSERT INTO idemq.settings (name, value, min_value, max_value, description) VALUES
  ('retention_succeeded_seconds', 604800, 0, 3153600000,
   'how long a succeeded job is kept, in seconds (default 7 days; 0: deleted by its completion)'),
  ('retention_failed_seconds', 2592000, 0, 3153600000,
   'how long a failed job is kept, in seconds (default 30 days)'),
  ('retention_cancelled_seconds', 2592000, 0, 3153600000,
   'how long a cancelled job is kept, in seconds (default 30 days)'),
  ('retention_expired_seconds', 2592000, 0, 3153600000,
   'how long an expired job is kept, in seconds (default 30 days)');

-- Overrides of the default retention for one queue or one task (set_retention).
-- A task's override wins over its queue's, which wins over the default. The
-- unique constraints are plain: a task override has queue NULL, and NULLs
-- never conflict, so each constraint only ever compares its own kind.
CREATE TABLE idemq.retention (
  queue       text,
  task        text,
  state       idemq.job_state NOT NULL,
  keep        interval NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT retention_queue_or_task CHECK ((queue IS NULL) <> (task IS NULL)),
  CONSTRAINT retention_queue_not_empty CHECK (queue <> ''),
  CONSTRAINT retention_task_not_empty CHECK (task <> ''),
  CONSTRAINT retention_state_terminal CHECK (state IN ('succeeded', 'failed', 'expired', 'cancelled')),
  CONSTRAINT retention_keep_not_negative CHECK (keep >= interval '0'),
  CONSTRAINT retention_queue_state UNIQUE (queue, state),
  CONSTRAINT retention_task_state UNIQUE (task, state)
);

-- apply_retention() and purge(): finished jobs by state, oldest first. Partial
-- (finished_at is set exactly on terminal rows), so active rows are not in it.
-- It costs every completion one index entry: complete_many of 1,000 jobs
-- wrote 499 B of WAL per job with it, 419 B without (3.1 records per job
-- instead of 2.1; EXPLAIN (ANALYZE, WAL), PostgreSQL 15); with retention 0
-- the completion deletes instead, 214 B per job. Built in this migration's
-- transaction: on a big table, writes to jobs wait for the build.
CREATE INDEX jobs_by_finish ON idemq.jobs (state, finished_at) WHERE finished_at IS NOT NULL;

-- ---- sql/functions/_check_delete_batch.sql ----
-- idemq._check_delete_batch(operation text, batch_size int) RETURNS void
--
-- Refuses a batch size of purge or apply_retention outside 1..10000: one
-- batch is one short transaction, and its row locks and WAL grow with it.
--
-- Guarantees: returns only for 1 <= batch_size <= 10000.
-- Concurrency: none.
-- Errors: 22004 NULL; 22023 out of range.
-- Tests: test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq._check_delete_batch(operation text, batch_size int)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN batch_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('%s: batch_size must be between 1 and 10000, not %s', operation, coalesce(batch_size::text, 'NULL')),
      HINT = 'Delete in batches of a few thousand at most and call again while a batch comes back full.';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_delete_batch(text, int) IS
  'Raise 22023 (22004 for NULL) when a delete batch size is outside 1..10000.';

-- ---- sql/functions/_delete_jobs.sql ----
-- idemq._delete_jobs(job_ids bigint[]) RETURNS int
--
-- Deletes finished jobs the caller has already locked (purge,
-- apply_retention), with the dependency rows that name them as a parent.
-- Returns how many jobs it deleted.
--
-- Guarantees:
--   * Deletes only terminal jobs, whatever ids it is given.
--   * Never touches idemq.keys: a deleted job's key still deduplicates or
--     rejects until prune_keys() releases it.
-- Concurrency: the callers lock the rows first (FOR UPDATE SKIP LOCKED), so
--   this waits for nothing.
-- Errors: none of its own.
-- Tests: test/sql/retention.test.ts, test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq._delete_jobs(job_ids bigint[])
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  WITH gone AS (
    DELETE FROM idemq.jobs AS j
    WHERE j.id = ANY (_delete_jobs.job_ids) AND j.finished_at IS NOT NULL
    RETURNING j.id
  ), deps AS (
    DELETE FROM idemq.job_dependencies AS dep USING gone g WHERE dep.parent_id = g.id
  )
  SELECT count(*) INTO v_count FROM gone;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq._delete_jobs(bigint[]) IS
  'Delete locked finished jobs and their dependency rows (never their keys); returns how many.';

-- ---- sql/functions/_gone_on_success.sql ----
-- idemq._gone_on_success(task text, queue text, default_zero boolean, zero_tasks text[],
--   kept_tasks text[], zero_queues text[], kept_queues text[]) RETURNS boolean
--
-- Whether a job of this task and queue has retention 0 once it succeeded,
-- given what _success_retention() read: an override of its task decides,
-- else one of its queue, else the default.
--
-- Guarantees: the precedence task > queue > default, the same as
--   apply_retention()'s rules; inlined into the completing statement, so it
--   costs array probes per row and no table read.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq._gone_on_success(task text, queue text, default_zero boolean, zero_tasks text[],
                                                  kept_tasks text[], zero_queues text[], kept_queues text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN task = ANY (zero_tasks) THEN true
            WHEN task = ANY (kept_tasks) THEN false
            WHEN queue = ANY (zero_queues) THEN true
            WHEN queue = ANY (kept_queues) THEN false
            ELSE default_zero END;

COMMENT ON FUNCTION idemq._gone_on_success(text, text, boolean, text[], text[], text[], text[]) IS
  'Retention 0 for a succeeded job of this task and queue? Task override, else queue override, else the default.';

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

-- ---- sql/functions/_retention_setting.sql ----
-- idemq._retention_setting(state idemq.job_state) RETURNS text
--
-- The name of the idemq.settings row holding the default retention of a
-- terminal state: retention_<state>_seconds.
--
-- Guarantees: the one spelling of those names (_default_retention reads the
--   row, set_retention writes it).
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq._retention_setting(state idemq.job_state)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'retention_' || state::text || '_seconds';

COMMENT ON FUNCTION idemq._retention_setting(idemq.job_state) IS
  'The settings row of a terminal state''s default retention: retention_<state>_seconds.';

-- ---- sql/functions/_default_retention.sql ----
-- idemq._default_retention(state idemq.job_state) RETURNS interval
--
-- How long a finished job of `state` is kept when no override of
-- idemq.retention names its task or queue: the setting
-- retention_<state>_seconds (idemq.settings, read by idemq._limit).
--
-- Guarantees: the one place the settings row of a state's retention is
--   named; a non-negative interval of whole seconds.
-- Concurrency: a plain read of idemq.settings.
-- Errors: 42704 (from _limit) for an active state: it has no retention.
-- Tests: test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq._default_retention(state idemq.job_state)
RETURNS interval
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN make_interval(secs => idemq._limit(idemq._retention_setting(_default_retention.state)));
END;
$$;

COMMENT ON FUNCTION idemq._default_retention(idemq.job_state) IS
  'The default retention of finished jobs in a state (settings row retention_<state>_seconds).';

-- ---- sql/functions/_success_retention.sql ----
-- idemq._success_retention() RETURNS TABLE(any_zero boolean, default_zero boolean,
--   zero_tasks text[], kept_tasks text[], zero_queues text[], kept_queues text[])
--
-- Which succeeded jobs have retention 0 (deleted by the completing
-- statement itself), read once per complete()/complete_many() call: the
-- default (setting retention_succeeded_seconds = 0) and the tasks and queues
-- whose override of succeeded is 0 (zero_*) or more (kept_*).
--
-- Guarantees: any_zero is false when no succeeded job can have retention 0:
--   the completion then takes its usual path, at the cost of this one read.
--   _gone_on_success() applies the precedence (task > queue > default) to a
--   row with these arrays, so a completion looks nothing up per job.
-- Concurrency: plain reads of idemq.settings and idemq.retention.
-- Errors: none of its own.
-- Tests: test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq._success_retention()
RETURNS TABLE(any_zero boolean, default_zero boolean, zero_tasks text[], kept_tasks text[],
              zero_queues text[], kept_queues text[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  -- One statement: this runs in every completion call. The settings row is
  -- read directly (its name from _retention_setting, as _default_retention
  -- reads it through _limit) to spare two nested function calls per call.
  SELECT s.value = 0,
         coalesce(array_agg(r.task) FILTER (WHERE r.task IS NOT NULL AND r.keep = interval '0'), '{}'),
         coalesce(array_agg(r.task) FILTER (WHERE r.task IS NOT NULL AND r.keep > interval '0'), '{}'),
         coalesce(array_agg(r.queue) FILTER (WHERE r.queue IS NOT NULL AND r.keep = interval '0'), '{}'),
         coalesce(array_agg(r.queue) FILTER (WHERE r.queue IS NOT NULL AND r.keep > interval '0'), '{}')
    INTO default_zero, zero_tasks, kept_tasks, zero_queues, kept_queues
  FROM idemq.settings s
  LEFT JOIN idemq.retention r ON r.state = 'succeeded'
  WHERE s.name = idemq._retention_setting('succeeded')
  GROUP BY s.value;
  default_zero := coalesce(default_zero, false);
  zero_tasks := coalesce(zero_tasks, '{}');
  kept_tasks := coalesce(kept_tasks, '{}');
  zero_queues := coalesce(zero_queues, '{}');
  kept_queues := coalesce(kept_queues, '{}');
  any_zero := default_zero OR cardinality(zero_tasks) > 0 OR cardinality(zero_queues) > 0;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq._success_retention() IS
  'Which succeeded jobs have retention 0 (default, tasks, queues), read once per completion call.';

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

-- ---- sql/functions/complete.sql ----
-- idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL) RETURNS void
--
-- Marks a job succeeded, fenced by (job_id, attempt).
--
-- Guarantees:
--   * locked_by keeps the worker whose attempt succeeded (for the job's timeline).
--   * Succeeds only while that attempt holds the job (state processing,
--     same attempt); otherwise raises IQ410 and changes nothing. Called in the
--     transaction that wrote the job's effect, a lost lease rolls the effect
--     back with it: a stale worker can never commit.
--   * Holding includes a lease that ran out but was not yet rescued.
--   * The job's idempotency key is marked finished (the policy now applies)
--     and jobs waiting on it (after) are released when all their parents succeeded.
--   * Retention 0 (the succeeded retention of the job's task, queue or the
--     default is 0, see apply_retention): the job row is deleted by the
--     completing statement itself (its result is not kept), and the key
--     ledger records the success, so the duplicate policy still applies to
--     its key. A job that has children is kept instead (its trigger releases
--     them) and apply_retention deletes it on its next pass.
--     Retention is read once per call (_success_retention).
-- Concurrency: row lock on the job; a concurrent rescue() or cancel() either
--   commits first (then this raises IQ410) or waits for this transaction.
-- Errors: IQ404 no such job; IQ410 lease lost (DETAIL {"job_id","attempt",
--   "current_state"}); 22004 NULL job_id/attempt.
-- Tests: test/sql/complete.test.ts, test/sql/fencing.test.ts, test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_r record;
  v_gone int;
BEGIN
  SELECT * INTO v_r FROM idemq._success_retention() z;
  IF v_r.any_zero THEN
    -- Retention 0: delete instead of update. _on_job_finished (AFTER UPDATE)
    -- does not fire for a DELETE, so the ledger write it makes for a
    -- succeeded key is made here; a job with children takes the UPDATE below.
    WITH gone AS (
      DELETE FROM idemq.jobs AS j
      WHERE j.id = complete.job_id AND j.attempt = complete.attempt AND idemq._held(j.lease_expires_at, j.locked_by)
        AND NOT j.has_children
        AND idemq._gone_on_success(j.task, j.queue, v_r.default_zero, v_r.zero_tasks, v_r.kept_tasks,
                                   v_r.zero_queues, v_r.kept_queues)
      RETURNING j.id, j.idempotency_key
    ), ledger AS (
      UPDATE idemq.keys AS k SET finished_state = 'succeeded', finished_at = now()
      FROM gone g WHERE k.key = g.idempotency_key AND k.job_id = g.id
    )
    SELECT count(*) INTO v_gone FROM gone;
    IF v_gone = 1 THEN
      RETURN;
    END IF;
  END IF;

  UPDATE idemq.jobs AS j
  SET state = 'succeeded', result = complete.result, finished_at = now(),
      lease_expires_at = NULL
  WHERE j.id = complete.job_id AND j.attempt = complete.attempt AND idemq._held(j.lease_expires_at, j.locked_by);
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(complete.job_id, complete.attempt, 'complete');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.complete(bigint, int, jsonb) IS
  'Mark a job succeeded if attempt still holds it; IQ410 (lease lost) otherwise, so the caller''s transaction rolls back.';

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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.purge;
-- ---- sql/functions/purge.sql ----
-- idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states(),
--   batch_size int DEFAULT NULL) RETURNS int
--
-- Deletes finished jobs that finished more than older_than ago, at most
-- batch_size of them (NULL: all). Returns how many.
--
-- Guarantees:
--   * Only terminal jobs are ever deleted (states must be terminal).
--   * Never releases an idempotency key: the ledger (idemq.keys) keeps it
--     until prune_keys() passes the key retention, so a purged job's key
--     still deduplicates or rejects.
--   * Dependency rows of purged parents are removed with them.
--   * With batch_size, the oldest first within each state: call it again while
--     it returns batch_size, each call a short transaction (the CLI does).
--     Independent of the retention settings (apply_retention).
-- Concurrency: SKIP LOCKED: rows a concurrent transaction holds are left for the next call.
-- Errors: 22004 NULL older_than or states; 22023 negative older_than or over
--   duration_days (idemq._limit), an active state in states, batch_size
--   outside 1..10000.
-- Tests: test/sql/retention.test.ts, test/cli/purge.test.ts
CREATE OR REPLACE FUNCTION idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states(),
                                       batch_size int DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_state idemq.job_state;
  v_left int := batch_size;
BEGIN
  IF older_than IS NULL OR states IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'purge: older_than and states must not be NULL',
      HINT = 'e.g. purge(older_than => ''7 days'') purges every terminal state.';
  END IF;
  IF older_than < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: older_than must not be negative, not %s', older_than),
      HINT = 'older_than is how long a finished job is kept, e.g. ''7 days''.';
  END IF;
  PERFORM idemq._check_duration('purge', 'older_than', older_than);
  IF NOT states <@ idemq.terminal_states() OR array_position(states, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: states must be terminal (%s), not %s', idemq.terminal_states(), idemq._excerpt(states::text)),
      HINT = 'Active jobs are never purged; cancel them first.';
  END IF;
  IF batch_size IS NOT NULL THEN
    PERFORM idemq._check_delete_batch('purge', batch_size);
  END IF;

  IF batch_size IS NULL THEN
    SELECT array_agg(x.id) INTO v_ids FROM (
      SELECT j.id FROM idemq.jobs j
      WHERE j.state = ANY (states) AND j.finished_at < now() - older_than
      FOR UPDATE OF j SKIP LOCKED) x;
    RETURN idemq._delete_jobs(coalesce(v_ids, '{}'));
  END IF;
  -- A batch: one state at a time, each a range scan of jobs_by_finish (state,
  -- finished_at) in index order (see apply_retention for why the ORDER BY).
  -- One query over all the states would sort every due row for each batch.
  FOREACH v_state IN ARRAY states LOOP
    EXIT WHEN v_left = 0;
    SELECT array_agg(x.id) INTO v_ids FROM (
      SELECT j.id FROM idemq.jobs j
      WHERE j.state = v_state AND j.finished_at < now() - older_than
      ORDER BY j.finished_at
      LIMIT v_left
      FOR UPDATE OF j SKIP LOCKED) x;
    v_left := v_left - idemq._delete_jobs(coalesce(v_ids, '{}'));
  END LOOP;
  RETURN batch_size - v_left;
END;
$$;

COMMENT ON FUNCTION idemq.purge(interval, idemq.job_state[], int) IS
  'Delete terminal jobs finished more than older_than ago (at most batch_size per call); keys stay until prune_keys.';

-- ---- sql/functions/set_retention.sql ----
-- idemq.set_retention(state idemq.job_state, keep interval, queue text DEFAULT NULL,
--   task text DEFAULT NULL) RETURNS void
--
-- Sets how long finished jobs in a terminal state are kept: the default for
-- every job (neither queue nor task), or an override for one queue or one
-- task. keep => NULL removes an override (the default applies again).
--
-- Guarantees:
--   * Precedence when apply_retention() and completions judge a job: an
--     override of its task, else of its queue, else the default.
--   * keep 0 for succeeded: complete() and complete_many() delete the row
--     as they complete it (the key ledger keeps the outcome).
--   * The default is the settings row retention_<state>_seconds, stored in
--     whole seconds (keep is rounded to the second); an override keeps keep
--     as given. Every argument is checked before anything is written.
-- Concurrency: an upsert of one row (idemq.retention or idemq.settings);
--   calls that start after the commit see it.
-- Errors: 22004 NULL state, NULL keep for a default; 22023 an active state,
--   negative keep or over duration_days (idemq._limit), both queue and
--   task, an empty queue or task name.
-- Tests: test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq.set_retention(state idemq.job_state, keep interval, queue text DEFAULT NULL,
                                               task text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF set_retention.state IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'set_retention: state must not be NULL',
      HINT = format('Name a terminal state: %s.', array_to_string(idemq.terminal_states(), ', '));
  END IF;
  IF NOT set_retention.state = ANY (idemq.terminal_states()) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('set_retention: state must be terminal (%s), not %s',
                       array_to_string(idemq.terminal_states(), ', '), set_retention.state),
      HINT = 'Only finished jobs have a retention; active jobs are never deleted.';
  END IF;
  IF set_retention.queue IS NOT NULL AND set_retention.task IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'set_retention: give a queue or a task, not both',
      HINT = 'An override names one queue or one task; a task''s override wins over its queue''s.';
  END IF;
  IF set_retention.queue = '' OR set_retention.task = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'set_retention: queue and task must not be empty',
      HINT = 'Leave both out (NULL) to set the default of the state.';
  END IF;
  IF set_retention.keep IS NULL AND set_retention.queue IS NULL AND set_retention.task IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('set_retention: keep must not be NULL for the default of %s', set_retention.state),
      HINT = 'Give the default a duration, e.g. ''7 days'' (0 deletes at once); NULL only removes an override.';
  END IF;
  IF set_retention.keep < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('set_retention: keep must not be negative, not %s', set_retention.keep),
      HINT = 'keep is how long a finished job stays, e.g. ''7 days''; 0 deletes it at once.';
  END IF;
  PERFORM idemq._check_duration('set_retention', 'keep', set_retention.keep);

  IF set_retention.queue IS NULL AND set_retention.task IS NULL THEN
    UPDATE idemq.settings AS s SET value = round(extract(epoch FROM set_retention.keep))::bigint
    WHERE s.name = idemq._retention_setting(set_retention.state);
  ELSIF set_retention.keep IS NULL THEN
    DELETE FROM idemq.retention AS r
    WHERE r.state = set_retention.state
      AND (r.queue = set_retention.queue OR r.task = set_retention.task);
  ELSIF set_retention.queue IS NOT NULL THEN
    INSERT INTO idemq.retention AS r (queue, state, keep)
    VALUES (set_retention.queue, set_retention.state, set_retention.keep)
    ON CONFLICT ON CONSTRAINT retention_queue_state DO UPDATE SET keep = EXCLUDED.keep, updated_at = now();
  ELSE
    INSERT INTO idemq.retention AS r (task, state, keep)
    VALUES (set_retention.task, set_retention.state, set_retention.keep)
    ON CONFLICT ON CONSTRAINT retention_task_state DO UPDATE SET keep = EXCLUDED.keep, updated_at = now();
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.set_retention(idemq.job_state, interval, text, text) IS
  'Set how long finished jobs of a state are kept: the default, or an override for a queue or a task (NULL keep removes it).';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._check_delete_batch FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._default_retention FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._delete_jobs FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._gone_on_success FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._retention_setting FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._success_retention FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- sql/functions/_grant_roles.sql as of 0010_schedules
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
--     prune_keys, tick (the workers' maintenance timer runs the schedules). idemq_admin: every public function, SELECT on the
--     tables of idemq (reading jobs), and UPDATE of idemq.settings.value
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
                           'wait_for_jobs', 'stop_waiting', 'prune_keys', 'tick'];
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

-- sql/functions/complete.sql as of 0005_least_privilege
-- idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL) RETURNS void
--
-- Marks a job succeeded, fenced by (job_id, attempt).
--
-- Guarantees:
--   * locked_by keeps the worker whose attempt succeeded (for the job's timeline).
--   * Succeeds only while that attempt holds the job (state processing,
--     same attempt); otherwise raises IQ410 and changes nothing. Called in the
--     transaction that wrote the job's effect, a lost lease rolls the effect
--     back with it: a stale worker can never commit.
--   * Holding includes a lease that ran out but was not yet rescued.
--   * The job's idempotency key is marked finished (the policy now applies)
--     and jobs waiting on it (after) are released when all their parents succeeded.
-- Concurrency: row lock on the job; a concurrent rescue() or cancel() either
--   commits first (then this raises IQ410) or waits for this transaction.
-- Errors: IQ404 no such job; IQ410 lease lost (DETAIL {"job_id","attempt",
--   "current_state"}); 22004 NULL job_id/attempt.
-- Tests: test/sql/complete.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  UPDATE idemq.jobs AS j
  SET state = 'succeeded', result = complete.result, finished_at = now(),
      lease_expires_at = NULL
  WHERE j.id = complete.job_id AND j.attempt = complete.attempt AND idemq._held(j.lease_expires_at, j.locked_by);
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(complete.job_id, complete.attempt, 'complete');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.complete(bigint, int, jsonb) IS
  'Mark a job succeeded if attempt still holds it; IQ410 (lease lost) otherwise, so the caller''s transaction rolls back.';

-- sql/functions/complete_many.sql as of 0005_least_privilege
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
--   * Keys and continuations as complete().
--   * An id given more than once counts once, with its highest attempt
--     (attempts only grow: only the latest can hold the job).
--   * Reads jobs by primary key only: the cost follows the batch, not the
--     rows the table keeps.
-- Concurrency: updates the rows in id order (no deadlock between two batches).
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths or more than 10,000 ids.
-- Tests: test/sql/complete.test.ts, test/sql/claim.test.ts (no sequential scan)
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.purge;
-- sql/functions/purge.sql as of 0007_limits
-- idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states())
--   RETURNS int
--
-- Deletes finished jobs that finished more than older_than ago. Returns how many.
--
-- Guarantees:
--   * Only terminal jobs are ever deleted (states must be terminal).
--   * Never releases an idempotency key: the ledger (idemq.keys) keeps it
--     until prune_keys() passes the key retention, so a purged job's key
--     still deduplicates or rejects.
--   * Dependency rows of purged parents are removed with them.
-- Concurrency: SKIP LOCKED: rows a concurrent transaction holds are left for the next call.
-- Errors: 22004 NULL argument; 22023 negative older_than or over duration_days
--   (idemq._limit), an active state in states.
-- Tests: test/sql/retention.test.ts
CREATE OR REPLACE FUNCTION idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states())
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  IF older_than IS NULL OR states IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'purge: older_than and states must not be NULL',
      HINT = 'e.g. purge(older_than => ''7 days'') purges every terminal state.';
  END IF;
  IF older_than < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: older_than must not be negative, not %s', older_than),
      HINT = 'older_than is how long a finished job is kept, e.g. ''7 days''.';
  END IF;
  PERFORM idemq._check_duration('purge', 'older_than', older_than);
  IF NOT states <@ idemq.terminal_states() OR array_position(states, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: states must be terminal (%s), not %s', idemq.terminal_states(), idemq._excerpt(states::text)),
      HINT = 'Active jobs are never purged; cancel them first.';
  END IF;

  WITH doomed AS MATERIALIZED (
    SELECT j.id FROM idemq.jobs j
    WHERE j.state = ANY (states) AND j.finished_at < now() - older_than
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM idemq.jobs AS j USING doomed d WHERE j.id = d.id RETURNING j.id
  ), deps AS (
    DELETE FROM idemq.job_dependencies AS dep USING gone g WHERE dep.parent_id = g.id
  )
  SELECT count(*) INTO v_count FROM gone;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq.purge(interval, idemq.job_state[]) IS
  'Delete terminal jobs finished more than older_than ago; keys stay until prune_keys.';

DROP FUNCTION idemq.set_retention;
DROP FUNCTION idemq.apply_retention;
DROP FUNCTION idemq._success_retention;
DROP FUNCTION idemq._default_retention;
DROP FUNCTION idemq._retention_setting;
DROP FUNCTION idemq._gone_on_success;
DROP FUNCTION idemq._delete_jobs;
DROP FUNCTION idemq._check_delete_batch;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Hand-written reversal of the schema changes above goes here, after the functions.

DROP INDEX idemq.jobs_by_finish;
DROP TABLE idemq.retention;
DELETE FROM idemq.settings
WHERE name IN ('retention_succeeded_seconds', 'retention_failed_seconds', 'retention_cancelled_seconds',
               'retention_expired_seconds');
