-- Migration 0005_least_privilege: roles that can only do their job, no hijack.
-- The public functions become SECURITY DEFINER (owned by the schema owner) and
-- every function pins search_path, so the roles idemq_producer, idemq_worker
-- and idemq_admin need EXECUTE only, PUBLIC gets nothing, and no object planted
-- in public or pg_temp runs inside idemq (issue 11, items 2 and 3).
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

-- The group roles, cluster-wide, when this role may create them (CREATEROLE or
-- a superuser); otherwise `idemq roles sql` prints the script a DBA runs. Runs
-- in other databases of the cluster may create them at the same moment: an
-- existing role, or one a concurrent creator commits first, is kept as it is.
DO $$
DECLARE
  v_role text;
BEGIN
  IF NOT (SELECT r.rolsuper OR r.rolcreaterole FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
    RAISE NOTICE 'idemq roles not created: % may not create roles; run the script of `idemq roles sql` as a role that may', current_user;
    RETURN;
  END IF;
  FOREACH v_role IN ARRAY ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'] LOOP
    CONTINUE WHEN EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = v_role);
    BEGIN
      EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', v_role);
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL; -- a concurrent creator committed it first
    END;
  END LOOP;
END $$;

-- ---- sql/functions/_backoff_delay.sql ----
-- idemq._backoff_delay(backoff jsonb, failed_attempt int, draw float8 DEFAULT NULL) RETURNS interval
--
-- How long a job waits before its next attempt, after attempt `failed_attempt`
-- (1 for the first failure) failed: the one backoff model (fail() schedules
-- by it, retry_horizon() adds it up; the worker has no copy).
--
-- Guarantees (backoff already accepted by _backoff_problem()):
--   NULL or polynomial: (a-1)^4 + 15 + k*a seconds, k = floor(draw * 30)
--     in 0..29, 29 for draw = 1 (Hangfire/Sidekiq);
--   exponential: initial * factor^(a-1), capped at max, then scaled by
--     1 + jitter * (2 * draw - 1), a factor in [1 - jitter, 1 + jitter];
--   fixed: delays[a], the last delay repeating.
--   draw is a number in [0, 1] standing for the random part; NULL (the
--   default) draws random(); 1 gives the longest delay the kind can take.
--   Whatever the kind, the delay is at most 10^9 seconds (about 31.7 years),
--   so no attempt number (up to max_attempts = 2^31-1) and no accepted
--   specification overflows a float8, an interval or now() + the delay.
-- Concurrency: none (volatile only because of random()).
-- Errors: none for a valid backoff.
-- Tests: test/sql/backoff.test.ts, test/worker/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq._backoff_delay(backoff jsonb, failed_attempt int, draw float8 DEFAULT NULL)
RETURNS interval
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text := coalesce(backoff->>'kind', 'polynomial');
  v_draw numeric := coalesce(draw, random());
  v_ceiling constant numeric := 1e9;
  v_secs numeric;
  v_initial numeric;
  v_factor numeric;
  v_cap numeric;
  v_n int;
BEGIN
  -- Seconds are computed as numeric: float8 overflows at factor^(a-1) for a
  -- few hundred attempts and cannot even read a factor like 1e400.
  IF v_kind = 'polynomial' THEN
    v_secs := power((failed_attempt - 1)::numeric, 4) + 15 + least(floor(v_draw * 30), 29) * failed_attempt;
  ELSIF v_kind = 'exponential' THEN
    v_initial := extract(epoch FROM (backoff->>'initial')::interval);
    v_factor := coalesce((backoff->>'factor')::numeric, 2);
    v_cap := least(coalesce(extract(epoch FROM (backoff->>'max')::interval), v_ceiling), v_ceiling);
    -- Compare logarithms first so factor^(a-1) is only computed when it is
    -- below cap / initial (a large attempt would overflow even numeric).
    IF (failed_attempt - 1) * ln(v_factor) < ln(v_cap / v_initial) THEN
      v_secs := least(v_initial * power(v_factor, failed_attempt - 1), v_cap);
    ELSE
      v_secs := v_cap;
    END IF;
    IF coalesce((backoff->>'jitter')::numeric, 0) > 0 THEN
      v_secs := v_secs * (1 + (backoff->>'jitter')::numeric * (2 * v_draw - 1));
    END IF;
  ELSE
    -- Kept as an interval, so "1 mon" means a calendar month from now.
    v_n := jsonb_array_length(backoff->'delays');
    RETURN least((backoff->'delays'->>(least(failed_attempt, v_n) - 1))::interval,
                 make_interval(secs => v_ceiling::float8));
  END IF;
  RETURN make_interval(secs => least(v_secs, v_ceiling)::float8);
END;
$$;

COMMENT ON FUNCTION idemq._backoff_delay(jsonb, int, float8) IS
  'Delay before the next attempt after attempt failed_attempt failed, by the job''s backoff (NULL = polynomial).';

-- ---- sql/functions/_backoff_problem.sql ----
-- idemq._backoff_problem(backoff jsonb) RETURNS text
--
-- Says what is wrong with a backoff specification, or NULL when it is valid.
--
-- Guarantees: a backoff accepted here never makes _backoff_delay() fail.
--   Accepted: NULL (the default, polynomial); {"kind":"polynomial"};
--   {"kind":"exponential","initial":I,"factor":F,"max":M,"jitter":J} with I a
--   positive interval (required), F a number >= 1 (default 2), M a positive
--   interval (optional), J a number in [0, 1) (default 0);
--   {"kind":"fixed","delays":[D, ...]} with at least one non-negative interval.
--   Intervals are PostgreSQL interval text ("2 seconds", "5 min", "1h").
-- Concurrency: none.
-- Errors: none (the caller raises, naming the job).
-- Tests: test/sql/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq._backoff_problem(backoff jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_field text;
  v_interval interval;
  v_allowed text[];
BEGIN
  IF backoff IS NULL OR jsonb_typeof(backoff) = 'null' THEN
    RETURN NULL;
  END IF;
  IF jsonb_typeof(backoff) <> 'object' THEN
    RETURN format('backoff must be a JSON object like {"kind":"fixed","delays":["2 seconds"]}, not %s', backoff);
  END IF;
  v_kind := backoff->>'kind';
  v_allowed := CASE v_kind
    WHEN 'polynomial' THEN ARRAY['kind']
    WHEN 'exponential' THEN ARRAY['kind', 'initial', 'factor', 'max', 'jitter']
    WHEN 'fixed' THEN ARRAY['kind', 'delays']
  END;
  IF v_allowed IS NULL THEN
    -- ::text first: a bare 'missing' would be read as jsonb and fail to parse.
    RETURN format('backoff kind must be "polynomial", "exponential" or "fixed", not %s',
                  coalesce((backoff->'kind')::text, 'missing'));
  END IF;
  SELECT k INTO v_field FROM jsonb_object_keys(backoff) k WHERE k <> ALL (v_allowed) LIMIT 1;
  IF v_field IS NOT NULL THEN
    RETURN format('backoff kind "%s" has no field "%s" (fields: %s)', v_kind, v_field, array_to_string(v_allowed, ', '));
  END IF;

  BEGIN
    IF v_kind = 'exponential' THEN
      IF jsonb_typeof(backoff->'initial') IS DISTINCT FROM 'string' THEN
        RETURN 'exponential backoff needs "initial", an interval such as "2 seconds"';
      END IF;
      v_interval := (backoff->>'initial')::interval;
      IF v_interval <= interval '0' THEN
        RETURN format('exponential backoff "initial" must be positive, not %s', backoff->'initial');
      END IF;
      IF backoff ? 'factor' AND (jsonb_typeof(backoff->'factor') <> 'number' OR (backoff->>'factor')::numeric < 1) THEN
        RETURN format('exponential backoff "factor" must be a number >= 1, not %s', backoff->'factor');
      END IF;
      IF backoff ? 'jitter' AND (jsonb_typeof(backoff->'jitter') <> 'number'
          OR (backoff->>'jitter')::numeric < 0 OR (backoff->>'jitter')::numeric >= 1) THEN
        RETURN format('exponential backoff "jitter" must be a number in [0, 1), not %s', backoff->'jitter');
      END IF;
      IF backoff ? 'max' THEN
        IF jsonb_typeof(backoff->'max') <> 'string' OR (backoff->>'max')::interval <= interval '0' THEN
          RETURN format('exponential backoff "max" must be a positive interval, not %s', backoff->'max');
        END IF;
      END IF;
    ELSIF v_kind = 'fixed' THEN
      IF jsonb_typeof(backoff->'delays') IS DISTINCT FROM 'array' OR jsonb_array_length(backoff->'delays') = 0 THEN
        RETURN 'fixed backoff needs "delays", a non-empty array of intervals such as ["2 seconds", "5 seconds"]';
      END IF;
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(backoff->'delays') d
                 WHERE jsonb_typeof(d) <> 'string' OR (d #>> '{}')::interval < interval '0') THEN
        RETURN format('fixed backoff "delays" must be non-negative intervals, not %s', backoff->'delays');
      END IF;
    END IF;
  EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
                 OR invalid_text_representation OR numeric_value_out_of_range THEN
    RETURN format('backoff %s has a value that is not an interval (%s); write intervals like "2 seconds" or "5 min"',
                  backoff, SQLERRM);
  END;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._backoff_problem(jsonb) IS
  'What is wrong with a backoff specification, or NULL when it is valid.';

-- ---- sql/functions/_check_lease.sql ----
-- idemq._check_lease(lease interval, operation text) RETURNS void
--
-- Rejects a lease that is NULL, not positive, or longer than a day.
--
-- Guarantees: returns only for a usable lease.
-- Concurrency: none.
-- Errors: 22004 NULL; 22023 out of range.
-- Tests: test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._check_lease(lease interval, operation text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF lease IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: lease must not be NULL', operation),
      HINT = 'Leave it out for the default (30 seconds), or pass an interval like ''2 minutes''.';
  END IF;
  IF lease <= interval '0' OR lease > interval '1 day' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: lease must be between 0 and 1 day, not %s', operation, lease),
      HINT = 'A lease is how long a worker may hold a job between heartbeats; use seconds to minutes.';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_lease(interval, text) IS
  'Raise unless the lease is a positive interval of at most one day.';

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
--     prune_keys. idemq_admin: every public function, and SELECT on the
--     tables of idemq (reading jobs). All three: USAGE on schema idemq and the
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
                           'wait_for_jobs', 'stop_waiting', 'prune_keys'];
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
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._grant_roles() IS
  'Grant idemq_producer, idemq_worker and idemq_admin (those that exist) what their names say, PUBLIC nothing; returns what it granted.';

-- ---- sql/functions/_lock_job.sql ----
-- idemq._lock_job(job_id bigint, operation text) RETURNS idemq.jobs
--
-- Locks one job for an operator's operation (cancel, retry, reschedule) and
-- returns its row.
--
-- Guarantees: returns the committed row, locked until the caller's
--   transaction ends; raises rather than return nothing.
-- Concurrency: FOR NO KEY UPDATE: waits for a worker completing the job.
-- Errors: 22004 NULL job_id; IQ404 no such job.
-- Tests: test/sql/admin.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._lock_job(job_id bigint, operation text)
RETURNS idemq.jobs
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
BEGIN
  IF _lock_job.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_id must not be NULL', operation),
      HINT = 'Pass the id enqueue() returned.';
  END IF;
  SELECT j.* INTO v_job FROM idemq.jobs j WHERE j.id = _lock_job.job_id FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('%s: job %s does not exist', operation, _lock_job.job_id),
      HINT = 'Check the id (idemq jobs lists jobs); finished jobs may have been purged.';
  END IF;
  RETURN v_job;
END;
$$;

COMMENT ON FUNCTION idemq._lock_job(bigint, text) IS
  'Lock and return one job for an operator''s operation; IQ404 if it does not exist.';

-- ---- sql/functions/_notify_waiting.sql ----
-- idemq._notify_waiting(queue text) RETURNS void
--
-- Sends NOTIFY idemq_jobs (payload: the queue) for a job that became runnable
-- now, if a session may be waiting for it; otherwise sends nothing.
--
-- Why: PostgreSQL serialises the commits of transactions that NOTIFY (they
-- queue on one lock through their WAL flush): a NOTIFY in every enqueue halved
-- single-enqueue throughput on 10 connections. A worker with a backlog keeps
-- claiming without being told; only one that ran out of work needs the wake-up,
-- and it says so with wait_for_jobs().
--
-- Guarantees:
--   * Notifies when, at the call, a session holds the waiting marker of this
--     queue or of all queues, or is checking the barrier (wait_for_jobs).
--   * Otherwise holds the barrier (shared, until this transaction ends), so no
--     wait_for_jobs() returns true before this transaction has ended: its next
--     claim sees what this transaction committed. Nothing is lost, only the
--     NOTIFY nobody was waiting for.
-- Concurrency: advisory locks only, never waits: callers do not block each other
--   (the marker is tried exclusively and released at once; a collision of two
--   callers makes one of them notify, which is always safe).
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._notify_waiting(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_marker bigint;
BEGIN
  IF NOT pg_try_advisory_xact_lock_shared(idemq._wait_key('')) THEN
    PERFORM pg_notify('idemq_jobs', _notify_waiting.queue);
    RETURN;
  END IF;
  FOREACH v_marker IN ARRAY ARRAY[idemq._wait_key(_notify_waiting.queue), idemq._wait_key(NULL)] LOOP
    IF NOT pg_try_advisory_lock(v_marker) THEN
      PERFORM pg_notify('idemq_jobs', _notify_waiting.queue);
      RETURN;
    END IF;
    PERFORM pg_advisory_unlock(v_marker);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._notify_waiting(text) IS
  'NOTIFY idemq_jobs with the queue if a session waits for it (wait_for_jobs); else hold the barrier until commit.';

-- ---- sql/functions/_pairs_by_id.sql ----
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
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}')
  FROM (SELECT u.id, max(u.attempt) AS attempt
        FROM unnest(job_ids, attempts) AS u(id, attempt)
        WHERE u.id IS NOT NULL
        GROUP BY u.id) t
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[]) IS
  '(job_id, attempt) pairs sorted by id, each id once with its highest attempt, for width_bucket() lookups.';

-- ---- sql/functions/_parse_jobs.sql ----
-- idemq._parse_jobs(jobs jsonb, at timestamptz)
--   RETURNS TABLE(ord int, task text, payload jsonb, queue text, run_at timestamptz,
--                 priority int, max_attempts int, key text,
--                 duplicate_policy idemq.duplicate_policy, backoff jsonb,
--                 expires_at timestamptz, ok boolean)
--
-- The fast path of _enqueue_rows: parses a JSON array of jobs in one pass
-- (jsonb_to_recordset, in C), fills the defaults (_job_defaults, run_at `at`),
-- and marks each element `ok` when it passes a cheap check.
--
-- Guarantees: `ok` is false or NULL for every element the validating path of
--   _enqueue_rows would refuse (unknown fields, wrong types, empty task or
--   queue, queue over 1000 characters, max_attempts < 1, empty key, `after`),
--   so the fast path refuses at least what that path refuses. A value that
--   does not parse (a bad timestamp, a priority out of range) raises a
--   data_exception, which the fast path also hands to the validating path.
--   Backoffs are not checked here (_enqueue_rows checks each distinct one).
-- Concurrency: none (reads only its argument). Inlined into the caller's plan.
-- Errors: data_exception for a value that does not parse.
-- Tests: test/sql/enqueue-many.test.ts (both paths agree)
CREATE OR REPLACE FUNCTION idemq._parse_jobs(jobs jsonb, at timestamptz)
RETURNS TABLE(ord int, task text, payload jsonb, queue text, run_at timestamptz,
              priority int, max_attempts int, key text,
              duplicate_policy idemq.duplicate_policy, backoff jsonb,
              expires_at timestamptz, ok boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT r.ord::int, r.task,
         coalesce(r.payload, idemq._job_defaults()->'payload'),
         coalesce(r.queue, idemq._job_defaults()->>'queue'),
         coalesce(r.run_at, at),
         coalesce(r.priority, (idemq._job_defaults()->>'priority')::int),
         coalesce(r.max_attempts, (idemq._job_defaults()->>'max_attempts')::int),
         r.idempotency_key,
         coalesce(r.duplicate_policy, (idemq._job_defaults()->>'duplicate_policy')::idemq.duplicate_policy),
         r.backoff, r.expires_at,
         (r.v - ARRAY['task', 'payload', 'queue', 'run_at', 'priority', 'max_attempts',
                      'idempotency_key', 'duplicate_policy', 'backoff', 'expires_at', 'after']) = '{}'
           AND r.task <> '' AND jsonb_typeof(r.v->'task') = 'string'
           AND (r.payload IS NULL OR jsonb_typeof(r.payload) = 'object')
           AND (r.queue IS NULL OR (jsonb_typeof(r.v->'queue') = 'string'
                                    AND r.queue <> '' AND length(r.queue) <= idemq._queue_name_limit()))
           AND (r.run_at IS NULL OR jsonb_typeof(r.v->'run_at') = 'string')
           AND (r.expires_at IS NULL OR jsonb_typeof(r.v->'expires_at') = 'string')
           AND (r.priority IS NULL OR jsonb_typeof(r.v->'priority') = 'number')
           AND (r.max_attempts IS NULL OR (jsonb_typeof(r.v->'max_attempts') = 'number'
                                           AND r.max_attempts >= 1))
           AND (r.idempotency_key IS NULL OR (jsonb_typeof(r.v->'idempotency_key') = 'string'
                                              AND r.idempotency_key <> ''))
           AND r.after IS NULL
  FROM ROWS FROM (jsonb_array_elements(jobs),
                  jsonb_to_recordset(jobs) AS (task text, payload jsonb, queue text, run_at timestamptz,
                    priority int, max_attempts int, idempotency_key text,
                    duplicate_policy idemq.duplicate_policy, backoff jsonb, expires_at timestamptz,
                    after jsonb)) WITH ORDINALITY
       AS r(v, task, payload, queue, run_at, priority, max_attempts, idempotency_key,
            duplicate_policy, backoff, expires_at, after, ord)
$$;

COMMENT ON FUNCTION idemq._parse_jobs(jsonb, timestamptz) IS
  'Fast path of enqueue_many: parse a JSON array of jobs with defaults, each marked ok when it passes a cheap check.';

-- ---- sql/functions/_raise_not_held.sql ----
-- idemq._raise_not_held(job_id bigint, attempt int, operation text) RETURNS void
--
-- Raises the right error after `operation` found no job `job_id` held by
-- attempt `attempt`: IQ404 when the job does not exist, IQ410 (lease lost)
-- when it does. Called by complete, fail and snooze after their fenced UPDATE
-- matched nothing, so the happy path costs no extra read.
--
-- Guarantees: always raises.
-- Concurrency: reads the job without locking it; the state named in the
--   message is the committed state at that moment.
-- Errors: IQ404; IQ410 with DETAIL {"job_id","attempt","current_state"}. Neither
--   the message nor the DETAIL names the current attempt: with the job id it
--   is the fencing token of whichever attempt holds the job now.
-- Tests: test/sql/complete.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_not_held(job_id bigint, attempt int, operation text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job record;
BEGIN
  IF _raise_not_held.job_id IS NULL OR _raise_not_held.attempt IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_id and attempt must not be NULL', operation),
      HINT = 'Pass the id and attempt that claim() returned: together they are the fencing token.';
  END IF;
  SELECT j.state INTO v_job FROM idemq.jobs j WHERE j.id = _raise_not_held.job_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('%s: job %s does not exist', operation, _raise_not_held.job_id),
      HINT = 'Check the job id; finished jobs may have been purged.';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('%s: lease lost: attempt %s no longer holds job %s (it is %s)',
                     operation, _raise_not_held.attempt, _raise_not_held.job_id, v_job.state),
    DETAIL = jsonb_build_object('job_id', _raise_not_held.job_id, 'attempt', _raise_not_held.attempt,
                                'current_state', v_job.state)::text,
    HINT = 'Another attempt took the job over (lease expired and rescued, or cancelled): '
           'roll back this attempt''s work and stop.';
END;
$$;

COMMENT ON FUNCTION idemq._raise_not_held(bigint, int, text) IS
  'Raise IQ404 or IQ410 for a fenced call whose (job_id, attempt) matched no held job.';

-- ---- sql/functions/_wait_markers.sql ----
-- idemq._wait_markers(queues text[], operation text)
--   RETURNS TABLE(marker bigint, held boolean)
--
-- The waiting markers of `queues` (NULL: the all-queues marker), each once,
-- and whether this session holds it: what wait_for_jobs takes and
-- stop_waiting releases.
--
-- Guarantees: validates `queues` first; `operation` names the caller in errors.
-- Concurrency: reads this session's own locks in pg_locks.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_markers(queues text[], operation text)
RETURNS TABLE(marker bigint, held boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: queues must be NULL (all queues) or a non-empty list of queue names, not %s', operation, queues),
      HINT = 'Pass the queues you claim from, or NULL for every queue.';
  END IF;
  RETURN QUERY
  SELECT k.key, EXISTS (
           SELECT 1 FROM pg_locks l
           WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock'
             AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = k.key)
  FROM (SELECT DISTINCT idemq._wait_key(q) AS key FROM unnest(coalesce(queues, ARRAY[NULL::text])) q) k;
END;
$$;

COMMENT ON FUNCTION idemq._wait_markers(text[], text) IS
  'The waiting markers of these queues (wait_for_jobs), and whether this session holds each.';

-- ---- sql/functions/_enqueue_rows.sql ----
-- idemq._enqueue_rows(jobs jsonb, single boolean)
--   RETURNS TABLE(r_ordinal int, r_job_id bigint, r_outcome text,
--                 r_existing_state idemq.job_state, r_policy idemq.duplicate_policy, r_key text)
--
-- The one implementation of enqueue and enqueue_many: validates a JSON array of
-- jobs, resolves idempotency keys against the key ledger set-wise, inserts the
-- new jobs, wires continuations, counts duplicates, and notifies idle workers.
-- A batch (enqueue_many) without `after` whose keys (if any) are all new takes
-- a fast path: one statement that parses with jsonb_to_recordset and writes;
-- anything else, or any doubt, goes to the validating path, which does the
-- same in steps. The fast path runs in a subtransaction (one per call), which
-- is why enqueue() (`single`) never takes it.
--
-- Guarantees:
--   * Validation covers every element before anything is kept, so bad input
--     raises and writes nothing: the fast path's check refuses at least what
--     the validating path refuses, and a refusal (or a value that does not
--     parse, or a key that exists) rolls its block back and hands the batch
--     to the validating path, which names the first bad element. So errors and
--     outcomes do not depend on the path. `single` only changes how errors name the job.
--   * A key held by an active job yields that job (outcome `deduplicated`), or
--     `conflict` when the task or payload differ (jsonb equality: the md5 of the
--     jsonb text is only a fast path, since numbers equal as jsonb can print
--     differently, e.g. 1 and 1.0). A key whose latest job is terminal follows the
--     job's duplicate_policy: `rejected`, or a new job that takes the key over.
--   * Within one call, the first element with a key decides; later elements
--     with that key are deduplicated against the job the key then holds (or
--     `conflict`), or share the first element's rejection.
--   * N concurrent callers with one new key create exactly one job: the key
--     row's primary key serialises them (INSERT .. ON CONFLICT waits for the
--     inserter's transaction). If the inserter rolls back, a waiter inserts.
--   * Jobs with `after` parents wait in `awaiting` until every parent
--     succeeded; a parent already failed, cancelled or expired cancels them.
--   * NOTIFY idemq_jobs (payload: queue) once per queue with a job runnable now,
--     when a listener waits for it (_notify_waiting).
-- Concurrency: key rows are inserted/updated in key order (fewer deadlocks
--   between overlapping batches), on either path; the fast path's insert waits
--   for a concurrent inserter of a key like ON CONFLICT does, and when the key
--   is then taken its own key rows roll back before the validating path runs.
--   Parents named in `after` are row-locked (their has_children is set) so a
--   parent finishing concurrently cannot miss a child.
--   Under REPEATABLE READ a concurrent committed duplicate raises 40001: retry.
-- Errors: 22023/22004 for bad input (message names the element; HINT the fix),
--   e.g. a queue name over 1000 characters (it is the NOTIFY payload);
--   IQ404 for a parent job that does not exist; 40001 if keys keep changing
--   under the call (pruned and re-created repeatedly).
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/enqueue-policies.test.ts, test/sql/enqueue-concurrency.test.ts,
--   test/sql/continuations.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_rows(jobs jsonb, single boolean)
RETURNS TABLE(r_ordinal int, r_job_id bigint, r_outcome text,
              r_existing_state idemq.job_state, r_policy idemq.duplicate_policy, r_key text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_now timestamptz := now();
  v_defaults jsonb := idemq._job_defaults();
  v_fields text[] := ARRAY['task', 'payload', 'queue', 'run_at', 'priority', 'max_attempts',
                           'idempotency_key', 'duplicate_policy', 'backoff', 'expires_at', 'after'];
  v_policies text[] := enum_range(NULL::idemq.duplicate_policy)::text[];
  v_ord int;
  v_problem text;
  v_elem jsonb;
  v_rows idemq._job_input[];
  v_round int := 0;
  -- Resolved keys: key -> [job_id, outcome, existing_state, task, payload_md5, payload]
  -- of the job the key holds after this call (payload NULL when it is terminal). A jsonb map rather than a join between two
  -- unnest() calls: the planner cannot size those, and a nested loop over
  -- 20,000 x 20,000 elements is the trap this avoids. Same for parents below.
  v_keys jsonb := '{}';
  -- Parents named in `after`: id -> state, read under a row lock.
  v_parents jsonb;
  v_missing bigint;
  -- The plan, one entry per element, aligned with v_rows (both in ordinal order):
  -- unnest(v_rows, e_job, ...) zips them, expanding the _job_input columns.
  e_job bigint[];
  e_outcome text[];
  e_existing idemq.job_state[];
  e_state idemq.job_state[];
  v_fast boolean;
BEGIN
  IF jobs IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'jobs must not be NULL',
      HINT = 'Pass a JSON array of job objects, e.g. [{"task": "send_email"}].';
  END IF;
  IF jsonb_typeof(jobs) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('jobs must be a JSON array of job objects, not %s', coalesce(jsonb_typeof(jobs), 'NULL')),
      HINT = 'Pass jsonb like [{"task": "send_email", "payload": {"to": "a@example.com"}}].';
  END IF;
  -- 0. The fast path, for batches without `after`: one statement parses the
  --    array with jsonb_to_recordset (typed, in C) and checks each element
  --    cheaply (_parse_jobs, shared by the two statements below), and writes. Its check only ever refuses more than the validating
  --    path below: any doubt (a refused element, a value that does not parse, a
  --    key that already exists) raises a data_exception, which rolls the block
  --    back (nothing written) and leaves the batch to the validating path, so
  --    errors and outcomes are the same whichever path ran.
  --    Not for enqueue() (`single`): the block is a subtransaction, and a
  --    caller enqueueing one by one in a long transaction would pile them up
  --    (past 64 they overflow every session's snapshot cache); enqueue() has
  --    fast paths of its own.
  v_fast := NOT single
    AND NOT jsonb_path_exists(jobs, 'lax $[*] ? (@.after.type() != "null")')
    -- A first key that exists (a repeated enqueue, a resubmitted batch) would
    -- make the fast path fail: one index probe saves the attempt.
    AND NOT EXISTS (SELECT 1 FROM idemq.keys k WHERE k.key = jobs->0->>'idempotency_key');
  IF v_fast AND jsonb_path_exists(jobs, 'lax $[*] ? (@.backoff.type() != "null")') THEN
    -- Backoffs are checked once per distinct value; a bad one is left to the
    -- validating path, which names the first element that has it.
    v_fast := NOT EXISTS (
      SELECT 1
      FROM (SELECT DISTINCT e.val->'backoff' AS spec FROM jsonb_array_elements(jobs) e(val)) d
      WHERE idemq._backoff_problem(d.spec) IS NOT NULL);
  END IF;
  IF v_fast THEN
    BEGIN
      IF NOT jobs @? 'lax $[*].idempotency_key ? (@.type() != "null")' THEN
        -- Without keys every element is a new job. `ok` is NULL or false for
        -- an element the validating path might refuse: then nothing is written
        -- and no row returned. The one-time filter runs the insert and the
        -- notify before the first row is returned.
        RETURN QUERY
        WITH src AS MATERIALIZED (
          SELECT p.ord, nextval('idemq.jobs_id_seq') AS id, p.task, p.payload, p.queue, p.run_at, p.priority,
                 p.max_attempts, p.key, p.duplicate_policy, p.backoff, p.expires_at, p.ok
          FROM idemq._parse_jobs(jobs, v_now) p
        ), chk AS (
          SELECT coalesce(bool_and(coalesce(s.ok, false)), false) AS ok FROM src s
        ), ins AS (
          INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                       backoff, expires_at)
          SELECT s.id, s.task, s.queue, s.payload,
                 idemq._initial_state(s.run_at),
                 s.priority, s.run_at, s.max_attempts, s.backoff, s.expires_at
          FROM src s
          WHERE (SELECT c.ok FROM chk c)
          RETURNING j.queue, j.state
        ), nt AS (
          SELECT count(idemq._notify_waiting(q.queue)) AS n
          FROM (SELECT DISTINCT i.queue FROM ins i WHERE i.state = 'enqueued') q
        )
        SELECT s.ord, s.id, 'created'::text, NULL::idemq.job_state, s.duplicate_policy, NULL::text
        FROM src s
        WHERE (SELECT c.ok FROM chk c) AND (SELECT n.n FROM nt n) >= 0
        ORDER BY s.ord;
      ELSE
        -- With keys: the first element of each key (window over key, ordinal)
        -- takes it; later ones are deduplicated against it or conflict. Every
        -- key must be new: a plain insert in key order, so a key that exists
        -- (or that a concurrent caller inserts first: the insert waits for its
        -- transaction) raises unique_violation at once, the block rolls back,
        -- and the validating path resolves the keys that exist.
        RETURN QUERY
        WITH src AS MATERIALIZED (
          SELECT p.ord, nextval('idemq.jobs_id_seq') AS id, p.task, p.payload, p.queue, p.run_at, p.priority,
                 p.max_attempts, p.key, p.duplicate_policy, p.backoff, p.expires_at, p.ok
          FROM idemq._parse_jobs(jobs, v_now) p
        ), chk AS (
          SELECT coalesce(bool_and(coalesce(s.ok, false)), false) AS ok FROM src s
        ), dec AS MATERIALIZED (
          SELECT w.*,
                 CASE WHEN w.key IS NULL OR w.id = w.lead_id THEN 'created'
                      WHEN w.task = w.lead_task AND w.payload = w.lead_payload THEN 'deduplicated'
                      ELSE 'conflict' END AS outcome
          FROM (SELECT s.*, first_value(s.id) OVER k AS lead_id, first_value(s.task) OVER k AS lead_task,
                       first_value(s.payload) OVER k AS lead_payload
                FROM src s
                WINDOW k AS (PARTITION BY s.key ORDER BY s.ord)) w
        ), k AS (
          INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
          SELECT d.key, d.id, d.task, md5(d.payload::text)
          FROM dec d
          WHERE d.key IS NOT NULL AND d.outcome = 'created' AND (SELECT c.ok FROM chk c)
          ORDER BY d.key
          RETURNING 1
        ), ins AS (
          INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                       idempotency_key, backoff, expires_at)
          SELECT d.id, d.task, d.queue, d.payload,
                 idemq._initial_state(d.run_at),
                 d.priority, d.run_at, d.max_attempts, d.key, d.backoff, d.expires_at
          FROM dec d
          WHERE d.outcome = 'created' AND (SELECT c.ok FROM chk c)
          RETURNING j.queue, j.state
        ), cnt AS (
          INSERT INTO idemq.counters AS c (task, event, n)
          SELECT d.task, d.outcome, count(*)
          FROM dec d
          WHERE d.outcome <> 'created' AND (SELECT c.ok FROM chk c)
          GROUP BY 1, 2
          RETURNING 1
        ), nt AS (
          SELECT count(idemq._notify_waiting(q.queue)) AS n
          FROM (SELECT DISTINCT i.queue FROM ins i WHERE i.state = 'enqueued') q
        )
        SELECT d.ord, CASE WHEN d.key IS NULL THEN d.id ELSE d.lead_id END, d.outcome,
               NULL::idemq.job_state, d.duplicate_policy, d.key
        FROM dec d
        WHERE (SELECT c.ok FROM chk c) AND (SELECT count(*) FROM k) >= 0
          AND (SELECT n.n FROM nt n) >= 0 AND (SELECT count(*) FROM cnt) >= 0
        ORDER BY d.ord;
      END IF;
      IF NOT FOUND AND jsonb_array_length(jobs) > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'data_exception', MESSAGE = 'enqueue fast path declined';
      END IF;
      RETURN;
    EXCEPTION WHEN data_exception OR unique_violation THEN
      NULL;  -- rolled back; the validating path below decides
    END;
  END IF;

  -- 1. Validate every element; report the first problem.
  SELECT e.ord, chk.problem INTO v_ord, v_problem
  FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(val, ord)
  CROSS JOIN LATERAL (SELECT CASE
      WHEN jsonb_typeof(e.val) <> 'object' THEN
        format('must be a JSON object, not %s', e.val)
      WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(e.val) f WHERE f <> ALL (v_fields)) THEN
        format('has an unknown field "%s" (fields: %s)',
               (SELECT f FROM jsonb_object_keys(e.val) f WHERE f <> ALL (v_fields) LIMIT 1),
               array_to_string(v_fields, ', '))
      WHEN jsonb_typeof(e.val->'task') IS DISTINCT FROM 'string' OR e.val->>'task' = '' THEN
        'task must be a non-empty string: the name of a task your workers handle'
      WHEN jsonb_typeof(e.val->'payload') NOT IN ('object', 'null') THEN
        format('payload must be a JSON object, not %s', e.val->'payload')
      WHEN jsonb_typeof(e.val->'queue') NOT IN ('string', 'null') OR e.val->>'queue' = '' THEN
        format('queue must be a non-empty string, not %s', e.val->'queue')
      WHEN length(e.val->>'queue') > idemq._queue_name_limit() THEN
        format('queue must be at most %s characters, not %s', idemq._queue_name_limit(), length(e.val->>'queue'))
      WHEN jsonb_typeof(e.val->'run_at') NOT IN ('string', 'null') THEN
        format('run_at must be a timestamp string, not %s', e.val->'run_at')
      WHEN jsonb_typeof(e.val->'expires_at') NOT IN ('string', 'null') THEN
        format('expires_at must be a timestamp string, not %s', e.val->'expires_at')
      WHEN jsonb_typeof(e.val->'priority') NOT IN ('number', 'null')
           OR (jsonb_typeof(e.val->'priority') = 'number'
               AND ((e.val->>'priority')::numeric NOT BETWEEN -2147483648 AND 2147483647
                    OR (e.val->>'priority')::numeric <> trunc((e.val->>'priority')::numeric))) THEN
        format('priority must be a whole number (higher runs first), not %s', e.val->'priority')
      WHEN jsonb_typeof(e.val->'max_attempts') NOT IN ('number', 'null')
           OR (jsonb_typeof(e.val->'max_attempts') = 'number'
               AND ((e.val->>'max_attempts')::numeric NOT BETWEEN 1 AND 2147483647
                    OR (e.val->>'max_attempts')::numeric <> trunc((e.val->>'max_attempts')::numeric))) THEN
        format('max_attempts must be a whole number >= 1, not %s', e.val->'max_attempts')
      WHEN jsonb_typeof(e.val->'idempotency_key') NOT IN ('string', 'null') OR e.val->>'idempotency_key' = '' THEN
        format('idempotency_key must be a non-empty string or null, not %s', e.val->'idempotency_key')
      WHEN jsonb_typeof(e.val->'duplicate_policy') NOT IN ('string', 'null')
           OR (jsonb_typeof(e.val->'duplicate_policy') = 'string' AND e.val->>'duplicate_policy' <> ALL (v_policies)) THEN
        format('duplicate_policy must be one of %s, not %s', array_to_string(v_policies, ', '), e.val->'duplicate_policy')
      WHEN jsonb_typeof(e.val->'after') NOT IN ('array', 'null')
           OR (jsonb_typeof(e.val->'after') = 'array' AND EXISTS (
                 SELECT 1 FROM jsonb_array_elements(e.val->'after') a
                 WHERE jsonb_typeof(a) <> 'number' OR a::numeric <= 0 OR a::numeric <> trunc(a::numeric))) THEN
        format('after must be an array of job ids, not %s', e.val->'after')
    END AS problem) chk
  WHERE chk.problem IS NOT NULL
  ORDER BY e.ord
  LIMIT 1;

  -- Backoffs are checked once per distinct value: a batch usually shares one.
  IF v_problem IS NULL THEN
    SELECT min(e.ord), b.problem INTO v_ord, v_problem
    FROM (SELECT DISTINCT e.val->'backoff' AS spec
          FROM jsonb_array_elements(jobs) e(val) WHERE jsonb_typeof(e.val->'backoff') IS DISTINCT FROM 'null'
            AND e.val ? 'backoff') d
    CROSS JOIN LATERAL (SELECT idemq._backoff_problem(d.spec) AS problem) b
    JOIN jsonb_array_elements(jobs) WITH ORDINALITY AS e(val, ord) ON e.val->'backoff' = d.spec
    WHERE b.problem IS NOT NULL
    GROUP BY b.problem
    ORDER BY 1
    LIMIT 1;
  END IF;

  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = CASE WHEN single THEN v_problem ELSE format('jobs[%s] %s', v_ord, v_problem) END,
      HINT = CASE WHEN single THEN 'Fix the argument; nothing was enqueued.'
                  ELSE format('Fix element %s (1-based) of the jobs array; nothing was enqueued.', v_ord) END;
  END IF;

  -- 2. Parse. A timestamp that does not parse fails the whole statement; then
  --    find which element it was, so the error can name it.
  BEGIN
    v_rows := ARRAY(
      SELECT ROW(
        e.ord::int,
        e.val->>'task',
        coalesce(nullif(e.val->'payload', 'null'), v_defaults->'payload'),
        CASE WHEN e.val->>'idempotency_key' IS NOT NULL
             THEN md5(coalesce(nullif(e.val->'payload', 'null'), v_defaults->'payload')::text) END,
        coalesce(e.val->>'queue', v_defaults->>'queue'),
        coalesce((e.val->>'run_at')::timestamptz, v_now),
        coalesce(e.val->>'priority', v_defaults->>'priority')::numeric::int,
        coalesce(e.val->>'max_attempts', v_defaults->>'max_attempts')::numeric::int,
        e.val->>'idempotency_key',
        coalesce(e.val->>'duplicate_policy', v_defaults->>'duplicate_policy')::idemq.duplicate_policy,
        nullif(e.val->'backoff', 'null'),
        (e.val->>'expires_at')::timestamptz,
        CASE WHEN jsonb_array_length(coalesce(nullif(e.val->'after', 'null'), '[]')) > 0
             THEN ARRAY(SELECT DISTINCT a::numeric::bigint FROM jsonb_array_elements_text(e.val->'after') a) END
      )::idemq._job_input
      FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(val, ord)
      ORDER BY e.ord);
  EXCEPTION WHEN data_exception THEN
    FOR v_ord, v_elem IN SELECT e.ord, e.val FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(val, ord) LOOP
      BEGIN
        PERFORM (v_elem->>'run_at')::timestamptz, (v_elem->>'expires_at')::timestamptz;
      EXCEPTION WHEN data_exception THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
          MESSAGE = format('%srun_at/expires_at is not a timestamp: %s',
                           CASE WHEN single THEN '' ELSE format('jobs[%s] ', v_ord) END, SQLERRM),
          HINT = 'Write timestamps as ISO 8601 with a time zone, e.g. "2026-12-01T09:00:00Z"; nothing was enqueued.';
      END;
    END LOOP;
    RAISE;
  END;

  -- 3. Resolve idempotency keys, first element per key deciding. Usually one
  --    round; another is needed only when a key row changed between statements.
  WHILE EXISTS (SELECT 1 FROM unnest(v_rows) r
                WHERE r.idempotency_key IS NOT NULL AND NOT v_keys ? r.idempotency_key) LOOP
    v_round := v_round + 1;
    IF v_round > 10 THEN
      RAISE EXCEPTION USING ERRCODE = '40001',
        MESSAGE = 'idempotency keys kept changing during enqueue (pruned and re-created concurrently)',
        HINT = 'Retry the call.';
    END IF;

    -- 3a. New keys: insert; a concurrent inserter of the same key makes us wait
    --     for its transaction, then either we insert (it rolled back) or skip.
    WITH leader AS (
      SELECT DISTINCT ON (r.idempotency_key) r.idempotency_key, r.task, r.payload_md5, r.payload
      FROM unnest(v_rows) r
      WHERE r.idempotency_key IS NOT NULL AND NOT v_keys ? r.idempotency_key
      ORDER BY r.idempotency_key, r.ordinal
    ), ins AS (
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
      SELECT l.idempotency_key, nextval('idemq.jobs_id_seq'), l.task, l.payload_md5
      FROM leader l
      ORDER BY l.idempotency_key
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.key, k.job_id, k.task, k.payload_md5
    )
    SELECT v_keys || coalesce(jsonb_object_agg(i.key,
             jsonb_build_array(i.job_id, 'created', NULL, i.task, i.payload_md5, l.payload)), '{}')
    INTO v_keys
    FROM ins i JOIN leader l ON l.idempotency_key = i.key;

    -- 3b. Keys whose latest job is terminal and whose policy allows: take them
    --     over. The row lock makes a concurrent taker wait, then see the key active.
    WITH leader AS (
      SELECT DISTINCT ON (r.idempotency_key) r.idempotency_key, r.task, r.payload_md5, r.payload, r.duplicate_policy
      FROM unnest(v_rows) r
      WHERE r.idempotency_key IS NOT NULL AND NOT v_keys ? r.idempotency_key
      ORDER BY r.idempotency_key, r.ordinal
    ), upd AS (
      UPDATE idemq.keys AS k
      SET job_id = nextval('idemq.jobs_id_seq'), task = l.task, payload_md5 = l.payload_md5,
          finished_state = NULL, finished_at = NULL, created_at = now()
      FROM leader l
      WHERE k.key = l.idempotency_key
        AND k.finished_state IS NOT NULL
        AND NOT idemq._policy_rejects(l.duplicate_policy, k.finished_state)
      RETURNING k.key, k.job_id, k.task, k.payload_md5
    )
    SELECT v_keys || coalesce(jsonb_object_agg(u.key,
             jsonb_build_array(u.job_id, 'created', NULL, u.task, u.payload_md5, l.payload)), '{}')
    INTO v_keys
    FROM upd u JOIN leader l ON l.idempotency_key = u.key;

    -- 3c. The rest: held by an active job (deduplicated, or conflict when the
    --     work differs), or refused by the policy. A key that vanished (pruned)
    --     or turned terminal in between stays unresolved for the next round.
    --     An active key's job exists (purge deletes only terminal jobs) and
    --     committed with the key row, so its payload settles jsonb equality.
    WITH leader AS (
      SELECT DISTINCT ON (r.idempotency_key) r.idempotency_key, r.task, r.payload_md5, r.payload, r.duplicate_policy
      FROM unnest(v_rows) r
      WHERE r.idempotency_key IS NOT NULL AND NOT v_keys ? r.idempotency_key
      ORDER BY r.idempotency_key, r.ordinal
    )
    SELECT v_keys || coalesce(jsonb_object_agg(k.key, jsonb_build_array(
             k.job_id,
             CASE WHEN k.finished_state IS NOT NULL THEN 'rejected'
                  WHEN k.task = l.task AND (k.payload_md5 = l.payload_md5 OR j.payload = l.payload)
                    THEN 'deduplicated'
                  ELSE 'conflict' END,
             k.finished_state, k.task, k.payload_md5, j.payload)), '{}')
    INTO v_keys
    FROM leader l
    JOIN idemq.keys k ON k.key = l.idempotency_key
    LEFT JOIN idemq.jobs j ON j.id = k.job_id AND k.finished_state IS NULL
    WHERE k.finished_state IS NULL OR idemq._policy_rejects(l.duplicate_policy, k.finished_state);
  END LOOP;

  -- 4. Parents named in `after`: lock them (in id order) so that a parent
  --    finishing concurrently sees has_children and releases its new child.
  IF EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE r.after IS NOT NULL) THEN
    SELECT coalesce(jsonb_object_agg(j.id::text, j.state), '{}') INTO v_parents
    FROM (SELECT j.id, j.state FROM idemq.jobs j
          WHERE j.id IN (SELECT a FROM unnest(v_rows) r, unnest(r.after) a)
          ORDER BY j.id
          FOR NO KEY UPDATE) j;
    SELECT a INTO v_missing
    FROM unnest(v_rows) r, unnest(r.after) a
    WHERE NOT v_parents ? a::text
    LIMIT 1;
    IF v_missing IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'IQ404',
        MESSAGE = format('parent job %s (named in after) does not exist', v_missing),
        HINT = 'Name existing job ids in after; nothing was enqueued.';
    END IF;
    UPDATE idemq.jobs AS j SET has_children = true
    WHERE j.id IN (SELECT a FROM unnest(v_rows) r, unnest(r.after) a) AND NOT j.has_children;
  END IF;

  -- 5. The plan: per element, its outcome, its job id, and the state a new job starts in.
  WITH el AS (
    SELECT r.ordinal, r.idempotency_key, r.task, r.payload_md5, r.payload, r.after, r.run_at,
           min(r.ordinal) OVER (PARTITION BY r.idempotency_key) AS leader_ordinal,
           v_keys->r.idempotency_key AS k
    FROM unnest(v_rows) r
  ), decided AS (
    SELECT el.*,
           CASE
             WHEN el.idempotency_key IS NULL THEN 'created'
             WHEN el.ordinal = el.leader_ordinal THEN el.k->>1
             WHEN el.k->>1 = 'rejected' THEN 'rejected'
             WHEN el.k->>3 = el.task AND (el.k->>4 = el.payload_md5 OR el.k->5 = el.payload) THEN 'deduplicated'
             ELSE 'conflict'
           END AS outcome
    FROM el
  )
  SELECT array_agg(CASE WHEN d.idempotency_key IS NULL THEN nextval('idemq.jobs_id_seq')
                        ELSE (d.k->>0)::bigint END ORDER BY d.ordinal),
         array_agg(d.outcome ORDER BY d.ordinal),
         array_agg(CASE WHEN d.outcome = 'rejected' THEN (d.k->>2)::idemq.job_state END ORDER BY d.ordinal),
         array_agg(CASE
                     WHEN d.after IS NOT NULL AND EXISTS (
                       SELECT 1 FROM unnest(d.after) a WHERE v_parents->>a::text <> 'succeeded') THEN 'awaiting'
                     ELSE idemq._initial_state(d.run_at)
                   END::idemq.job_state ORDER BY d.ordinal)
  INTO e_job, e_outcome, e_existing, e_state
  FROM decided d;

  -- 6. Insert the new jobs.
  INSERT INTO idemq.jobs (id, task, queue, payload, state, priority, run_at, max_attempts,
                          idempotency_key, backoff, expires_at)
  SELECT p.job_id, p.task, p.queue, p.payload, p.state, p.priority, p.run_at,
         p.max_attempts, p.idempotency_key, p.backoff, p.expires_at
  FROM unnest(v_rows, e_job, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, state)
  WHERE p.outcome = 'created';

  -- 7. Continuations: record what each awaiting job waits on; a parent that
  --    already failed, was cancelled or expired cancels its new child at once
  --    (through an UPDATE, so the key ledger and grandchildren follow).
  IF v_parents IS NOT NULL THEN
    INSERT INTO idemq.job_dependencies (parent_id, child_id)
    SELECT DISTINCT a, p.job_id
    FROM unnest(v_rows, e_job, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, state),
         unnest(p.after) a
    WHERE p.outcome = 'created' AND p.state = 'awaiting' AND v_parents->>a::text <> 'succeeded'
      AND NOT EXISTS (SELECT 1 FROM unnest(p.after) b
                      WHERE (v_parents->>b::text)::idemq.job_state = ANY (idemq._unsuccessful_states()));

    UPDATE idemq.jobs AS j
    SET state = 'cancelled', finished_at = now(),
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
          'message', format('parent job %s ended %s before this job could run', f.parent_id, f.parent_state)))
    FROM (SELECT DISTINCT ON (p.job_id) p.job_id, a AS parent_id, v_parents->>a::text AS parent_state
          FROM unnest(v_rows, e_job, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, state),
               unnest(p.after) a
          WHERE p.outcome = 'created' AND (v_parents->>a::text)::idemq.job_state = ANY (idemq._unsuccessful_states())
          ORDER BY p.job_id, a) f
    WHERE j.id = f.job_id;
  END IF;

  -- 8. Count what the database can count, and wake idle workers.
  IF EXISTS (SELECT 1 FROM unnest(e_outcome) o WHERE o <> 'created') THEN
    INSERT INTO idemq.counters (task, event, n)
    SELECT p.task, p.outcome, count(*)
    FROM unnest(v_rows, e_outcome) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 outcome)
    WHERE p.outcome <> 'created'
    GROUP BY 1, 2;
  END IF;

  PERFORM idemq._notify_waiting(q.queue)
  FROM (SELECT DISTINCT p.queue AS queue
        FROM unnest(v_rows, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 outcome, state)
        WHERE p.outcome = 'created' AND p.state = 'enqueued') q;

  RETURN QUERY
  SELECT p.ordinal, p.job_id, p.outcome, p.existing_state, p.duplicate_policy, p.idempotency_key
  FROM unnest(v_rows, e_job, e_outcome, e_existing) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, existing_state);
END;
$$;

COMMENT ON FUNCTION idemq._enqueue_rows(jsonb, boolean) IS
  'The implementation shared by enqueue and enqueue_many: validate, resolve keys, insert, notify.';

-- ---- sql/functions/_on_job_finished.sql ----
-- idemq._on_job_finished() RETURNS trigger
--
-- Trigger (AFTER UPDATE OF state ON idemq.jobs, for rows entering a terminal
-- state that have an idempotency key or children): keeps the key ledger and
-- continuations in step with the job, whichever function finished it.
--
-- Guarantees:
--   * The key, if it still points at this job, records its terminal state and
--     finished_at, so the duplicate policy applies from now on.
--   * Children waiting on this job (after): when it succeeded, each child whose
--     parents have all succeeded becomes runnable (enqueued, or scheduled if
--     its run_at is later) and waiting workers are notified; when it failed, was
--     cancelled or expired, its awaiting children are cancelled with the
--     reason in their errors (and theirs in turn, through this trigger).
--     Their other dependency rows stay until those parents finish; they
--     only ever release jobs still awaiting.
-- Concurrency: runs inside the finishing transaction; children are locked
--   in id order before their remaining parents are read, so two parents of one
--   child finishing at once serialise on the child and the later one sees the
--   earlier one's outcome (the child is released once, or stays cancelled).
-- Errors: none of its own.
-- Tests: test/sql/continuations.test.ts, test/sql/enqueue-policies.test.ts
CREATE OR REPLACE FUNCTION idemq._on_job_finished()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_children bigint[];
  v_queues text[];
BEGIN
  IF NEW.idempotency_key IS NOT NULL THEN
    UPDATE idemq.keys AS k
    SET finished_state = NEW.state, finished_at = NEW.finished_at
    WHERE k.key = NEW.idempotency_key AND k.job_id = NEW.id;
  END IF;

  IF NEW.has_children THEN
    WITH released AS (
      DELETE FROM idemq.job_dependencies AS d
      WHERE d.parent_id = NEW.id
      RETURNING d.child_id
    )
    SELECT array_agg(r.child_id) INTO v_children FROM released r;
    IF v_children IS NULL THEN
      RETURN NULL;
    END IF;
    -- Lock the children (in id order) before looking at what else they wait
    -- on, and look in statements of their own: each takes its snapshot after
    -- the lock, so it sees what a concurrent parent's transaction committed.
    -- Read in the statement that deletes the dependency rows, two parents
    -- succeeding at once would each still see the other's row, and neither
    -- would release the child.
    PERFORM 1 FROM idemq.jobs j
    WHERE j.id = ANY (v_children)
    ORDER BY j.id
    FOR NO KEY UPDATE;

    IF NEW.state = 'succeeded' THEN
      WITH moved AS (
        UPDATE idemq.jobs AS j
        SET state = idemq._initial_state(j.run_at)
        WHERE j.id = ANY (v_children)
          AND j.state = 'awaiting'
          AND NOT EXISTS (SELECT 1 FROM idemq.job_dependencies d WHERE d.child_id = j.id)
        RETURNING j.queue, j.state
      )
      SELECT array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued') INTO v_queues FROM moved m;
      PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;
    ELSE
      UPDATE idemq.jobs AS j
      SET state = 'cancelled', finished_at = now(),
          errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
            'message', format('parent job %s ended %s before this job could run', NEW.id, NEW.state)))
      WHERE j.id = ANY (v_children) AND j.state = 'awaiting';
    END IF;
  END IF;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._on_job_finished() IS
  'Trigger: on a job entering a terminal state, finish its key in the ledger and release or cancel its children.';

-- ---- sql/functions/cancel.sql ----
-- idemq.cancel(job_id bigint) RETURNS idemq.job_state
--
-- Cancels a job that has not finished. Returns its new state, `cancelled`.
--
-- Guarantees:
--   * Any active job can be cancelled. A job in processing is taken from its
--     worker: that attempt's complete/fail raise IQ410 and its heartbeat
--     reports it lost, so a transactional handler's writes roll back; its
--     errors record {"class": "Cancelled", ...} for that attempt.
--   * The key is marked finished (cancelled); awaiting children are cancelled.
-- Concurrency: row lock on the job (waits for a completing worker).
-- Errors: IQ404 no such job; IQ412 already finished (DETAIL {"job_id","state"}).
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.cancel(job_id bigint)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
BEGIN
  v_job := idemq._lock_job(cancel.job_id, 'cancel');
  IF v_job.state = ANY (idemq.terminal_states()) THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('cancel: job %s already finished (%s)', v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = 'Only scheduled, enqueued, processing or awaiting jobs can be cancelled.';
  END IF;
  -- A running attempt is cut short: its history says so, as a failure would.
  UPDATE idemq.jobs AS j
  SET state = 'cancelled', finished_at = now(), locked_by = NULL, lease_expires_at = NULL,
      errors = CASE WHEN j.state = 'processing'
                    THEN j.errors || jsonb_build_array(jsonb_build_object(
                           'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(),
                           'worker', j.locked_by, 'class', 'Cancelled',
                           'message', 'cancelled by an operator while this attempt ran'))
                    ELSE j.errors END
  WHERE j.id = v_job.id;
  RETURN 'cancelled';
END;
$$;

COMMENT ON FUNCTION idemq.cancel(bigint) IS
  'Cancel an active job (a running attempt is fenced out); IQ412 if it already finished.';

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
--   * Never takes a job in processing: a lease that ran out is taken away
--     only by rescue().
-- Concurrency: FOR UPDATE SKIP LOCKED over the jobs_runnable partial index:
--   concurrent claimers never block each other and never get the same job.
--   Jobs locked by another transaction (being claimed, cancelled...) are
--   skipped, not waited for.
-- Errors: 22004 worker_id/batch_size NULL; 22023 empty worker_id, batch_size
--   outside 1..1000, empty queue or task name, bad lease.
-- Tests: test/sql/claim.test.ts, test/sql/claim-concurrency.test.ts, test/sql/fencing.test.ts
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
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_lost bigint[];
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'claim: worker_id must be a non-empty string',
      HINT = 'Name the worker, e.g. hostname:pid; it is recorded as locked_by and in the error history.';
  END IF;
  IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN batch_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('claim: batch_size must be between 1 and 1000, not %s', coalesce(batch_size::text, 'NULL')),
      HINT = 'Claim at most as many jobs as the worker can start before their leases need a heartbeat.';
  END IF;
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim: queues must be NULL (all queues) or a non-empty list of queue names, not %s', queues),
      HINT = 'Pass NULL to claim from every queue.';
  END IF;
  IF tasks IS NOT NULL AND (cardinality(tasks) = 0 OR EXISTS (
       SELECT 1 FROM unnest(tasks) t WHERE t IS NULL OR t = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim: tasks must be NULL (any task) or a non-empty list of task names, not %s', tasks),
      HINT = 'Pass the names of the tasks this worker has, or NULL to claim jobs of any task.';
  END IF;
  PERFORM idemq._check_lease(lease, 'claim');

  -- Two steps: lock the jobs (SKIP LOCKED, in claim order) into an array, then
  -- update them by primary key. One UPDATE joined to the locking subquery let
  -- the planner hash the whole jobs table for claims of a few hundred (seen in
  -- EXPLAIN: a sequential scan of every row, finished ones included, per
  -- claim); "id = ANY (array)" is an index probe per job whatever the table
  -- holds. The jobs whose previous attempt lost its lease are noted before the
  -- update resets the flag. Two static statements for the queue filter rather
  -- than "queues IS NULL OR ...": each gets a plan that walks jobs_runnable in
  -- claim order and stops at the limit. The task filter is checked on the
  -- rows the walk meets (jobs_runnable does not hold the task).
  IF queues IS NULL THEN
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
        AND (tasks IS NULL OR j.task = ANY (tasks))
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSE
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.run_at <= now()
        AND j.queue = ANY (queues)
        AND (j.expires_at IS NULL OR j.expires_at > now())
        AND (tasks IS NULL OR j.task = ANY (tasks))
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
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
              j.priority, j.run_at
  )
  SELECT c.id, c.task, c.queue, c.payload, c.attempt, c.max_attempts,
         c.idempotency_key, c.lease_expires_at, c.reclaimed
  FROM claimed c
  ORDER BY c.priority DESC, c.run_at, c.id;
END;
$$;

COMMENT ON FUNCTION idemq.claim(text, text[], int, interval, text[]) IS
  'Claim up to batch_size runnable jobs (priority desc, run_at, id) under a lease; FOR UPDATE SKIP LOCKED.';

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

-- ---- sql/functions/effect_claim.sql ----
-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes')
--   RETURNS TABLE(status text, result jsonb)
--
-- The claim-first record for an effect outside the database (an email, a
-- charge, a webhook). Call it in its own transaction (autocommit) before the
-- external call, then effect_done() or effect_release().
--
-- Guarantees: status is one of
--   claimed   no record existed: this owner may make the call;
--   reclaimed an earlier claim is older than stale_after (its owner likely
--             died, perhaps after the call): check with the external system
--             first, or resend with the same idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at, re-checked after a concurrent reclaimer
--   commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner or stale_after <= 0.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes')
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

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp())
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND e.claimed_at < clock_timestamp() - effect_claim.stale_after;
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

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval) IS
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
--   never claimed; DETAIL {"key","owner"}); 22004 NULL key/owner; 22023 empty key/owner.
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
    MESSAGE = format('effect_done: the claim on effect "%s" is not held by %s', effect_done.key, effect_done.owner),
    DETAIL = jsonb_build_object('key', effect_done.key, 'owner', effect_done.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale: raise stale_after above the longest call.';
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
--   by releasing; DETAIL {"key","status"}); 22004 NULL key/owner; 22023 empty key/owner.
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
  DELETE FROM idemq.effects AS e
  WHERE e.key = effect_release.key AND e.owner = effect_release.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM idemq.effects e WHERE e.key = effect_release.key AND e.status = 'done') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('effect_release: effect "%s" is already done and cannot be released', effect_release.key),
      DETAIL = jsonb_build_object('key', effect_release.key, 'status', 'done')::text,
      HINT = 'A done effect happened; do not retry it.';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('effect_release: the claim on effect "%s" is not held by %s', effect_release.key, effect_release.owner),
    DETAIL = jsonb_build_object('key', effect_release.key, 'owner', effect_release.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale; leave it to them.';
END;
$$;

COMMENT ON FUNCTION idemq.effect_release(text, text) IS
  'Give up a claim whose external call did not happen; IQ410 if not this owner''s.';

-- ---- sql/functions/enqueue.sql ----
-- idemq.enqueue(task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
--   run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, max_attempts int DEFAULT 10,
--   idempotency_key text DEFAULT NULL,
--   duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
--   backoff jsonb DEFAULT NULL, expires_at timestamptz DEFAULT NULL, after bigint[] DEFAULT NULL)
--   RETURNS TABLE(job_id bigint, deduplicated boolean)
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
--   * expires_at may already be past: the job is never claimed, and rescue()
--     marks it expired.
-- Concurrency: N concurrent calls with one key create exactly one job and all
--   get its id; if the first inserter rolls back, a waiter creates it (the key
--   row's primary key serialises them; see _enqueue_rows).
-- Errors: 22004 a required argument is NULL; 22023 bad argument (empty task,
--   payload not an object, max_attempts < 1, malformed backoff, a queue name
--   over 1000 characters...);
--   IQ409 the policy rejects (DETAIL {"key","existing_job_id","existing_state","policy"});
--   IQ422 the key is held by an active job for a different task or payload
--   (DETAIL {"key","existing_job_id"}); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts, test/sql/continuations.test.ts,
--   test/sql/bad-input.test.ts
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
  after bigint[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, deduplicated boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_null text;
  v_result record;
  v_state idemq.job_state;
  v_id bigint;
BEGIN
  v_null := CASE
    WHEN enqueue.task IS NULL THEN 'task'
    WHEN enqueue.payload IS NULL THEN 'payload'
    WHEN enqueue.queue IS NULL THEN 'queue'
    WHEN enqueue.priority IS NULL THEN 'priority'
    WHEN enqueue.max_attempts IS NULL THEN 'max_attempts'
    WHEN enqueue.duplicate_policy IS NULL THEN 'duplicate_policy'
  END;
  IF v_null IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('enqueue: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
  END IF;
  IF jsonb_typeof(enqueue.payload) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('enqueue: payload must be a JSON object, not %s', enqueue.payload),
      HINT = 'Wrap the value in an object, e.g. {"value": ...}.';
  END IF;

  -- The common cases are one or two INSERTs: no key, or a key nobody holds,
  -- without parents and with valid arguments. The shared bulk path costs about
  -- 0.5 ms per call in JSON round trips. Everything else, including every
  -- argument the bulk path would reject and every key already in the ledger,
  -- goes there, so errors and outcomes read the same whichever path a call takes.
  IF enqueue.after IS NULL AND coalesce(enqueue.idempotency_key <> '', true)
     AND enqueue.task <> '' AND enqueue.queue <> '' AND length(enqueue.queue) <= idemq._queue_name_limit()
     AND enqueue.max_attempts >= 1
     AND (enqueue.backoff IS NULL OR idemq._backoff_problem(enqueue.backoff) IS NULL) THEN
    IF enqueue.idempotency_key IS NOT NULL THEN
      -- A new key: the key row's primary key serialises concurrent callers
      -- (ON CONFLICT waits for an inserter's transaction); a key that exists
      -- (or a concurrent inserter that committed) is left to the shared path.
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
      VALUES (enqueue.idempotency_key, nextval('idemq.jobs_id_seq'), enqueue.task, md5(enqueue.payload::text))
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.job_id INTO v_id;
    END IF;
    IF enqueue.idempotency_key IS NULL OR v_id IS NOT NULL THEN
      v_state := idemq._initial_state(enqueue.run_at);
      INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                   idempotency_key, backoff, expires_at)
      VALUES (coalesce(v_id, nextval('idemq.jobs_id_seq')), enqueue.task, enqueue.queue, enqueue.payload,
              v_state, enqueue.priority, coalesce(enqueue.run_at, now()), enqueue.max_attempts,
              enqueue.idempotency_key, nullif(enqueue.backoff, 'null'), enqueue.expires_at)
      RETURNING j.id INTO job_id;
      IF v_state = 'enqueued' THEN
        PERFORM idemq._notify_waiting(enqueue.queue);
      END IF;
      deduplicated := false;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;

  SELECT r.r_job_id, r.r_outcome, r.r_existing_state, r.r_policy INTO v_result
  FROM idemq._enqueue_rows(jsonb_build_array(jsonb_build_object(
         'task', enqueue.task, 'payload', enqueue.payload, 'queue', enqueue.queue,
         'run_at', enqueue.run_at, 'priority', enqueue.priority,
         'max_attempts', enqueue.max_attempts, 'idempotency_key', enqueue.idempotency_key,
         'duplicate_policy', enqueue.duplicate_policy, 'backoff', enqueue.backoff,
         'expires_at', enqueue.expires_at, 'after', enqueue.after)), true) r;

  IF v_result.r_outcome = 'rejected' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ409',
      MESSAGE = format('idempotency key "%s" was used by job %s, which %s; duplicate_policy %s rejects a new job',
                       enqueue.idempotency_key, v_result.r_job_id, v_result.r_existing_state, v_result.r_policy),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_result.r_job_id,
                                  'existing_state', v_result.r_existing_state, 'policy', v_result.r_policy)::text,
      HINT = format('Read job %s for its outcome; to run the work again, enqueue with a policy that allows it '
                    '(allow_after_failed) or retry job %s.', v_result.r_job_id, v_result.r_job_id);
  ELSIF v_result.r_outcome = 'conflict' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ422',
      MESSAGE = format('idempotency key "%s" is held by active job %s for different work (task or payload differ)',
                       enqueue.idempotency_key, v_result.r_job_id),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_result.r_job_id)::text,
      HINT = 'A key must name one piece of work: derive it from the task and the payload''s identity, '
             'or wait until the existing job finishes.';
  END IF;

  job_id := v_result.r_job_id;
  deduplicated := v_result.r_outcome = 'deduplicated';
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue(text, jsonb, text, timestamptz, int, int, text, idemq.duplicate_policy, jsonb, timestamptz, bigint[]) IS
  'Add a job, or return the active job holding its idempotency key; the duplicate policy decides after a terminal job.';

-- ---- sql/functions/enqueue_many.sql ----
-- idemq.enqueue_many(jobs jsonb) RETURNS TABLE(ordinal int, job_id bigint, outcome text)
--
-- Adds many jobs in one statement: the fast path. `jobs` is a JSON array of
-- objects with enqueue()'s fields (task required; payload, queue, run_at,
-- priority, max_attempts, idempotency_key, duplicate_policy, backoff,
-- expires_at, after optional, with enqueue()'s defaults).
--
-- Guarantees:
--   * One row per element, in order (`ordinal` is 1-based). outcome:
--     `created`; `deduplicated` (job_id: the active job holding the key);
--     `rejected` (the policy refused; job_id: the key's latest job);
--     `conflict` (the key is held by an active job for different work; job_id: that job).
--     Rejections and conflicts do not raise, and are counted in stats().
--   * Within one call the first element with a key decides; later elements
--     with the same key are deduplicated against the job the key then holds
--     (or `conflict`), or share the first element's rejection.
--   * All elements are validated before anything is written: one bad element
--     raises and nothing is enqueued.
--   * Set-based: a constant number of statements whatever the batch size.
-- Concurrency: as enqueue(); keys are taken in key order.
-- Errors: 22004 jobs is NULL; 22023 jobs is not an array, or an element is malformed (the message
--   names the element as jobs[N]); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue-many.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.enqueue_many(jobs jsonb)
RETURNS TABLE(ordinal int, job_id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT r.r_ordinal, r.r_job_id, r.r_outcome
  FROM idemq._enqueue_rows(enqueue_many.jobs, false) r;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue_many(jsonb) IS
  'Add many jobs in one call; returns (ordinal, job_id, outcome) per element, never raising for duplicates.';

-- ---- sql/functions/fail.sql ----
-- idemq.fail(job_id bigint, attempt int, error jsonb, retryable boolean DEFAULT true,
--   retry_at timestamptz DEFAULT NULL, backoff jsonb DEFAULT NULL,
--   max_attempts int DEFAULT NULL) RETURNS TABLE(state idemq.job_state, run_at timestamptz)
--
-- Records a failed attempt; schedules a retry or fails the job for good.
-- Returns one row: the job's new state and the run_at of its retry (NULL
-- when it failed), exactly as stored.
--
-- Guarantees:
--   * Appends to errors one entry: the fields of `error` (by convention
--     class and message; a JSON string is taken as the message, with
--     class "Error"), with
--     attempt, started_at (the claim), failed_at and worker set by fail()
--     over any fields of the same names.
--   * The job goes to `scheduled` at retry_at, or after the job's backoff
--     (_backoff_delay with the number of counted attempts so far, 1 for the
--     first failure); or to `failed` when the error is not retryable or the
--     counted attempts reached max_attempts. Snoozes do not count.
--   * backoff and max_attempts override the job's for this decision (a
--     worker's task settings): the delay is _backoff_delay(backoff, counted
--     attempts) on the database clock, and the job fails once the counted
--     attempts reach the lower of the two limits.
--   * A retry already due (retry_at not in the future) NOTIFYs idemq_jobs
--     when a listener waits (_notify_waiting).
--   * Fenced like complete(): a stale attempt changes nothing.
--   * The returned run_at is the one source of the retry time: a worker reports
--     it instead of computing the backoff again.
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id/attempt/error/retryable;
--   22023 error is not a JSON object or string, a malformed backoff,
--   max_attempts < 1.
-- Tests: test/sql/fail.test.ts, test/sql/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq.fail(
  job_id bigint,
  attempt int,
  error jsonb,
  retryable boolean DEFAULT true,
  retry_at timestamptz DEFAULT NULL,
  backoff jsonb DEFAULT NULL,
  max_attempts int DEFAULT NULL)
RETURNS TABLE(state idemq.job_state, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No "#variable_conflict error" line: the parameter named "error" (fixed by
-- the contract) would be read there as the variable; nor SET
-- plpgsql.variable_conflict, which only a superuser may set (it kept anyone
-- else from installing idemq). Every name in the body is qualified, so it
-- means the same under any setting (the default is error).
AS $$
DECLARE
  v_error jsonb;
  v_job record;
  v_state idemq.job_state;
  v_due record;
  v_problem text;
BEGIN
  IF fail.error IS NULL OR fail.retryable IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'fail: error and retryable must not be NULL',
      HINT = 'Pass the error as {"class": "TimeoutError", "message": "..."}.';
  END IF;
  v_error := CASE jsonb_typeof(fail.error)
    WHEN 'object' THEN fail.error
    WHEN 'string' THEN jsonb_build_object('class', 'Error', 'message', fail.error #>> '{}')
  END;
  IF v_error IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: error must be a JSON object or string, not %s', fail.error),
      HINT = 'Pass {"class": "TimeoutError", "message": "...", "stack": "..."}.';
  END IF;
  v_problem := idemq._backoff_problem(fail.backoff);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: %s', v_problem),
      HINT = 'Pass NULL to use the job''s own backoff.';
  END IF;
  IF fail.max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: max_attempts must be NULL or >= 1, not %s', fail.max_attempts),
      HINT = 'Pass NULL to use the job''s own max_attempts.';
  END IF;

  SELECT j.attempt, j.uncounted, j.max_attempts, j.backoff INTO v_job
  FROM idemq.jobs j
  WHERE j.id = fail.job_id AND j.attempt = fail.attempt AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(fail.job_id, fail.attempt, 'fail');
  END IF;
  v_state := CASE WHEN NOT fail.retryable
                    OR v_job.attempt - v_job.uncounted >= least(v_job.max_attempts, fail.max_attempts)
                  THEN 'failed' ELSE 'scheduled' END;

  UPDATE idemq.jobs AS j
  SET state = v_state,
      run_at = CASE WHEN v_state = 'scheduled'
                    THEN coalesce(fail.retry_at, now() + idemq._backoff_delay(coalesce(nullif(fail.backoff, 'null'), v_job.backoff),
                                                                  v_job.attempt - v_job.uncounted))
                    ELSE j.run_at END,
      finished_at = CASE WHEN v_state = 'failed' THEN now() END,
      errors = j.errors || jsonb_build_array(v_error || jsonb_build_object(
        'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by)),
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = fail.job_id
  RETURNING j.run_at, j.queue INTO v_due;
  -- A retry due at once (retry_at in the past, a zero delay) must not wait
  -- for a worker's fallback poll.
  IF v_state = 'scheduled' AND v_due.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_due.queue);
  END IF;
  state := v_state;
  run_at := CASE WHEN v_state = 'scheduled' THEN v_due.run_at END;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int) IS
  'Record a failed attempt; scheduled for a retry by backoff (or retry_at), or failed when not retryable or out of attempts.';

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
-- Errors: 22004 NULL key; 22023 empty key or empty task (NULL task is fine).
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

-- ---- sql/functions/prune_keys.sql ----
-- idemq.prune_keys(older_than interval DEFAULT '14 days') RETURNS int
--
-- Releases idempotency keys whose latest job finished more than older_than
-- ago, and guard rows (guard) and finished effect records (effect_claim)
-- older than that. Returns how many keys it released.
--
-- Guarantees:
--   * The only way a key is released: a key whose job is active is never
--     pruned, and purge() never releases keys. Keep older_than longer than
--     any retry or replay horizon: a delivery after its key is pruned runs again.
--   * Claim records still `claimed` are never pruned (their effect may be in flight).
--   * Folds the append-only event counters (stats() sums are unchanged).
-- Concurrency: SKIP LOCKED on key rows; an enqueue taking a key over holds it
--   and keeps it.
-- Errors: 22004 NULL; 22023 negative older_than.
-- Tests: test/sql/retention.test.ts
CREATE OR REPLACE FUNCTION idemq.prune_keys(older_than interval DEFAULT '14 days')
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  IF older_than IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'prune_keys: older_than must not be NULL',
      HINT = 'Leave it out for the default key retention (14 days).';
  END IF;
  IF older_than < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('prune_keys: older_than must not be negative, not %s', older_than),
      HINT = 'older_than is the key retention, e.g. ''14 days''.';
  END IF;

  WITH doomed AS MATERIALIZED (
    SELECT k.key FROM idemq.keys k
    WHERE k.finished_at < now() - older_than
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM idemq.keys AS k USING doomed d WHERE k.key = d.key RETURNING k.key
  )
  SELECT count(*) INTO v_count FROM gone;

  DELETE FROM idemq.processed AS p WHERE p.created_at < now() - older_than;

  -- Fold the append-only event counters into one row per (task, event). Rows
  -- another transaction inserts meanwhile are not seen and stay for next time.
  WITH folded AS (
    DELETE FROM idemq.counters AS c RETURNING c.task, c.event, c.n
  )
  INSERT INTO idemq.counters (task, event, n)
  SELECT f.task, f.event, sum(f.n) FROM folded f GROUP BY f.task, f.event;
  DELETE FROM idemq.effects AS e WHERE e.status = 'done' AND e.done_at < now() - older_than;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq.prune_keys(interval) IS
  'Release keys (and guard rows, done effect records) finished more than older_than ago; default 14 days.';

-- ---- sql/functions/purge.sql ----
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
-- Errors: 22004 NULL argument; 22023 negative older_than, an active state in states.
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
  IF NOT states <@ idemq.terminal_states() OR array_position(states, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: states must be terminal (%s), not %s', idemq.terminal_states(), states),
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

-- ---- sql/functions/reschedule.sql ----
-- idemq.reschedule(job_id bigint, run_at timestamptz) RETURNS idemq.job_state
--
-- Moves a job that waits to run to another time. Returns its new state:
-- `scheduled` (run_at in the future), `enqueued` (now or past), or `awaiting`
-- (unchanged: it also waits for its parents; run_at applies once they succeed).
--
-- Guarantees: attempts, errors and key are untouched.
-- Concurrency: row lock on the job.
-- Errors: IQ404; IQ412 the job is processing or finished (DETAIL {"job_id","state"});
--   22004 NULL run_at.
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.reschedule(job_id bigint, run_at timestamptz)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
  v_state idemq.job_state;
BEGIN
  IF reschedule.run_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'reschedule: run_at must not be NULL',
      HINT = 'Pass when the job should run, e.g. now() + interval ''1 hour''.';
  END IF;
  v_job := idemq._lock_job(reschedule.job_id, 'reschedule');
  IF v_job.state NOT IN ('scheduled', 'enqueued', 'awaiting') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('reschedule: job %s is %s; only scheduled, enqueued or awaiting jobs can be rescheduled',
                       v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = CASE WHEN v_job.state = 'processing' THEN 'A worker is running it; wait, or cancel it.'
                  ELSE 'It finished; use retry to run it again.' END;
  END IF;
  v_state := CASE WHEN v_job.state = 'awaiting' THEN 'awaiting'
                  ELSE idemq._initial_state(reschedule.run_at) END;
  UPDATE idemq.jobs AS j SET run_at = reschedule.run_at, state = v_state WHERE j.id = v_job.id;
  IF v_state = 'enqueued' THEN
    PERFORM idemq._notify_waiting(v_job.queue);
  END IF;
  RETURN v_state;
END;
$$;

COMMENT ON FUNCTION idemq.reschedule(bigint, timestamptz) IS
  'Move a waiting job to another run_at; IQ412 if it is processing or finished.';

-- ---- sql/functions/rescue.sql ----
-- idemq.rescue() RETURNS int
--
-- Takes jobs away from workers whose lease ran out, and expires jobs past
-- their deadline. Returns how many jobs it changed.
--
-- Guarantees:
--   * A job in processing whose lease_expires_at has passed (a crashed or
--     partitioned worker) goes back to enqueued, runnable now, or to failed
--     when that was its last counted attempt, or to expired when it is past
--     its expires_at (it could never be claimed again). Its errors record
--     {"class": "LeaseExpired", "message": "lease expired", ...}, and the next
--     claim reports reclaimed = true. The old attempt is fenced out from then on.
--   * Every active job that is not processing and is past its expires_at
--     (never started, or a retry waiting past its deadline) becomes expired.
--   * Each job changed counts once in the result.
--   * Idempotent: any number of workers, or pg_cron, may call it at any time;
--     no leader is needed. Waiting workers are notified (_notify_waiting)
--     of jobs it put back to enqueued.
-- Concurrency: FOR UPDATE SKIP LOCKED: rows another transaction holds (a
--   completing worker, a concurrent rescue) are left for the next call.
-- Errors: none.
-- Tests: test/sql/rescue.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.rescue()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_rescued int;
  v_expired int;
  v_queues text[];
BEGIN
  WITH lost AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.state = 'processing' AND j.lease_expires_at < now()
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), moved AS (
    UPDATE idemq.jobs AS j
    -- Straight to expired rather than enqueued-then-expired below, so the
    -- job counts once and no worker is woken for it.
    SET state = CASE WHEN j.attempt - j.uncounted >= j.max_attempts THEN 'failed'
                     WHEN j.expires_at <= now() THEN 'expired'
                     ELSE 'enqueued' END::idemq.job_state,
        finished_at = CASE WHEN j.attempt - j.uncounted >= j.max_attempts OR j.expires_at <= now()
                           THEN now() END,
        run_at = now(),
        lease_lost = true,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by,
          'class', 'LeaseExpired',
          'message', format('lease expired at %s while %s held the job', j.lease_expires_at, j.locked_by))),
        locked_by = NULL, lease_expires_at = NULL
    FROM lost l
    WHERE j.id = l.id
    RETURNING j.queue, j.state
  )
  SELECT count(*), array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued')
  INTO v_rescued, v_queues
  FROM moved m;
  PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;

  WITH late AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.expires_at <= now() AND j.state IN ('enqueued', 'scheduled', 'awaiting')
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), expired AS (
    UPDATE idemq.jobs AS j
    SET state = 'expired', finished_at = now()
    FROM late l
    WHERE j.id = l.id
    RETURNING j.id
  )
  SELECT count(*) INTO v_expired FROM expired;

  RETURN v_rescued + v_expired;
END;
$$;

COMMENT ON FUNCTION idemq.rescue() IS
  'Return jobs with expired leases to enqueued (or failed on their last attempt) and expire jobs past expires_at.';

-- ---- sql/functions/retry.sql ----
-- idemq.retry(job_id bigint) RETURNS idemq.job_state
--
-- Runs a failed, cancelled or expired job again: back to `enqueued`, runnable
-- now, with fresh attempts. Returns `enqueued`.
--
-- Guarantees:
--   * Fresh attempts: the attempts spent so far stop counting against
--     max_attempts; `attempt` itself keeps growing (it is the fencing token,
--     so a worker of the old run can never complete the new one).
--   * The error history is kept. An expired job's expires_at is cleared (so
--     is any expires_at already past).
--   * A keyed job takes its key again; if another active job holds the key,
--     IQ409. Waiting workers are notified (_notify_waiting).
--   * An operator's override: a job cancelled because a parent (after) did
--     not succeed runs now, without waiting on that parent again.
-- Concurrency: row locks on the job and its key row.
-- Errors: IQ404; IQ412 the job is active or succeeded (DETAIL {"job_id","state"});
--   IQ409 its key is held by another active job (DETAIL {"key","existing_job_id",
--   "existing_state","policy"}, policy null).
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.retry(job_id bigint)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
  v_holder record;
BEGIN
  v_job := idemq._lock_job(retry.job_id, 'retry');
  IF v_job.state <> ALL (idemq._unsuccessful_states()) THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('retry: job %s is %s; only failed, cancelled or expired jobs can be retried', v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = CASE WHEN v_job.state = 'succeeded' THEN 'A succeeded job''s effect happened; enqueue new work instead.'
                  ELSE 'The job has not finished; wait for it, or cancel it first.' END;
  END IF;

  IF v_job.idempotency_key IS NOT NULL THEN
    SELECT k.job_id, k.finished_state INTO v_holder
    FROM idemq.keys k WHERE k.key = v_job.idempotency_key FOR NO KEY UPDATE;
    IF FOUND AND v_holder.job_id <> v_job.id AND v_holder.finished_state IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'IQ409',
        MESSAGE = format('retry: idempotency key "%s" of job %s is held by active job %s',
                         v_job.idempotency_key, v_job.id, v_holder.job_id),
        DETAIL = jsonb_build_object('key', v_job.idempotency_key, 'existing_job_id', v_holder.job_id,
                                    'existing_state', (SELECT j.state FROM idemq.jobs j WHERE j.id = v_holder.job_id),
                                    'policy', NULL)::text,
        HINT = format('Job %s already does this work; cancel it first to retry job %s.', v_holder.job_id, v_job.id);
    END IF;
    INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
    VALUES (v_job.idempotency_key, v_job.id, v_job.task, md5(v_job.payload::text))
    ON CONFLICT ON CONSTRAINT keys_pkey DO UPDATE
      SET job_id = EXCLUDED.job_id, task = EXCLUDED.task, payload_md5 = EXCLUDED.payload_md5,
          finished_state = NULL, finished_at = NULL;
  END IF;

  UPDATE idemq.jobs AS j
  SET state = 'enqueued', run_at = now(), finished_at = NULL, uncounted = j.attempt,
      expires_at = CASE WHEN j.state = 'expired' OR j.expires_at <= now() THEN NULL ELSE j.expires_at END
  WHERE j.id = v_job.id;
  PERFORM idemq._notify_waiting(v_job.queue);
  RETURN 'enqueued';
END;
$$;

COMMENT ON FUNCTION idemq.retry(bigint) IS
  'Run a failed, cancelled or expired job again with fresh attempts; IQ409 if its key is held by another active job.';

-- ---- sql/functions/retry_horizon.sql ----
-- idemq.retry_horizon(backoff jsonb, counted_attempts int, max_attempts int) RETURNS interval
--
-- The longest the remaining retries of a job can take: the sum of the
-- longest backoff delays after each failure still possible.
--
-- Guarantees:
--   * A delay follows every failure but the last: failures
--     max(counted_attempts, 1) .. max_attempts - 1, each delay
--     _backoff_delay(backoff, failure, draw => 1), the top of its random range
--     and capped as fail() caps it. NULL backoff is the default (polynomial).
--   * At most 36500 days (100 years): a longer horizon is reported as that.
--     A delay that stops changing (a fixed schedule's last delay, a capped
--     exponential) is multiplied out, so even max_attempts = 2^31-1 answers at once.
--   * Deterministic (draw => 1 takes no random number), hence STABLE though
--     _backoff_delay is VOLATILE for its random().
--   `idemq doctor` compares it with the key retention: a key pruned before its
--   job's last retry no longer deduplicates a replayed enqueue.
-- Concurrency: none (reads nothing).
-- Errors: 22004 NULL counted_attempts or max_attempts; 22023 a malformed backoff.
-- Tests: test/sql/retry-horizon.test.ts, test/cli/doctor.test.ts
CREATE OR REPLACE FUNCTION idemq.retry_horizon(backoff jsonb, counted_attempts int, max_attempts int)
RETURNS interval
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_cap constant numeric := 36500 * 86400::numeric; -- 100 years of 365 days, in seconds
  v_last int := max_attempts - 1;
  v_problem text := idemq._backoff_problem(backoff);
  v_total numeric := 0;
  v_delay numeric;
  v_previous numeric;
BEGIN
  IF counted_attempts IS NULL OR max_attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'retry_horizon: counted_attempts and max_attempts must not be NULL',
      HINT = 'Pass the job''s attempt - uncounted (0 before its first attempt) and its max_attempts.';
  END IF;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_horizon: %s', v_problem),
      HINT = 'Pass a job''s backoff column, or NULL for the default.';
  END IF;
  FOR v_failure IN greatest(counted_attempts, 1) .. v_last LOOP
    v_delay := extract(epoch FROM idemq._backoff_delay(backoff, v_failure, draw => 1));
    IF v_delay = v_previous THEN
      -- Constant from here on: multiply.
      v_total := v_total + v_delay * (v_last - v_failure + 1);
      EXIT;
    END IF;
    v_total := v_total + v_delay;
    v_previous := v_delay;
    -- A slowly growing exponential (factor near 1) reaches neither the cap nor
    -- a constant delay: 100,000 delays are plenty for a diagnosis.
    EXIT WHEN v_total >= v_cap OR v_failure - counted_attempts > 100000;
  END LOOP;
  RETURN make_interval(secs => least(v_total, v_cap)::float8);
END;
$$;

COMMENT ON FUNCTION idemq.retry_horizon(jsonb, int, int) IS
  'Longest time the remaining retries of a job can take (the worst-case backoff delays summed, at most 100 years).';

-- ---- sql/functions/snooze.sql ----
-- idemq.snooze(job_id bigint, attempt int, run_at timestamptz) RETURNS void
--
-- Puts a held job back to `scheduled` at run_at without spending an attempt.
--
-- Guarantees:
--   * Waiting on a rate limit or a dependency is not a failure: no error is
--     recorded and the snoozed attempt does not count against max_attempts
--     (attempt still advances on the next claim, since it is the fencing token).
--   * Fenced like complete().
--   * A run_at not in the future NOTIFYs idemq_jobs when a listener waits
--     (_notify_waiting).
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL arguments.
-- Tests: test/sql/snooze.test.ts
CREATE OR REPLACE FUNCTION idemq.snooze(job_id bigint, attempt int, run_at timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_queue text;
BEGIN
  IF snooze.run_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'snooze: run_at must not be NULL',
      HINT = 'Pass when the job should run again, e.g. now() + interval ''1 minute''.';
  END IF;
  UPDATE idemq.jobs AS j
  SET state = 'scheduled', run_at = snooze.run_at, uncounted = j.uncounted + 1,
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = snooze.job_id AND j.attempt = snooze.attempt AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.queue INTO v_queue;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(snooze.job_id, snooze.attempt, 'snooze');
  END IF;
  IF snooze.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_queue);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.snooze(bigint, int, timestamptz) IS
  'Reschedule a held job without spending an attempt (rate limits, dependencies).';

-- ---- sql/functions/stats.sql ----
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
-- Guarantees: a consistent snapshot of the jobs table (one statement).
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
  SELECT j.queue, j.task, 'oldest_runnable_seconds',
         floor(extract(epoch FROM now() - min(j.run_at)))::bigint
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

-- ---- sql/functions/stop_waiting.sql ----
-- idemq.stop_waiting(queues text[] DEFAULT NULL) RETURNS void
--
-- Ends wait_for_jobs(queues) for this session: jobs becoming runnable in those
-- queues no longer NOTIFY on its account. A worker calls it when a claim came
-- back full (a backlog: it will claim again without being told).
--
-- Guarantees: releases this session's markers for exactly these queues (NULL:
--   the all-queues marker; wait_for_jobs holds each once); markers it does not
--   hold are ignored.
-- Concurrency: advisory locks only.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.stop_waiting(queues text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_marker bigint;
BEGIN
  FOR v_marker IN SELECT m.marker FROM idemq._wait_markers(queues, 'stop_waiting') m WHERE m.held LOOP
    PERFORM pg_advisory_unlock_shared(v_marker);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.stop_waiting(text[]) IS
  'Stop waiting for jobs of these queues (see wait_for_jobs): enqueues into them no longer notify on this session''s account.';

-- ---- sql/functions/wait_for_jobs.sql ----
-- idemq.wait_for_jobs(queues text[] DEFAULT NULL) RETURNS boolean
--
-- Declares this session a listener waiting for jobs of `queues` (NULL: every
-- queue): from now on a job becoming runnable in them sends NOTIFY idemq_jobs.
-- Call it (in the session that LISTENs, or any session that lives as long)
-- when a claim came back with fewer jobs than asked for, then claim once more
-- after it returned true, then wait for a notification. Enqueues skip the
-- NOTIFY while nobody waits: that is what keeps their commits from queueing.
--
-- Guarantees:
--   * Returns true when every transaction that made a job runnable without
--     notifying (nobody was waiting then) has ended: a claim started after it
--     sees all of their jobs. From then on every such job notifies, so a
--     waiting listener misses none.
--   * Returns false while such a transaction is still open (or another session
--     is checking at that instant): call again shortly. The marker is held
--     either way, so notifications already flow.
--   * Idempotent: calling again with the same queues holds one marker per queue.
--     The marker lasts until stop_waiting() or the end of the session
--     (including a lost connection), not of the transaction.
-- Concurrency: advisory locks: markers are shared (any number of waiting
--   sessions), the barrier is only tried, never waited on.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/worker/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.wait_for_jobs(queues text[] DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_marker bigint;
BEGIN
  FOR v_marker IN SELECT m.marker FROM idemq._wait_markers(queues, 'wait_for_jobs') m WHERE NOT m.held LOOP
    PERFORM pg_advisory_lock_shared(v_marker);
  END LOOP;
  IF pg_try_advisory_lock(idemq._wait_key('')) THEN
    PERFORM pg_advisory_unlock(idemq._wait_key(''));
    RETURN true;
  END IF;
  RETURN false;
END;
$$;

COMMENT ON FUNCTION idemq.wait_for_jobs(text[]) IS
  'Wait for jobs of these queues: enqueues NOTIFY while this session waits; true once a claim would see every job that did not notify.';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._grant_roles FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- sql/functions/_backoff_delay.sql as of 0004_test_paths_in_headers
-- idemq._backoff_delay(backoff jsonb, failed_attempt int, draw float8 DEFAULT NULL) RETURNS interval
--
-- How long a job waits before its next attempt, after attempt `failed_attempt`
-- (1 for the first failure) failed: the one backoff model (fail() schedules
-- by it, retry_horizon() adds it up; the worker has no copy).
--
-- Guarantees (backoff already accepted by _backoff_problem()):
--   NULL or polynomial: (a-1)^4 + 15 + k*a seconds, k = floor(draw * 30)
--     in 0..29, 29 for draw = 1 (Hangfire/Sidekiq);
--   exponential: initial * factor^(a-1), capped at max, then scaled by
--     1 + jitter * (2 * draw - 1), a factor in [1 - jitter, 1 + jitter];
--   fixed: delays[a], the last delay repeating.
--   draw is a number in [0, 1] standing for the random part; NULL (the
--   default) draws random(); 1 gives the longest delay the kind can take.
--   Whatever the kind, the delay is at most 10^9 seconds (about 31.7 years),
--   so no attempt number (up to max_attempts = 2^31-1) and no accepted
--   specification overflows a float8, an interval or now() + the delay.
-- Concurrency: none (volatile only because of random()).
-- Errors: none for a valid backoff.
-- Tests: test/sql/backoff.test.ts, test/worker/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq._backoff_delay(backoff jsonb, failed_attempt int, draw float8 DEFAULT NULL)
RETURNS interval
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_kind text := coalesce(backoff->>'kind', 'polynomial');
  v_draw numeric := coalesce(draw, random());
  v_ceiling constant numeric := 1e9;
  v_secs numeric;
  v_initial numeric;
  v_factor numeric;
  v_cap numeric;
  v_n int;
BEGIN
  -- Seconds are computed as numeric: float8 overflows at factor^(a-1) for a
  -- few hundred attempts and cannot even read a factor like 1e400.
  IF v_kind = 'polynomial' THEN
    v_secs := power((failed_attempt - 1)::numeric, 4) + 15 + least(floor(v_draw * 30), 29) * failed_attempt;
  ELSIF v_kind = 'exponential' THEN
    v_initial := extract(epoch FROM (backoff->>'initial')::interval);
    v_factor := coalesce((backoff->>'factor')::numeric, 2);
    v_cap := least(coalesce(extract(epoch FROM (backoff->>'max')::interval), v_ceiling), v_ceiling);
    -- Compare logarithms first so factor^(a-1) is only computed when it is
    -- below cap / initial (a large attempt would overflow even numeric).
    IF (failed_attempt - 1) * ln(v_factor) < ln(v_cap / v_initial) THEN
      v_secs := least(v_initial * power(v_factor, failed_attempt - 1), v_cap);
    ELSE
      v_secs := v_cap;
    END IF;
    IF coalesce((backoff->>'jitter')::numeric, 0) > 0 THEN
      v_secs := v_secs * (1 + (backoff->>'jitter')::numeric * (2 * v_draw - 1));
    END IF;
  ELSE
    -- Kept as an interval, so "1 mon" means a calendar month from now.
    v_n := jsonb_array_length(backoff->'delays');
    RETURN least((backoff->'delays'->>(least(failed_attempt, v_n) - 1))::interval,
                 make_interval(secs => v_ceiling::float8));
  END IF;
  RETURN make_interval(secs => least(v_secs, v_ceiling)::float8);
END;
$$;

COMMENT ON FUNCTION idemq._backoff_delay(jsonb, int, float8) IS
  'Delay before the next attempt after attempt failed_attempt failed, by the job''s backoff (NULL = polynomial).';

-- sql/functions/_backoff_problem.sql as of 0004_test_paths_in_headers
-- idemq._backoff_problem(backoff jsonb) RETURNS text
--
-- Says what is wrong with a backoff specification, or NULL when it is valid.
--
-- Guarantees: a backoff accepted here never makes _backoff_delay() fail.
--   Accepted: NULL (the default, polynomial); {"kind":"polynomial"};
--   {"kind":"exponential","initial":I,"factor":F,"max":M,"jitter":J} with I a
--   positive interval (required), F a number >= 1 (default 2), M a positive
--   interval (optional), J a number in [0, 1) (default 0);
--   {"kind":"fixed","delays":[D, ...]} with at least one non-negative interval.
--   Intervals are PostgreSQL interval text ("2 seconds", "5 min", "1h").
-- Concurrency: none.
-- Errors: none (the caller raises, naming the job).
-- Tests: test/sql/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq._backoff_problem(backoff jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_field text;
  v_interval interval;
  v_allowed text[];
BEGIN
  IF backoff IS NULL OR jsonb_typeof(backoff) = 'null' THEN
    RETURN NULL;
  END IF;
  IF jsonb_typeof(backoff) <> 'object' THEN
    RETURN format('backoff must be a JSON object like {"kind":"fixed","delays":["2 seconds"]}, not %s', backoff);
  END IF;
  v_kind := backoff->>'kind';
  v_allowed := CASE v_kind
    WHEN 'polynomial' THEN ARRAY['kind']
    WHEN 'exponential' THEN ARRAY['kind', 'initial', 'factor', 'max', 'jitter']
    WHEN 'fixed' THEN ARRAY['kind', 'delays']
  END;
  IF v_allowed IS NULL THEN
    -- ::text first: a bare 'missing' would be read as jsonb and fail to parse.
    RETURN format('backoff kind must be "polynomial", "exponential" or "fixed", not %s',
                  coalesce((backoff->'kind')::text, 'missing'));
  END IF;
  SELECT k INTO v_field FROM jsonb_object_keys(backoff) k WHERE k <> ALL (v_allowed) LIMIT 1;
  IF v_field IS NOT NULL THEN
    RETURN format('backoff kind "%s" has no field "%s" (fields: %s)', v_kind, v_field, array_to_string(v_allowed, ', '));
  END IF;

  BEGIN
    IF v_kind = 'exponential' THEN
      IF jsonb_typeof(backoff->'initial') IS DISTINCT FROM 'string' THEN
        RETURN 'exponential backoff needs "initial", an interval such as "2 seconds"';
      END IF;
      v_interval := (backoff->>'initial')::interval;
      IF v_interval <= interval '0' THEN
        RETURN format('exponential backoff "initial" must be positive, not %s', backoff->'initial');
      END IF;
      IF backoff ? 'factor' AND (jsonb_typeof(backoff->'factor') <> 'number' OR (backoff->>'factor')::numeric < 1) THEN
        RETURN format('exponential backoff "factor" must be a number >= 1, not %s', backoff->'factor');
      END IF;
      IF backoff ? 'jitter' AND (jsonb_typeof(backoff->'jitter') <> 'number'
          OR (backoff->>'jitter')::numeric < 0 OR (backoff->>'jitter')::numeric >= 1) THEN
        RETURN format('exponential backoff "jitter" must be a number in [0, 1), not %s', backoff->'jitter');
      END IF;
      IF backoff ? 'max' THEN
        IF jsonb_typeof(backoff->'max') <> 'string' OR (backoff->>'max')::interval <= interval '0' THEN
          RETURN format('exponential backoff "max" must be a positive interval, not %s', backoff->'max');
        END IF;
      END IF;
    ELSIF v_kind = 'fixed' THEN
      IF jsonb_typeof(backoff->'delays') IS DISTINCT FROM 'array' OR jsonb_array_length(backoff->'delays') = 0 THEN
        RETURN 'fixed backoff needs "delays", a non-empty array of intervals such as ["2 seconds", "5 seconds"]';
      END IF;
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(backoff->'delays') d
                 WHERE jsonb_typeof(d) <> 'string' OR (d #>> '{}')::interval < interval '0') THEN
        RETURN format('fixed backoff "delays" must be non-negative intervals, not %s', backoff->'delays');
      END IF;
    END IF;
  EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
                 OR invalid_text_representation OR numeric_value_out_of_range THEN
    RETURN format('backoff %s has a value that is not an interval (%s); write intervals like "2 seconds" or "5 min"',
                  backoff, SQLERRM);
  END;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._backoff_problem(jsonb) IS
  'What is wrong with a backoff specification, or NULL when it is valid.';

-- sql/functions/_check_lease.sql as of 0004_test_paths_in_headers
-- idemq._check_lease(lease interval, operation text) RETURNS void
--
-- Rejects a lease that is NULL, not positive, or longer than a day.
--
-- Guarantees: returns only for a usable lease.
-- Concurrency: none.
-- Errors: 22004 NULL; 22023 out of range.
-- Tests: test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._check_lease(lease interval, operation text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
#variable_conflict error
BEGIN
  IF lease IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: lease must not be NULL', operation),
      HINT = 'Leave it out for the default (30 seconds), or pass an interval like ''2 minutes''.';
  END IF;
  IF lease <= interval '0' OR lease > interval '1 day' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: lease must be between 0 and 1 day, not %s', operation, lease),
      HINT = 'A lease is how long a worker may hold a job between heartbeats; use seconds to minutes.';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_lease(interval, text) IS
  'Raise unless the lease is a positive interval of at most one day.';

-- sql/functions/_lock_job.sql as of 0004_test_paths_in_headers
-- idemq._lock_job(job_id bigint, operation text) RETURNS idemq.jobs
--
-- Locks one job for an operator's operation (cancel, retry, reschedule) and
-- returns its row.
--
-- Guarantees: returns the committed row, locked until the caller's
--   transaction ends; raises rather than return nothing.
-- Concurrency: FOR NO KEY UPDATE: waits for a worker completing the job.
-- Errors: 22004 NULL job_id; IQ404 no such job.
-- Tests: test/sql/admin.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._lock_job(job_id bigint, operation text)
RETURNS idemq.jobs
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
BEGIN
  IF _lock_job.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_id must not be NULL', operation),
      HINT = 'Pass the id enqueue() returned.';
  END IF;
  SELECT j.* INTO v_job FROM idemq.jobs j WHERE j.id = _lock_job.job_id FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('%s: job %s does not exist', operation, _lock_job.job_id),
      HINT = 'Check the id (idemq jobs lists jobs); finished jobs may have been purged.';
  END IF;
  RETURN v_job;
END;
$$;

COMMENT ON FUNCTION idemq._lock_job(bigint, text) IS
  'Lock and return one job for an operator''s operation; IQ404 if it does not exist.';

-- sql/functions/_notify_waiting.sql as of 0004_test_paths_in_headers
-- idemq._notify_waiting(queue text) RETURNS void
--
-- Sends NOTIFY idemq_jobs (payload: the queue) for a job that became runnable
-- now, if a session may be waiting for it; otherwise sends nothing.
--
-- Why: PostgreSQL serialises the commits of transactions that NOTIFY (they
-- queue on one lock through their WAL flush): a NOTIFY in every enqueue halved
-- single-enqueue throughput on 10 connections. A worker with a backlog keeps
-- claiming without being told; only one that ran out of work needs the wake-up,
-- and it says so with wait_for_jobs().
--
-- Guarantees:
--   * Notifies when, at the call, a session holds the waiting marker of this
--     queue or of all queues, or is checking the barrier (wait_for_jobs).
--   * Otherwise holds the barrier (shared, until this transaction ends), so no
--     wait_for_jobs() returns true before this transaction has ended: its next
--     claim sees what this transaction committed. Nothing is lost, only the
--     NOTIFY nobody was waiting for.
-- Concurrency: advisory locks only, never waits: callers do not block each other
--   (the marker is tried exclusively and released at once; a collision of two
--   callers makes one of them notify, which is always safe).
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._notify_waiting(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_marker bigint;
BEGIN
  IF NOT pg_try_advisory_xact_lock_shared(idemq._wait_key('')) THEN
    PERFORM pg_notify('idemq_jobs', _notify_waiting.queue);
    RETURN;
  END IF;
  FOREACH v_marker IN ARRAY ARRAY[idemq._wait_key(_notify_waiting.queue), idemq._wait_key(NULL)] LOOP
    IF NOT pg_try_advisory_lock(v_marker) THEN
      PERFORM pg_notify('idemq_jobs', _notify_waiting.queue);
      RETURN;
    END IF;
    PERFORM pg_advisory_unlock(v_marker);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._notify_waiting(text) IS
  'NOTIFY idemq_jobs with the queue if a session waits for it (wait_for_jobs); else hold the barrier until commit.';

-- sql/functions/_pairs_by_id.sql as of 0004_test_paths_in_headers
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
LANGUAGE sql IMMUTABLE
AS $$
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}')
  FROM (SELECT u.id, max(u.attempt) AS attempt
        FROM unnest(job_ids, attempts) AS u(id, attempt)
        WHERE u.id IS NOT NULL
        GROUP BY u.id) t
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[]) IS
  '(job_id, attempt) pairs sorted by id, each id once with its highest attempt, for width_bucket() lookups.';

-- sql/functions/_parse_jobs.sql as of 0004_test_paths_in_headers
-- idemq._parse_jobs(jobs jsonb, at timestamptz)
--   RETURNS TABLE(ord int, task text, payload jsonb, queue text, run_at timestamptz,
--                 priority int, max_attempts int, key text,
--                 duplicate_policy idemq.duplicate_policy, backoff jsonb,
--                 expires_at timestamptz, ok boolean)
--
-- The fast path of _enqueue_rows: parses a JSON array of jobs in one pass
-- (jsonb_to_recordset, in C), fills the defaults (_job_defaults, run_at `at`),
-- and marks each element `ok` when it passes a cheap check.
--
-- Guarantees: `ok` is false or NULL for every element the validating path of
--   _enqueue_rows would refuse (unknown fields, wrong types, empty task or
--   queue, queue over 1000 characters, max_attempts < 1, empty key, `after`),
--   so the fast path refuses at least what that path refuses. A value that
--   does not parse (a bad timestamp, a priority out of range) raises a
--   data_exception, which the fast path also hands to the validating path.
--   Backoffs are not checked here (_enqueue_rows checks each distinct one).
-- Concurrency: none (reads only its argument). Inlined into the caller's plan.
-- Errors: data_exception for a value that does not parse.
-- Tests: test/sql/enqueue-many.test.ts (both paths agree)
CREATE OR REPLACE FUNCTION idemq._parse_jobs(jobs jsonb, at timestamptz)
RETURNS TABLE(ord int, task text, payload jsonb, queue text, run_at timestamptz,
              priority int, max_attempts int, key text,
              duplicate_policy idemq.duplicate_policy, backoff jsonb,
              expires_at timestamptz, ok boolean)
LANGUAGE sql STABLE
AS $$
  SELECT r.ord::int, r.task,
         coalesce(r.payload, idemq._job_defaults()->'payload'),
         coalesce(r.queue, idemq._job_defaults()->>'queue'),
         coalesce(r.run_at, at),
         coalesce(r.priority, (idemq._job_defaults()->>'priority')::int),
         coalesce(r.max_attempts, (idemq._job_defaults()->>'max_attempts')::int),
         r.idempotency_key,
         coalesce(r.duplicate_policy, (idemq._job_defaults()->>'duplicate_policy')::idemq.duplicate_policy),
         r.backoff, r.expires_at,
         (r.v - ARRAY['task', 'payload', 'queue', 'run_at', 'priority', 'max_attempts',
                      'idempotency_key', 'duplicate_policy', 'backoff', 'expires_at', 'after']) = '{}'
           AND r.task <> '' AND jsonb_typeof(r.v->'task') = 'string'
           AND (r.payload IS NULL OR jsonb_typeof(r.payload) = 'object')
           AND (r.queue IS NULL OR (jsonb_typeof(r.v->'queue') = 'string'
                                    AND r.queue <> '' AND length(r.queue) <= idemq._queue_name_limit()))
           AND (r.run_at IS NULL OR jsonb_typeof(r.v->'run_at') = 'string')
           AND (r.expires_at IS NULL OR jsonb_typeof(r.v->'expires_at') = 'string')
           AND (r.priority IS NULL OR jsonb_typeof(r.v->'priority') = 'number')
           AND (r.max_attempts IS NULL OR (jsonb_typeof(r.v->'max_attempts') = 'number'
                                           AND r.max_attempts >= 1))
           AND (r.idempotency_key IS NULL OR (jsonb_typeof(r.v->'idempotency_key') = 'string'
                                              AND r.idempotency_key <> ''))
           AND r.after IS NULL
  FROM ROWS FROM (jsonb_array_elements(jobs),
                  jsonb_to_recordset(jobs) AS (task text, payload jsonb, queue text, run_at timestamptz,
                    priority int, max_attempts int, idempotency_key text,
                    duplicate_policy idemq.duplicate_policy, backoff jsonb, expires_at timestamptz,
                    after jsonb)) WITH ORDINALITY
       AS r(v, task, payload, queue, run_at, priority, max_attempts, idempotency_key,
            duplicate_policy, backoff, expires_at, after, ord)
$$;

COMMENT ON FUNCTION idemq._parse_jobs(jsonb, timestamptz) IS
  'Fast path of enqueue_many: parse a JSON array of jobs with defaults, each marked ok when it passes a cheap check.';

-- sql/functions/_raise_not_held.sql as of 0004_test_paths_in_headers
-- idemq._raise_not_held(job_id bigint, attempt int, operation text) RETURNS void
--
-- Raises the right error after `operation` found no job `job_id` held by
-- attempt `attempt`: IQ404 when the job does not exist, IQ410 (lease lost)
-- when it does. Called by complete, fail and snooze after their fenced UPDATE
-- matched nothing, so the happy path costs no extra read.
--
-- Guarantees: always raises.
-- Concurrency: reads the job without locking it; the state named in the
--   message is the committed state at that moment.
-- Errors: IQ404; IQ410 with DETAIL {"job_id","attempt","current_attempt","current_state"}.
-- Tests: test/sql/complete.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_not_held(job_id bigint, attempt int, operation text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_job record;
BEGIN
  IF _raise_not_held.job_id IS NULL OR _raise_not_held.attempt IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_id and attempt must not be NULL', operation),
      HINT = 'Pass the id and attempt that claim() returned: together they are the fencing token.';
  END IF;
  SELECT j.state, j.attempt INTO v_job FROM idemq.jobs j WHERE j.id = _raise_not_held.job_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('%s: job %s does not exist', operation, _raise_not_held.job_id),
      HINT = 'Check the job id; finished jobs may have been purged.';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('%s: lease lost: attempt %s no longer holds job %s (it is %s, attempt %s)',
                     operation, _raise_not_held.attempt, _raise_not_held.job_id, v_job.state, v_job.attempt),
    DETAIL = jsonb_build_object('job_id', _raise_not_held.job_id, 'attempt', _raise_not_held.attempt,
                                'current_attempt', v_job.attempt, 'current_state', v_job.state)::text,
    HINT = 'Another attempt took the job over (lease expired and rescued, or cancelled): '
           'roll back this attempt''s work and stop.';
END;
$$;

COMMENT ON FUNCTION idemq._raise_not_held(bigint, int, text) IS
  'Raise IQ404 or IQ410 for a fenced call whose (job_id, attempt) matched no held job.';

-- sql/functions/_wait_markers.sql as of 0004_test_paths_in_headers
-- idemq._wait_markers(queues text[], operation text)
--   RETURNS TABLE(marker bigint, held boolean)
--
-- The waiting markers of `queues` (NULL: the all-queues marker), each once,
-- and whether this session holds it: what wait_for_jobs takes and
-- stop_waiting releases.
--
-- Guarantees: validates `queues` first; `operation` names the caller in errors.
-- Concurrency: reads this session's own locks in pg_locks.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_markers(queues text[], operation text)
RETURNS TABLE(marker bigint, held boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
BEGIN
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: queues must be NULL (all queues) or a non-empty list of queue names, not %s', operation, queues),
      HINT = 'Pass the queues you claim from, or NULL for every queue.';
  END IF;
  RETURN QUERY
  SELECT k.key, EXISTS (
           SELECT 1 FROM pg_locks l
           WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock'
             AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = k.key)
  FROM (SELECT DISTINCT idemq._wait_key(q) AS key FROM unnest(coalesce(queues, ARRAY[NULL::text])) q) k;
END;
$$;

COMMENT ON FUNCTION idemq._wait_markers(text[], text) IS
  'The waiting markers of these queues (wait_for_jobs), and whether this session holds each.';

-- sql/functions/_enqueue_rows.sql as of 0004_test_paths_in_headers
-- idemq._enqueue_rows(jobs jsonb, single boolean)
--   RETURNS TABLE(r_ordinal int, r_job_id bigint, r_outcome text,
--                 r_existing_state idemq.job_state, r_policy idemq.duplicate_policy, r_key text)
--
-- The one implementation of enqueue and enqueue_many: validates a JSON array of
-- jobs, resolves idempotency keys against the key ledger set-wise, inserts the
-- new jobs, wires continuations, counts duplicates, and notifies idle workers.
-- A batch (enqueue_many) without `after` whose keys (if any) are all new takes
-- a fast path: one statement that parses with jsonb_to_recordset and writes;
-- anything else, or any doubt, goes to the validating path, which does the
-- same in steps. The fast path runs in a subtransaction (one per call), which
-- is why enqueue() (`single`) never takes it.
--
-- Guarantees:
--   * Validation covers every element before anything is kept, so bad input
--     raises and writes nothing: the fast path's check refuses at least what
--     the validating path refuses, and a refusal (or a value that does not
--     parse, or a key that exists) rolls its block back and hands the batch
--     to the validating path, which names the first bad element. So errors and
--     outcomes do not depend on the path. `single` only changes how errors name the job.
--   * A key held by an active job yields that job (outcome `deduplicated`), or
--     `conflict` when the task or payload differ (jsonb equality: the md5 of the
--     jsonb text is only a fast path, since numbers equal as jsonb can print
--     differently, e.g. 1 and 1.0). A key whose latest job is terminal follows the
--     job's duplicate_policy: `rejected`, or a new job that takes the key over.
--   * Within one call, the first element with a key decides; later elements
--     with that key are deduplicated against the job the key then holds (or
--     `conflict`), or share the first element's rejection.
--   * N concurrent callers with one new key create exactly one job: the key
--     row's primary key serialises them (INSERT .. ON CONFLICT waits for the
--     inserter's transaction). If the inserter rolls back, a waiter inserts.
--   * Jobs with `after` parents wait in `awaiting` until every parent
--     succeeded; a parent already failed, cancelled or expired cancels them.
--   * NOTIFY idemq_jobs (payload: queue) once per queue with a job runnable now,
--     when a listener waits for it (_notify_waiting).
-- Concurrency: key rows are inserted/updated in key order (fewer deadlocks
--   between overlapping batches), on either path; the fast path's insert waits
--   for a concurrent inserter of a key like ON CONFLICT does, and when the key
--   is then taken its own key rows roll back before the validating path runs.
--   Parents named in `after` are row-locked (their has_children is set) so a
--   parent finishing concurrently cannot miss a child.
--   Under REPEATABLE READ a concurrent committed duplicate raises 40001: retry.
-- Errors: 22023/22004 for bad input (message names the element; HINT the fix),
--   e.g. a queue name over 1000 characters (it is the NOTIFY payload);
--   IQ404 for a parent job that does not exist; 40001 if keys keep changing
--   under the call (pruned and re-created repeatedly).
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/enqueue-policies.test.ts, test/sql/enqueue-concurrency.test.ts,
--   test/sql/continuations.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_rows(jobs jsonb, single boolean)
RETURNS TABLE(r_ordinal int, r_job_id bigint, r_outcome text,
              r_existing_state idemq.job_state, r_policy idemq.duplicate_policy, r_key text)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_now timestamptz := now();
  v_defaults jsonb := idemq._job_defaults();
  v_fields text[] := ARRAY['task', 'payload', 'queue', 'run_at', 'priority', 'max_attempts',
                           'idempotency_key', 'duplicate_policy', 'backoff', 'expires_at', 'after'];
  v_policies text[] := enum_range(NULL::idemq.duplicate_policy)::text[];
  v_ord int;
  v_problem text;
  v_elem jsonb;
  v_rows idemq._job_input[];
  v_round int := 0;
  -- Resolved keys: key -> [job_id, outcome, existing_state, task, payload_md5, payload]
  -- of the job the key holds after this call (payload NULL when it is terminal). A jsonb map rather than a join between two
  -- unnest() calls: the planner cannot size those, and a nested loop over
  -- 20,000 x 20,000 elements is the trap this avoids. Same for parents below.
  v_keys jsonb := '{}';
  -- Parents named in `after`: id -> state, read under a row lock.
  v_parents jsonb;
  v_missing bigint;
  -- The plan, one entry per element, aligned with v_rows (both in ordinal order):
  -- unnest(v_rows, e_job, ...) zips them, expanding the _job_input columns.
  e_job bigint[];
  e_outcome text[];
  e_existing idemq.job_state[];
  e_state idemq.job_state[];
  v_fast boolean;
BEGIN
  IF jobs IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'jobs must not be NULL',
      HINT = 'Pass a JSON array of job objects, e.g. [{"task": "send_email"}].';
  END IF;
  IF jsonb_typeof(jobs) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('jobs must be a JSON array of job objects, not %s', coalesce(jsonb_typeof(jobs), 'NULL')),
      HINT = 'Pass jsonb like [{"task": "send_email", "payload": {"to": "a@example.com"}}].';
  END IF;
  -- 0. The fast path, for batches without `after`: one statement parses the
  --    array with jsonb_to_recordset (typed, in C) and checks each element
  --    cheaply (_parse_jobs, shared by the two statements below), and writes. Its check only ever refuses more than the validating
  --    path below: any doubt (a refused element, a value that does not parse, a
  --    key that already exists) raises a data_exception, which rolls the block
  --    back (nothing written) and leaves the batch to the validating path, so
  --    errors and outcomes are the same whichever path ran.
  --    Not for enqueue() (`single`): the block is a subtransaction, and a
  --    caller enqueueing one by one in a long transaction would pile them up
  --    (past 64 they overflow every session's snapshot cache); enqueue() has
  --    fast paths of its own.
  v_fast := NOT single
    AND NOT jsonb_path_exists(jobs, 'lax $[*] ? (@.after.type() != "null")')
    -- A first key that exists (a repeated enqueue, a resubmitted batch) would
    -- make the fast path fail: one index probe saves the attempt.
    AND NOT EXISTS (SELECT 1 FROM idemq.keys k WHERE k.key = jobs->0->>'idempotency_key');
  IF v_fast AND jsonb_path_exists(jobs, 'lax $[*] ? (@.backoff.type() != "null")') THEN
    -- Backoffs are checked once per distinct value; a bad one is left to the
    -- validating path, which names the first element that has it.
    v_fast := NOT EXISTS (
      SELECT 1
      FROM (SELECT DISTINCT e.val->'backoff' AS spec FROM jsonb_array_elements(jobs) e(val)) d
      WHERE idemq._backoff_problem(d.spec) IS NOT NULL);
  END IF;
  IF v_fast THEN
    BEGIN
      IF NOT jobs @? 'lax $[*].idempotency_key ? (@.type() != "null")' THEN
        -- Without keys every element is a new job. `ok` is NULL or false for
        -- an element the validating path might refuse: then nothing is written
        -- and no row returned. The one-time filter runs the insert and the
        -- notify before the first row is returned.
        RETURN QUERY
        WITH src AS MATERIALIZED (
          SELECT p.ord, nextval('idemq.jobs_id_seq') AS id, p.task, p.payload, p.queue, p.run_at, p.priority,
                 p.max_attempts, p.key, p.duplicate_policy, p.backoff, p.expires_at, p.ok
          FROM idemq._parse_jobs(jobs, v_now) p
        ), chk AS (
          SELECT coalesce(bool_and(coalesce(s.ok, false)), false) AS ok FROM src s
        ), ins AS (
          INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                       backoff, expires_at)
          SELECT s.id, s.task, s.queue, s.payload,
                 idemq._initial_state(s.run_at),
                 s.priority, s.run_at, s.max_attempts, s.backoff, s.expires_at
          FROM src s
          WHERE (SELECT c.ok FROM chk c)
          RETURNING j.queue, j.state
        ), nt AS (
          SELECT count(idemq._notify_waiting(q.queue)) AS n
          FROM (SELECT DISTINCT i.queue FROM ins i WHERE i.state = 'enqueued') q
        )
        SELECT s.ord, s.id, 'created'::text, NULL::idemq.job_state, s.duplicate_policy, NULL::text
        FROM src s
        WHERE (SELECT c.ok FROM chk c) AND (SELECT n.n FROM nt n) >= 0
        ORDER BY s.ord;
      ELSE
        -- With keys: the first element of each key (window over key, ordinal)
        -- takes it; later ones are deduplicated against it or conflict. Every
        -- key must be new: a plain insert in key order, so a key that exists
        -- (or that a concurrent caller inserts first: the insert waits for its
        -- transaction) raises unique_violation at once, the block rolls back,
        -- and the validating path resolves the keys that exist.
        RETURN QUERY
        WITH src AS MATERIALIZED (
          SELECT p.ord, nextval('idemq.jobs_id_seq') AS id, p.task, p.payload, p.queue, p.run_at, p.priority,
                 p.max_attempts, p.key, p.duplicate_policy, p.backoff, p.expires_at, p.ok
          FROM idemq._parse_jobs(jobs, v_now) p
        ), chk AS (
          SELECT coalesce(bool_and(coalesce(s.ok, false)), false) AS ok FROM src s
        ), dec AS MATERIALIZED (
          SELECT w.*,
                 CASE WHEN w.key IS NULL OR w.id = w.lead_id THEN 'created'
                      WHEN w.task = w.lead_task AND w.payload = w.lead_payload THEN 'deduplicated'
                      ELSE 'conflict' END AS outcome
          FROM (SELECT s.*, first_value(s.id) OVER k AS lead_id, first_value(s.task) OVER k AS lead_task,
                       first_value(s.payload) OVER k AS lead_payload
                FROM src s
                WINDOW k AS (PARTITION BY s.key ORDER BY s.ord)) w
        ), k AS (
          INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
          SELECT d.key, d.id, d.task, md5(d.payload::text)
          FROM dec d
          WHERE d.key IS NOT NULL AND d.outcome = 'created' AND (SELECT c.ok FROM chk c)
          ORDER BY d.key
          RETURNING 1
        ), ins AS (
          INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                       idempotency_key, backoff, expires_at)
          SELECT d.id, d.task, d.queue, d.payload,
                 idemq._initial_state(d.run_at),
                 d.priority, d.run_at, d.max_attempts, d.key, d.backoff, d.expires_at
          FROM dec d
          WHERE d.outcome = 'created' AND (SELECT c.ok FROM chk c)
          RETURNING j.queue, j.state
        ), cnt AS (
          INSERT INTO idemq.counters AS c (task, event, n)
          SELECT d.task, d.outcome, count(*)
          FROM dec d
          WHERE d.outcome <> 'created' AND (SELECT c.ok FROM chk c)
          GROUP BY 1, 2
          RETURNING 1
        ), nt AS (
          SELECT count(idemq._notify_waiting(q.queue)) AS n
          FROM (SELECT DISTINCT i.queue FROM ins i WHERE i.state = 'enqueued') q
        )
        SELECT d.ord, CASE WHEN d.key IS NULL THEN d.id ELSE d.lead_id END, d.outcome,
               NULL::idemq.job_state, d.duplicate_policy, d.key
        FROM dec d
        WHERE (SELECT c.ok FROM chk c) AND (SELECT count(*) FROM k) >= 0
          AND (SELECT n.n FROM nt n) >= 0 AND (SELECT count(*) FROM cnt) >= 0
        ORDER BY d.ord;
      END IF;
      IF NOT FOUND AND jsonb_array_length(jobs) > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'data_exception', MESSAGE = 'enqueue fast path declined';
      END IF;
      RETURN;
    EXCEPTION WHEN data_exception OR unique_violation THEN
      NULL;  -- rolled back; the validating path below decides
    END;
  END IF;

  -- 1. Validate every element; report the first problem.
  SELECT e.ord, chk.problem INTO v_ord, v_problem
  FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(val, ord)
  CROSS JOIN LATERAL (SELECT CASE
      WHEN jsonb_typeof(e.val) <> 'object' THEN
        format('must be a JSON object, not %s', e.val)
      WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(e.val) f WHERE f <> ALL (v_fields)) THEN
        format('has an unknown field "%s" (fields: %s)',
               (SELECT f FROM jsonb_object_keys(e.val) f WHERE f <> ALL (v_fields) LIMIT 1),
               array_to_string(v_fields, ', '))
      WHEN jsonb_typeof(e.val->'task') IS DISTINCT FROM 'string' OR e.val->>'task' = '' THEN
        'task must be a non-empty string: the name of a task your workers handle'
      WHEN jsonb_typeof(e.val->'payload') NOT IN ('object', 'null') THEN
        format('payload must be a JSON object, not %s', e.val->'payload')
      WHEN jsonb_typeof(e.val->'queue') NOT IN ('string', 'null') OR e.val->>'queue' = '' THEN
        format('queue must be a non-empty string, not %s', e.val->'queue')
      WHEN length(e.val->>'queue') > idemq._queue_name_limit() THEN
        format('queue must be at most %s characters, not %s', idemq._queue_name_limit(), length(e.val->>'queue'))
      WHEN jsonb_typeof(e.val->'run_at') NOT IN ('string', 'null') THEN
        format('run_at must be a timestamp string, not %s', e.val->'run_at')
      WHEN jsonb_typeof(e.val->'expires_at') NOT IN ('string', 'null') THEN
        format('expires_at must be a timestamp string, not %s', e.val->'expires_at')
      WHEN jsonb_typeof(e.val->'priority') NOT IN ('number', 'null')
           OR (jsonb_typeof(e.val->'priority') = 'number'
               AND ((e.val->>'priority')::numeric NOT BETWEEN -2147483648 AND 2147483647
                    OR (e.val->>'priority')::numeric <> trunc((e.val->>'priority')::numeric))) THEN
        format('priority must be a whole number (higher runs first), not %s', e.val->'priority')
      WHEN jsonb_typeof(e.val->'max_attempts') NOT IN ('number', 'null')
           OR (jsonb_typeof(e.val->'max_attempts') = 'number'
               AND ((e.val->>'max_attempts')::numeric NOT BETWEEN 1 AND 2147483647
                    OR (e.val->>'max_attempts')::numeric <> trunc((e.val->>'max_attempts')::numeric))) THEN
        format('max_attempts must be a whole number >= 1, not %s', e.val->'max_attempts')
      WHEN jsonb_typeof(e.val->'idempotency_key') NOT IN ('string', 'null') OR e.val->>'idempotency_key' = '' THEN
        format('idempotency_key must be a non-empty string or null, not %s', e.val->'idempotency_key')
      WHEN jsonb_typeof(e.val->'duplicate_policy') NOT IN ('string', 'null')
           OR (jsonb_typeof(e.val->'duplicate_policy') = 'string' AND e.val->>'duplicate_policy' <> ALL (v_policies)) THEN
        format('duplicate_policy must be one of %s, not %s', array_to_string(v_policies, ', '), e.val->'duplicate_policy')
      WHEN jsonb_typeof(e.val->'after') NOT IN ('array', 'null')
           OR (jsonb_typeof(e.val->'after') = 'array' AND EXISTS (
                 SELECT 1 FROM jsonb_array_elements(e.val->'after') a
                 WHERE jsonb_typeof(a) <> 'number' OR a::numeric <= 0 OR a::numeric <> trunc(a::numeric))) THEN
        format('after must be an array of job ids, not %s', e.val->'after')
    END AS problem) chk
  WHERE chk.problem IS NOT NULL
  ORDER BY e.ord
  LIMIT 1;

  -- Backoffs are checked once per distinct value: a batch usually shares one.
  IF v_problem IS NULL THEN
    SELECT min(e.ord), b.problem INTO v_ord, v_problem
    FROM (SELECT DISTINCT e.val->'backoff' AS spec
          FROM jsonb_array_elements(jobs) e(val) WHERE jsonb_typeof(e.val->'backoff') IS DISTINCT FROM 'null'
            AND e.val ? 'backoff') d
    CROSS JOIN LATERAL (SELECT idemq._backoff_problem(d.spec) AS problem) b
    JOIN jsonb_array_elements(jobs) WITH ORDINALITY AS e(val, ord) ON e.val->'backoff' = d.spec
    WHERE b.problem IS NOT NULL
    GROUP BY b.problem
    ORDER BY 1
    LIMIT 1;
  END IF;

  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = CASE WHEN single THEN v_problem ELSE format('jobs[%s] %s', v_ord, v_problem) END,
      HINT = CASE WHEN single THEN 'Fix the argument; nothing was enqueued.'
                  ELSE format('Fix element %s (1-based) of the jobs array; nothing was enqueued.', v_ord) END;
  END IF;

  -- 2. Parse. A timestamp that does not parse fails the whole statement; then
  --    find which element it was, so the error can name it.
  BEGIN
    v_rows := ARRAY(
      SELECT ROW(
        e.ord::int,
        e.val->>'task',
        coalesce(nullif(e.val->'payload', 'null'), v_defaults->'payload'),
        CASE WHEN e.val->>'idempotency_key' IS NOT NULL
             THEN md5(coalesce(nullif(e.val->'payload', 'null'), v_defaults->'payload')::text) END,
        coalesce(e.val->>'queue', v_defaults->>'queue'),
        coalesce((e.val->>'run_at')::timestamptz, v_now),
        coalesce(e.val->>'priority', v_defaults->>'priority')::numeric::int,
        coalesce(e.val->>'max_attempts', v_defaults->>'max_attempts')::numeric::int,
        e.val->>'idempotency_key',
        coalesce(e.val->>'duplicate_policy', v_defaults->>'duplicate_policy')::idemq.duplicate_policy,
        nullif(e.val->'backoff', 'null'),
        (e.val->>'expires_at')::timestamptz,
        CASE WHEN jsonb_array_length(coalesce(nullif(e.val->'after', 'null'), '[]')) > 0
             THEN ARRAY(SELECT DISTINCT a::numeric::bigint FROM jsonb_array_elements_text(e.val->'after') a) END
      )::idemq._job_input
      FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(val, ord)
      ORDER BY e.ord);
  EXCEPTION WHEN data_exception THEN
    FOR v_ord, v_elem IN SELECT e.ord, e.val FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(val, ord) LOOP
      BEGIN
        PERFORM (v_elem->>'run_at')::timestamptz, (v_elem->>'expires_at')::timestamptz;
      EXCEPTION WHEN data_exception THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
          MESSAGE = format('%srun_at/expires_at is not a timestamp: %s',
                           CASE WHEN single THEN '' ELSE format('jobs[%s] ', v_ord) END, SQLERRM),
          HINT = 'Write timestamps as ISO 8601 with a time zone, e.g. "2026-12-01T09:00:00Z"; nothing was enqueued.';
      END;
    END LOOP;
    RAISE;
  END;

  -- 3. Resolve idempotency keys, first element per key deciding. Usually one
  --    round; another is needed only when a key row changed between statements.
  WHILE EXISTS (SELECT 1 FROM unnest(v_rows) r
                WHERE r.idempotency_key IS NOT NULL AND NOT v_keys ? r.idempotency_key) LOOP
    v_round := v_round + 1;
    IF v_round > 10 THEN
      RAISE EXCEPTION USING ERRCODE = '40001',
        MESSAGE = 'idempotency keys kept changing during enqueue (pruned and re-created concurrently)',
        HINT = 'Retry the call.';
    END IF;

    -- 3a. New keys: insert; a concurrent inserter of the same key makes us wait
    --     for its transaction, then either we insert (it rolled back) or skip.
    WITH leader AS (
      SELECT DISTINCT ON (r.idempotency_key) r.idempotency_key, r.task, r.payload_md5, r.payload
      FROM unnest(v_rows) r
      WHERE r.idempotency_key IS NOT NULL AND NOT v_keys ? r.idempotency_key
      ORDER BY r.idempotency_key, r.ordinal
    ), ins AS (
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
      SELECT l.idempotency_key, nextval('idemq.jobs_id_seq'), l.task, l.payload_md5
      FROM leader l
      ORDER BY l.idempotency_key
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.key, k.job_id, k.task, k.payload_md5
    )
    SELECT v_keys || coalesce(jsonb_object_agg(i.key,
             jsonb_build_array(i.job_id, 'created', NULL, i.task, i.payload_md5, l.payload)), '{}')
    INTO v_keys
    FROM ins i JOIN leader l ON l.idempotency_key = i.key;

    -- 3b. Keys whose latest job is terminal and whose policy allows: take them
    --     over. The row lock makes a concurrent taker wait, then see the key active.
    WITH leader AS (
      SELECT DISTINCT ON (r.idempotency_key) r.idempotency_key, r.task, r.payload_md5, r.payload, r.duplicate_policy
      FROM unnest(v_rows) r
      WHERE r.idempotency_key IS NOT NULL AND NOT v_keys ? r.idempotency_key
      ORDER BY r.idempotency_key, r.ordinal
    ), upd AS (
      UPDATE idemq.keys AS k
      SET job_id = nextval('idemq.jobs_id_seq'), task = l.task, payload_md5 = l.payload_md5,
          finished_state = NULL, finished_at = NULL, created_at = now()
      FROM leader l
      WHERE k.key = l.idempotency_key
        AND k.finished_state IS NOT NULL
        AND NOT idemq._policy_rejects(l.duplicate_policy, k.finished_state)
      RETURNING k.key, k.job_id, k.task, k.payload_md5
    )
    SELECT v_keys || coalesce(jsonb_object_agg(u.key,
             jsonb_build_array(u.job_id, 'created', NULL, u.task, u.payload_md5, l.payload)), '{}')
    INTO v_keys
    FROM upd u JOIN leader l ON l.idempotency_key = u.key;

    -- 3c. The rest: held by an active job (deduplicated, or conflict when the
    --     work differs), or refused by the policy. A key that vanished (pruned)
    --     or turned terminal in between stays unresolved for the next round.
    --     An active key's job exists (purge deletes only terminal jobs) and
    --     committed with the key row, so its payload settles jsonb equality.
    WITH leader AS (
      SELECT DISTINCT ON (r.idempotency_key) r.idempotency_key, r.task, r.payload_md5, r.payload, r.duplicate_policy
      FROM unnest(v_rows) r
      WHERE r.idempotency_key IS NOT NULL AND NOT v_keys ? r.idempotency_key
      ORDER BY r.idempotency_key, r.ordinal
    )
    SELECT v_keys || coalesce(jsonb_object_agg(k.key, jsonb_build_array(
             k.job_id,
             CASE WHEN k.finished_state IS NOT NULL THEN 'rejected'
                  WHEN k.task = l.task AND (k.payload_md5 = l.payload_md5 OR j.payload = l.payload)
                    THEN 'deduplicated'
                  ELSE 'conflict' END,
             k.finished_state, k.task, k.payload_md5, j.payload)), '{}')
    INTO v_keys
    FROM leader l
    JOIN idemq.keys k ON k.key = l.idempotency_key
    LEFT JOIN idemq.jobs j ON j.id = k.job_id AND k.finished_state IS NULL
    WHERE k.finished_state IS NULL OR idemq._policy_rejects(l.duplicate_policy, k.finished_state);
  END LOOP;

  -- 4. Parents named in `after`: lock them (in id order) so that a parent
  --    finishing concurrently sees has_children and releases its new child.
  IF EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE r.after IS NOT NULL) THEN
    SELECT coalesce(jsonb_object_agg(j.id::text, j.state), '{}') INTO v_parents
    FROM (SELECT j.id, j.state FROM idemq.jobs j
          WHERE j.id IN (SELECT a FROM unnest(v_rows) r, unnest(r.after) a)
          ORDER BY j.id
          FOR NO KEY UPDATE) j;
    SELECT a INTO v_missing
    FROM unnest(v_rows) r, unnest(r.after) a
    WHERE NOT v_parents ? a::text
    LIMIT 1;
    IF v_missing IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'IQ404',
        MESSAGE = format('parent job %s (named in after) does not exist', v_missing),
        HINT = 'Name existing job ids in after; nothing was enqueued.';
    END IF;
    UPDATE idemq.jobs AS j SET has_children = true
    WHERE j.id IN (SELECT a FROM unnest(v_rows) r, unnest(r.after) a) AND NOT j.has_children;
  END IF;

  -- 5. The plan: per element, its outcome, its job id, and the state a new job starts in.
  WITH el AS (
    SELECT r.ordinal, r.idempotency_key, r.task, r.payload_md5, r.payload, r.after, r.run_at,
           min(r.ordinal) OVER (PARTITION BY r.idempotency_key) AS leader_ordinal,
           v_keys->r.idempotency_key AS k
    FROM unnest(v_rows) r
  ), decided AS (
    SELECT el.*,
           CASE
             WHEN el.idempotency_key IS NULL THEN 'created'
             WHEN el.ordinal = el.leader_ordinal THEN el.k->>1
             WHEN el.k->>1 = 'rejected' THEN 'rejected'
             WHEN el.k->>3 = el.task AND (el.k->>4 = el.payload_md5 OR el.k->5 = el.payload) THEN 'deduplicated'
             ELSE 'conflict'
           END AS outcome
    FROM el
  )
  SELECT array_agg(CASE WHEN d.idempotency_key IS NULL THEN nextval('idemq.jobs_id_seq')
                        ELSE (d.k->>0)::bigint END ORDER BY d.ordinal),
         array_agg(d.outcome ORDER BY d.ordinal),
         array_agg(CASE WHEN d.outcome = 'rejected' THEN (d.k->>2)::idemq.job_state END ORDER BY d.ordinal),
         array_agg(CASE
                     WHEN d.after IS NOT NULL AND EXISTS (
                       SELECT 1 FROM unnest(d.after) a WHERE v_parents->>a::text <> 'succeeded') THEN 'awaiting'
                     ELSE idemq._initial_state(d.run_at)
                   END::idemq.job_state ORDER BY d.ordinal)
  INTO e_job, e_outcome, e_existing, e_state
  FROM decided d;

  -- 6. Insert the new jobs.
  INSERT INTO idemq.jobs (id, task, queue, payload, state, priority, run_at, max_attempts,
                          idempotency_key, backoff, expires_at)
  SELECT p.job_id, p.task, p.queue, p.payload, p.state, p.priority, p.run_at,
         p.max_attempts, p.idempotency_key, p.backoff, p.expires_at
  FROM unnest(v_rows, e_job, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, state)
  WHERE p.outcome = 'created';

  -- 7. Continuations: record what each awaiting job waits on; a parent that
  --    already failed, was cancelled or expired cancels its new child at once
  --    (through an UPDATE, so the key ledger and grandchildren follow).
  IF v_parents IS NOT NULL THEN
    INSERT INTO idemq.job_dependencies (parent_id, child_id)
    SELECT DISTINCT a, p.job_id
    FROM unnest(v_rows, e_job, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, state),
         unnest(p.after) a
    WHERE p.outcome = 'created' AND p.state = 'awaiting' AND v_parents->>a::text <> 'succeeded'
      AND NOT EXISTS (SELECT 1 FROM unnest(p.after) b
                      WHERE (v_parents->>b::text)::idemq.job_state = ANY (idemq._unsuccessful_states()));

    UPDATE idemq.jobs AS j
    SET state = 'cancelled', finished_at = now(),
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
          'message', format('parent job %s ended %s before this job could run', f.parent_id, f.parent_state)))
    FROM (SELECT DISTINCT ON (p.job_id) p.job_id, a AS parent_id, v_parents->>a::text AS parent_state
          FROM unnest(v_rows, e_job, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, state),
               unnest(p.after) a
          WHERE p.outcome = 'created' AND (v_parents->>a::text)::idemq.job_state = ANY (idemq._unsuccessful_states())
          ORDER BY p.job_id, a) f
    WHERE j.id = f.job_id;
  END IF;

  -- 8. Count what the database can count, and wake idle workers.
  IF EXISTS (SELECT 1 FROM unnest(e_outcome) o WHERE o <> 'created') THEN
    INSERT INTO idemq.counters (task, event, n)
    SELECT p.task, p.outcome, count(*)
    FROM unnest(v_rows, e_outcome) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 outcome)
    WHERE p.outcome <> 'created'
    GROUP BY 1, 2;
  END IF;

  PERFORM idemq._notify_waiting(q.queue)
  FROM (SELECT DISTINCT p.queue AS queue
        FROM unnest(v_rows, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 outcome, state)
        WHERE p.outcome = 'created' AND p.state = 'enqueued') q;

  RETURN QUERY
  SELECT p.ordinal, p.job_id, p.outcome, p.existing_state, p.duplicate_policy, p.idempotency_key
  FROM unnest(v_rows, e_job, e_outcome, e_existing) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, existing_state);
END;
$$;

COMMENT ON FUNCTION idemq._enqueue_rows(jsonb, boolean) IS
  'The implementation shared by enqueue and enqueue_many: validate, resolve keys, insert, notify.';

-- sql/functions/_on_job_finished.sql as of 0004_test_paths_in_headers
-- idemq._on_job_finished() RETURNS trigger
--
-- Trigger (AFTER UPDATE OF state ON idemq.jobs, for rows entering a terminal
-- state that have an idempotency key or children): keeps the key ledger and
-- continuations in step with the job, whichever function finished it.
--
-- Guarantees:
--   * The key, if it still points at this job, records its terminal state and
--     finished_at, so the duplicate policy applies from now on.
--   * Children waiting on this job (after): when it succeeded, each child whose
--     parents have all succeeded becomes runnable (enqueued, or scheduled if
--     its run_at is later) and waiting workers are notified; when it failed, was
--     cancelled or expired, its awaiting children are cancelled with the
--     reason in their errors (and theirs in turn, through this trigger).
--     Their other dependency rows stay until those parents finish; they
--     only ever release jobs still awaiting.
-- Concurrency: runs inside the finishing transaction; children are locked
--   in id order before their remaining parents are read, so two parents of one
--   child finishing at once serialise on the child and the later one sees the
--   earlier one's outcome (the child is released once, or stays cancelled).
-- Errors: none of its own.
-- Tests: test/sql/continuations.test.ts, test/sql/enqueue-policies.test.ts
CREATE OR REPLACE FUNCTION idemq._on_job_finished()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_children bigint[];
  v_queues text[];
BEGIN
  IF NEW.idempotency_key IS NOT NULL THEN
    UPDATE idemq.keys AS k
    SET finished_state = NEW.state, finished_at = NEW.finished_at
    WHERE k.key = NEW.idempotency_key AND k.job_id = NEW.id;
  END IF;

  IF NEW.has_children THEN
    WITH released AS (
      DELETE FROM idemq.job_dependencies AS d
      WHERE d.parent_id = NEW.id
      RETURNING d.child_id
    )
    SELECT array_agg(r.child_id) INTO v_children FROM released r;
    IF v_children IS NULL THEN
      RETURN NULL;
    END IF;
    -- Lock the children (in id order) before looking at what else they wait
    -- on, and look in statements of their own: each takes its snapshot after
    -- the lock, so it sees what a concurrent parent's transaction committed.
    -- Read in the statement that deletes the dependency rows, two parents
    -- succeeding at once would each still see the other's row, and neither
    -- would release the child.
    PERFORM 1 FROM idemq.jobs j
    WHERE j.id = ANY (v_children)
    ORDER BY j.id
    FOR NO KEY UPDATE;

    IF NEW.state = 'succeeded' THEN
      WITH moved AS (
        UPDATE idemq.jobs AS j
        SET state = idemq._initial_state(j.run_at)
        WHERE j.id = ANY (v_children)
          AND j.state = 'awaiting'
          AND NOT EXISTS (SELECT 1 FROM idemq.job_dependencies d WHERE d.child_id = j.id)
        RETURNING j.queue, j.state
      )
      SELECT array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued') INTO v_queues FROM moved m;
      PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;
    ELSE
      UPDATE idemq.jobs AS j
      SET state = 'cancelled', finished_at = now(),
          errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
            'message', format('parent job %s ended %s before this job could run', NEW.id, NEW.state)))
      WHERE j.id = ANY (v_children) AND j.state = 'awaiting';
    END IF;
  END IF;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._on_job_finished() IS
  'Trigger: on a job entering a terminal state, finish its key in the ledger and release or cancel its children.';

-- sql/functions/cancel.sql as of 0004_test_paths_in_headers
-- idemq.cancel(job_id bigint) RETURNS idemq.job_state
--
-- Cancels a job that has not finished. Returns its new state, `cancelled`.
--
-- Guarantees:
--   * Any active job can be cancelled. A job in processing is taken from its
--     worker: that attempt's complete/fail raise IQ410 and its heartbeat
--     reports it lost, so a transactional handler's writes roll back; its
--     errors record {"class": "Cancelled", ...} for that attempt.
--   * The key is marked finished (cancelled); awaiting children are cancelled.
-- Concurrency: row lock on the job (waits for a completing worker).
-- Errors: IQ404 no such job; IQ412 already finished (DETAIL {"job_id","state"}).
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.cancel(job_id bigint)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
BEGIN
  v_job := idemq._lock_job(cancel.job_id, 'cancel');
  IF v_job.state = ANY (idemq.terminal_states()) THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('cancel: job %s already finished (%s)', v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = 'Only scheduled, enqueued, processing or awaiting jobs can be cancelled.';
  END IF;
  -- A running attempt is cut short: its history says so, as a failure would.
  UPDATE idemq.jobs AS j
  SET state = 'cancelled', finished_at = now(), locked_by = NULL, lease_expires_at = NULL,
      errors = CASE WHEN j.state = 'processing'
                    THEN j.errors || jsonb_build_array(jsonb_build_object(
                           'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(),
                           'worker', j.locked_by, 'class', 'Cancelled',
                           'message', 'cancelled by an operator while this attempt ran'))
                    ELSE j.errors END
  WHERE j.id = v_job.id;
  RETURN 'cancelled';
END;
$$;

COMMENT ON FUNCTION idemq.cancel(bigint) IS
  'Cancel an active job (a running attempt is fenced out); IQ412 if it already finished.';

-- sql/functions/claim.sql as of 0004_test_paths_in_headers
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
--   * Never takes a job in processing: a lease that ran out is taken away
--     only by rescue().
-- Concurrency: FOR UPDATE SKIP LOCKED over the jobs_runnable partial index:
--   concurrent claimers never block each other and never get the same job.
--   Jobs locked by another transaction (being claimed, cancelled...) are
--   skipped, not waited for.
-- Errors: 22004 worker_id/batch_size NULL; 22023 empty worker_id, batch_size
--   outside 1..1000, empty queue or task name, bad lease.
-- Tests: test/sql/claim.test.ts, test/sql/claim-concurrency.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.claim(
  worker_id text,
  queues text[] DEFAULT NULL,
  batch_size int DEFAULT 1,
  lease interval DEFAULT '30 seconds',
  tasks text[] DEFAULT NULL)
RETURNS SETOF idemq.claimed_job
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_lost bigint[];
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'claim: worker_id must be a non-empty string',
      HINT = 'Name the worker, e.g. hostname:pid; it is recorded as locked_by and in the error history.';
  END IF;
  IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN batch_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('claim: batch_size must be between 1 and 1000, not %s', coalesce(batch_size::text, 'NULL')),
      HINT = 'Claim at most as many jobs as the worker can start before their leases need a heartbeat.';
  END IF;
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim: queues must be NULL (all queues) or a non-empty list of queue names, not %s', queues),
      HINT = 'Pass NULL to claim from every queue.';
  END IF;
  IF tasks IS NOT NULL AND (cardinality(tasks) = 0 OR EXISTS (
       SELECT 1 FROM unnest(tasks) t WHERE t IS NULL OR t = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim: tasks must be NULL (any task) or a non-empty list of task names, not %s', tasks),
      HINT = 'Pass the names of the tasks this worker has, or NULL to claim jobs of any task.';
  END IF;
  PERFORM idemq._check_lease(lease, 'claim');

  -- Two steps: lock the jobs (SKIP LOCKED, in claim order) into an array, then
  -- update them by primary key. One UPDATE joined to the locking subquery let
  -- the planner hash the whole jobs table for claims of a few hundred (seen in
  -- EXPLAIN: a sequential scan of every row, finished ones included, per
  -- claim); "id = ANY (array)" is an index probe per job whatever the table
  -- holds. The jobs whose previous attempt lost its lease are noted before the
  -- update resets the flag. Two static statements for the queue filter rather
  -- than "queues IS NULL OR ...": each gets a plan that walks jobs_runnable in
  -- claim order and stops at the limit. The task filter is checked on the
  -- rows the walk meets (jobs_runnable does not hold the task).
  IF queues IS NULL THEN
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
        AND (tasks IS NULL OR j.task = ANY (tasks))
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSE
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND j.run_at <= now()
        AND j.queue = ANY (queues)
        AND (j.expires_at IS NULL OR j.expires_at > now())
        AND (tasks IS NULL OR j.task = ANY (tasks))
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
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
              j.priority, j.run_at
  )
  SELECT c.id, c.task, c.queue, c.payload, c.attempt, c.max_attempts,
         c.idempotency_key, c.lease_expires_at, c.reclaimed
  FROM claimed c
  ORDER BY c.priority DESC, c.run_at, c.id;
END;
$$;

COMMENT ON FUNCTION idemq.claim(text, text[], int, interval, text[]) IS
  'Claim up to batch_size runnable jobs (priority desc, run_at, id) under a lease; FOR UPDATE SKIP LOCKED.';

-- sql/functions/complete.sql as of 0004_test_paths_in_headers
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
--   "current_attempt","current_state"}); 22004 NULL job_id/attempt.
-- Tests: test/sql/complete.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
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

-- sql/functions/complete_many.sql as of 0004_test_paths_in_headers
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

-- sql/functions/effect_claim.sql as of 0004_test_paths_in_headers
-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes')
--   RETURNS TABLE(status text, result jsonb)
--
-- The claim-first record for an effect outside the database (an email, a
-- charge, a webhook). Call it in its own transaction (autocommit) before the
-- external call, then effect_done() or effect_release().
--
-- Guarantees: status is one of
--   claimed   no record existed: this owner may make the call;
--   reclaimed an earlier claim is older than stale_after (its owner likely
--             died, perhaps after the call): check with the external system
--             first, or resend with the same idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at, re-checked after a concurrent reclaimer
--   commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner or stale_after <= 0.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes')
RETURNS TABLE(status text, result jsonb)
LANGUAGE plpgsql VOLATILE
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

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp())
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND e.claimed_at < clock_timestamp() - effect_claim.stale_after;
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

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval) IS
  'Claim-first record for an external effect: claimed | reclaimed (stale) | done (with result) | busy.';

-- sql/functions/effect_done.sql as of 0004_test_paths_in_headers
-- idemq.effect_done(key text, owner text, result jsonb) RETURNS void
--
-- Records that the claimed external effect happened, with what it returned.
--
-- Guarantees: afterwards effect_claim(key, ...) answers `done` with this
--   result, forever (until prune_keys passes its retention). Repeating the
--   call by the same owner is a no-op.
-- Concurrency: row lock on the record.
-- Errors: IQ410 the claim is not this owner's (reclaimed by another, or
--   never claimed; DETAIL {"key","owner"}); 22004 NULL key/owner; 22023 empty key/owner.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_done(key text, owner text, result jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
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
    MESSAGE = format('effect_done: the claim on effect "%s" is not held by %s', effect_done.key, effect_done.owner),
    DETAIL = jsonb_build_object('key', effect_done.key, 'owner', effect_done.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale: raise stale_after above the longest call.';
END;
$$;

COMMENT ON FUNCTION idemq.effect_done(text, text, jsonb) IS
  'Record that the claimed external effect happened (with its result); IQ410 if the claim is not this owner''s.';

-- sql/functions/effect_release.sql as of 0004_test_paths_in_headers
-- idemq.effect_release(key text, owner text) RETURNS void
--
-- Gives up a claim: the external call definitely did not happen, so a new
-- claim may make it.
--
-- Guarantees: deletes the claim record; the next effect_claim answers `claimed`.
-- Concurrency: row lock on the record.
-- Errors: IQ410 the claim is not this owner's (or does not exist; DETAIL
--   {"key","owner"}); IQ412 the effect is already done (it cannot be undone
--   by releasing; DETAIL {"key","status"}); 22004 NULL key/owner; 22023 empty key/owner.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_release(key text, owner text)
RETURNS void
LANGUAGE plpgsql VOLATILE
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
  DELETE FROM idemq.effects AS e
  WHERE e.key = effect_release.key AND e.owner = effect_release.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM idemq.effects e WHERE e.key = effect_release.key AND e.status = 'done') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('effect_release: effect "%s" is already done and cannot be released', effect_release.key),
      DETAIL = jsonb_build_object('key', effect_release.key, 'status', 'done')::text,
      HINT = 'A done effect happened; do not retry it.';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('effect_release: the claim on effect "%s" is not held by %s', effect_release.key, effect_release.owner),
    DETAIL = jsonb_build_object('key', effect_release.key, 'owner', effect_release.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale; leave it to them.';
END;
$$;

COMMENT ON FUNCTION idemq.effect_release(text, text) IS
  'Give up a claim whose external call did not happen; IQ410 if not this owner''s.';

-- sql/functions/enqueue.sql as of 0004_test_paths_in_headers
-- idemq.enqueue(task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
--   run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, max_attempts int DEFAULT 10,
--   idempotency_key text DEFAULT NULL,
--   duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
--   backoff jsonb DEFAULT NULL, expires_at timestamptz DEFAULT NULL, after bigint[] DEFAULT NULL)
--   RETURNS TABLE(job_id bigint, deduplicated boolean)
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
--   * expires_at may already be past: the job is never claimed, and rescue()
--     marks it expired.
-- Concurrency: N concurrent calls with one key create exactly one job and all
--   get its id; if the first inserter rolls back, a waiter creates it (the key
--   row's primary key serialises them; see _enqueue_rows).
-- Errors: 22004 a required argument is NULL; 22023 bad argument (empty task,
--   payload not an object, max_attempts < 1, malformed backoff, a queue name
--   over 1000 characters...);
--   IQ409 the policy rejects (DETAIL {"key","existing_job_id","existing_state","policy"});
--   IQ422 the key is held by an active job for a different task or payload
--   (DETAIL {"key","existing_job_id"}); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts, test/sql/continuations.test.ts,
--   test/sql/bad-input.test.ts
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
  after bigint[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, deduplicated boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_null text;
  v_result record;
  v_state idemq.job_state;
  v_id bigint;
BEGIN
  v_null := CASE
    WHEN enqueue.task IS NULL THEN 'task'
    WHEN enqueue.payload IS NULL THEN 'payload'
    WHEN enqueue.queue IS NULL THEN 'queue'
    WHEN enqueue.priority IS NULL THEN 'priority'
    WHEN enqueue.max_attempts IS NULL THEN 'max_attempts'
    WHEN enqueue.duplicate_policy IS NULL THEN 'duplicate_policy'
  END;
  IF v_null IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('enqueue: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
  END IF;
  IF jsonb_typeof(enqueue.payload) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('enqueue: payload must be a JSON object, not %s', enqueue.payload),
      HINT = 'Wrap the value in an object, e.g. {"value": ...}.';
  END IF;

  -- The common cases are one or two INSERTs: no key, or a key nobody holds,
  -- without parents and with valid arguments. The shared bulk path costs about
  -- 0.5 ms per call in JSON round trips. Everything else, including every
  -- argument the bulk path would reject and every key already in the ledger,
  -- goes there, so errors and outcomes read the same whichever path a call takes.
  IF enqueue.after IS NULL AND coalesce(enqueue.idempotency_key <> '', true)
     AND enqueue.task <> '' AND enqueue.queue <> '' AND length(enqueue.queue) <= idemq._queue_name_limit()
     AND enqueue.max_attempts >= 1
     AND (enqueue.backoff IS NULL OR idemq._backoff_problem(enqueue.backoff) IS NULL) THEN
    IF enqueue.idempotency_key IS NOT NULL THEN
      -- A new key: the key row's primary key serialises concurrent callers
      -- (ON CONFLICT waits for an inserter's transaction); a key that exists
      -- (or a concurrent inserter that committed) is left to the shared path.
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
      VALUES (enqueue.idempotency_key, nextval('idemq.jobs_id_seq'), enqueue.task, md5(enqueue.payload::text))
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.job_id INTO v_id;
    END IF;
    IF enqueue.idempotency_key IS NULL OR v_id IS NOT NULL THEN
      v_state := idemq._initial_state(enqueue.run_at);
      INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                   idempotency_key, backoff, expires_at)
      VALUES (coalesce(v_id, nextval('idemq.jobs_id_seq')), enqueue.task, enqueue.queue, enqueue.payload,
              v_state, enqueue.priority, coalesce(enqueue.run_at, now()), enqueue.max_attempts,
              enqueue.idempotency_key, nullif(enqueue.backoff, 'null'), enqueue.expires_at)
      RETURNING j.id INTO job_id;
      IF v_state = 'enqueued' THEN
        PERFORM idemq._notify_waiting(enqueue.queue);
      END IF;
      deduplicated := false;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;

  SELECT r.r_job_id, r.r_outcome, r.r_existing_state, r.r_policy INTO v_result
  FROM idemq._enqueue_rows(jsonb_build_array(jsonb_build_object(
         'task', enqueue.task, 'payload', enqueue.payload, 'queue', enqueue.queue,
         'run_at', enqueue.run_at, 'priority', enqueue.priority,
         'max_attempts', enqueue.max_attempts, 'idempotency_key', enqueue.idempotency_key,
         'duplicate_policy', enqueue.duplicate_policy, 'backoff', enqueue.backoff,
         'expires_at', enqueue.expires_at, 'after', enqueue.after)), true) r;

  IF v_result.r_outcome = 'rejected' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ409',
      MESSAGE = format('idempotency key "%s" was used by job %s, which %s; duplicate_policy %s rejects a new job',
                       enqueue.idempotency_key, v_result.r_job_id, v_result.r_existing_state, v_result.r_policy),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_result.r_job_id,
                                  'existing_state', v_result.r_existing_state, 'policy', v_result.r_policy)::text,
      HINT = format('Read job %s for its outcome; to run the work again, enqueue with a policy that allows it '
                    '(allow_after_failed) or retry job %s.', v_result.r_job_id, v_result.r_job_id);
  ELSIF v_result.r_outcome = 'conflict' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ422',
      MESSAGE = format('idempotency key "%s" is held by active job %s for different work (task or payload differ)',
                       enqueue.idempotency_key, v_result.r_job_id),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_result.r_job_id)::text,
      HINT = 'A key must name one piece of work: derive it from the task and the payload''s identity, '
             'or wait until the existing job finishes.';
  END IF;

  job_id := v_result.r_job_id;
  deduplicated := v_result.r_outcome = 'deduplicated';
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue(text, jsonb, text, timestamptz, int, int, text, idemq.duplicate_policy, jsonb, timestamptz, bigint[]) IS
  'Add a job, or return the active job holding its idempotency key; the duplicate policy decides after a terminal job.';

-- sql/functions/enqueue_many.sql as of 0004_test_paths_in_headers
-- idemq.enqueue_many(jobs jsonb) RETURNS TABLE(ordinal int, job_id bigint, outcome text)
--
-- Adds many jobs in one statement: the fast path. `jobs` is a JSON array of
-- objects with enqueue()'s fields (task required; payload, queue, run_at,
-- priority, max_attempts, idempotency_key, duplicate_policy, backoff,
-- expires_at, after optional, with enqueue()'s defaults).
--
-- Guarantees:
--   * One row per element, in order (`ordinal` is 1-based). outcome:
--     `created`; `deduplicated` (job_id: the active job holding the key);
--     `rejected` (the policy refused; job_id: the key's latest job);
--     `conflict` (the key is held by an active job for different work; job_id: that job).
--     Rejections and conflicts do not raise, and are counted in stats().
--   * Within one call the first element with a key decides; later elements
--     with the same key are deduplicated against the job the key then holds
--     (or `conflict`), or share the first element's rejection.
--   * All elements are validated before anything is written: one bad element
--     raises and nothing is enqueued.
--   * Set-based: a constant number of statements whatever the batch size.
-- Concurrency: as enqueue(); keys are taken in key order.
-- Errors: 22004 jobs is NULL; 22023 jobs is not an array, or an element is malformed (the message
--   names the element as jobs[N]); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue-many.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.enqueue_many(jobs jsonb)
RETURNS TABLE(ordinal int, job_id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT r.r_ordinal, r.r_job_id, r.r_outcome
  FROM idemq._enqueue_rows(enqueue_many.jobs, false) r;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue_many(jsonb) IS
  'Add many jobs in one call; returns (ordinal, job_id, outcome) per element, never raising for duplicates.';

-- sql/functions/fail.sql as of 0004_test_paths_in_headers
-- idemq.fail(job_id bigint, attempt int, error jsonb, retryable boolean DEFAULT true,
--   retry_at timestamptz DEFAULT NULL, backoff jsonb DEFAULT NULL,
--   max_attempts int DEFAULT NULL) RETURNS TABLE(state idemq.job_state, run_at timestamptz)
--
-- Records a failed attempt; schedules a retry or fails the job for good.
-- Returns one row: the job's new state and the run_at of its retry (NULL
-- when it failed), exactly as stored.
--
-- Guarantees:
--   * Appends to errors one entry: the fields of `error` (by convention
--     class and message; a JSON string is taken as the message, with
--     class "Error"), with
--     attempt, started_at (the claim), failed_at and worker set by fail()
--     over any fields of the same names.
--   * The job goes to `scheduled` at retry_at, or after the job's backoff
--     (_backoff_delay with the number of counted attempts so far, 1 for the
--     first failure); or to `failed` when the error is not retryable or the
--     counted attempts reached max_attempts. Snoozes do not count.
--   * backoff and max_attempts override the job's for this decision (a
--     worker's task settings): the delay is _backoff_delay(backoff, counted
--     attempts) on the database clock, and the job fails once the counted
--     attempts reach the lower of the two limits.
--   * A retry already due (retry_at not in the future) NOTIFYs idemq_jobs
--     when a listener waits (_notify_waiting).
--   * Fenced like complete(): a stale attempt changes nothing.
--   * The returned run_at is the one source of the retry time: a worker reports
--     it instead of computing the backoff again.
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id/attempt/error/retryable;
--   22023 error is not a JSON object or string, a malformed backoff,
--   max_attempts < 1.
-- Tests: test/sql/fail.test.ts, test/sql/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq.fail(
  job_id bigint,
  attempt int,
  error jsonb,
  retryable boolean DEFAULT true,
  retry_at timestamptz DEFAULT NULL,
  backoff jsonb DEFAULT NULL,
  max_attempts int DEFAULT NULL)
RETURNS TABLE(state idemq.job_state, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
-- No "#variable_conflict error" line: the parameter named "error" (fixed by
-- the contract) would be read there as the variable; nor SET
-- plpgsql.variable_conflict, which only a superuser may set (it kept anyone
-- else from installing idemq). Every name in the body is qualified, so it
-- means the same under any setting (the default is error).
AS $$
DECLARE
  v_error jsonb;
  v_job record;
  v_state idemq.job_state;
  v_due record;
  v_problem text;
BEGIN
  IF fail.error IS NULL OR fail.retryable IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'fail: error and retryable must not be NULL',
      HINT = 'Pass the error as {"class": "TimeoutError", "message": "..."}.';
  END IF;
  v_error := CASE jsonb_typeof(fail.error)
    WHEN 'object' THEN fail.error
    WHEN 'string' THEN jsonb_build_object('class', 'Error', 'message', fail.error #>> '{}')
  END;
  IF v_error IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: error must be a JSON object or string, not %s', fail.error),
      HINT = 'Pass {"class": "TimeoutError", "message": "...", "stack": "..."}.';
  END IF;
  v_problem := idemq._backoff_problem(fail.backoff);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: %s', v_problem),
      HINT = 'Pass NULL to use the job''s own backoff.';
  END IF;
  IF fail.max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: max_attempts must be NULL or >= 1, not %s', fail.max_attempts),
      HINT = 'Pass NULL to use the job''s own max_attempts.';
  END IF;

  SELECT j.attempt, j.uncounted, j.max_attempts, j.backoff INTO v_job
  FROM idemq.jobs j
  WHERE j.id = fail.job_id AND j.attempt = fail.attempt AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(fail.job_id, fail.attempt, 'fail');
  END IF;
  v_state := CASE WHEN NOT fail.retryable
                    OR v_job.attempt - v_job.uncounted >= least(v_job.max_attempts, fail.max_attempts)
                  THEN 'failed' ELSE 'scheduled' END;

  UPDATE idemq.jobs AS j
  SET state = v_state,
      run_at = CASE WHEN v_state = 'scheduled'
                    THEN coalesce(fail.retry_at, now() + idemq._backoff_delay(coalesce(nullif(fail.backoff, 'null'), v_job.backoff),
                                                                  v_job.attempt - v_job.uncounted))
                    ELSE j.run_at END,
      finished_at = CASE WHEN v_state = 'failed' THEN now() END,
      errors = j.errors || jsonb_build_array(v_error || jsonb_build_object(
        'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by)),
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = fail.job_id
  RETURNING j.run_at, j.queue INTO v_due;
  -- A retry due at once (retry_at in the past, a zero delay) must not wait
  -- for a worker's fallback poll.
  IF v_state = 'scheduled' AND v_due.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_due.queue);
  END IF;
  state := v_state;
  run_at := CASE WHEN v_state = 'scheduled' THEN v_due.run_at END;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int) IS
  'Record a failed attempt; scheduled for a retry by backoff (or retry_at), or failed when not retryable or out of attempts.';

-- sql/functions/guard.sql as of 0004_test_paths_in_headers
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
-- Errors: 22004 NULL key; 22023 empty key or empty task (NULL task is fine).
-- Tests: test/sql/guard.test.ts, test/sql/stats.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.guard(key text, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
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

-- sql/functions/heartbeat.sql as of 0004_test_paths_in_headers
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

-- sql/functions/prune_keys.sql as of 0004_test_paths_in_headers
-- idemq.prune_keys(older_than interval DEFAULT '14 days') RETURNS int
--
-- Releases idempotency keys whose latest job finished more than older_than
-- ago, and guard rows (guard) and finished effect records (effect_claim)
-- older than that. Returns how many keys it released.
--
-- Guarantees:
--   * The only way a key is released: a key whose job is active is never
--     pruned, and purge() never releases keys. Keep older_than longer than
--     any retry or replay horizon: a delivery after its key is pruned runs again.
--   * Claim records still `claimed` are never pruned (their effect may be in flight).
--   * Folds the append-only event counters (stats() sums are unchanged).
-- Concurrency: SKIP LOCKED on key rows; an enqueue taking a key over holds it
--   and keeps it.
-- Errors: 22004 NULL; 22023 negative older_than.
-- Tests: test/sql/retention.test.ts
CREATE OR REPLACE FUNCTION idemq.prune_keys(older_than interval DEFAULT '14 days')
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  IF older_than IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'prune_keys: older_than must not be NULL',
      HINT = 'Leave it out for the default key retention (14 days).';
  END IF;
  IF older_than < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('prune_keys: older_than must not be negative, not %s', older_than),
      HINT = 'older_than is the key retention, e.g. ''14 days''.';
  END IF;

  WITH doomed AS MATERIALIZED (
    SELECT k.key FROM idemq.keys k
    WHERE k.finished_at < now() - older_than
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM idemq.keys AS k USING doomed d WHERE k.key = d.key RETURNING k.key
  )
  SELECT count(*) INTO v_count FROM gone;

  DELETE FROM idemq.processed AS p WHERE p.created_at < now() - older_than;

  -- Fold the append-only event counters into one row per (task, event). Rows
  -- another transaction inserts meanwhile are not seen and stay for next time.
  WITH folded AS (
    DELETE FROM idemq.counters AS c RETURNING c.task, c.event, c.n
  )
  INSERT INTO idemq.counters (task, event, n)
  SELECT f.task, f.event, sum(f.n) FROM folded f GROUP BY f.task, f.event;
  DELETE FROM idemq.effects AS e WHERE e.status = 'done' AND e.done_at < now() - older_than;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq.prune_keys(interval) IS
  'Release keys (and guard rows, done effect records) finished more than older_than ago; default 14 days.';

-- sql/functions/purge.sql as of 0004_test_paths_in_headers
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
-- Errors: 22004 NULL argument; 22023 negative older_than, an active state in states.
-- Tests: test/sql/retention.test.ts
CREATE OR REPLACE FUNCTION idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states())
RETURNS int
LANGUAGE plpgsql VOLATILE
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
  IF NOT states <@ idemq.terminal_states() OR array_position(states, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: states must be terminal (%s), not %s', idemq.terminal_states(), states),
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

-- sql/functions/reschedule.sql as of 0004_test_paths_in_headers
-- idemq.reschedule(job_id bigint, run_at timestamptz) RETURNS idemq.job_state
--
-- Moves a job that waits to run to another time. Returns its new state:
-- `scheduled` (run_at in the future), `enqueued` (now or past), or `awaiting`
-- (unchanged: it also waits for its parents; run_at applies once they succeed).
--
-- Guarantees: attempts, errors and key are untouched.
-- Concurrency: row lock on the job.
-- Errors: IQ404; IQ412 the job is processing or finished (DETAIL {"job_id","state"});
--   22004 NULL run_at.
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.reschedule(job_id bigint, run_at timestamptz)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
  v_state idemq.job_state;
BEGIN
  IF reschedule.run_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'reschedule: run_at must not be NULL',
      HINT = 'Pass when the job should run, e.g. now() + interval ''1 hour''.';
  END IF;
  v_job := idemq._lock_job(reschedule.job_id, 'reschedule');
  IF v_job.state NOT IN ('scheduled', 'enqueued', 'awaiting') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('reschedule: job %s is %s; only scheduled, enqueued or awaiting jobs can be rescheduled',
                       v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = CASE WHEN v_job.state = 'processing' THEN 'A worker is running it; wait, or cancel it.'
                  ELSE 'It finished; use retry to run it again.' END;
  END IF;
  v_state := CASE WHEN v_job.state = 'awaiting' THEN 'awaiting'
                  ELSE idemq._initial_state(reschedule.run_at) END;
  UPDATE idemq.jobs AS j SET run_at = reschedule.run_at, state = v_state WHERE j.id = v_job.id;
  IF v_state = 'enqueued' THEN
    PERFORM idemq._notify_waiting(v_job.queue);
  END IF;
  RETURN v_state;
END;
$$;

COMMENT ON FUNCTION idemq.reschedule(bigint, timestamptz) IS
  'Move a waiting job to another run_at; IQ412 if it is processing or finished.';

-- sql/functions/rescue.sql as of 0004_test_paths_in_headers
-- idemq.rescue() RETURNS int
--
-- Takes jobs away from workers whose lease ran out, and expires jobs past
-- their deadline. Returns how many jobs it changed.
--
-- Guarantees:
--   * A job in processing whose lease_expires_at has passed (a crashed or
--     partitioned worker) goes back to enqueued, runnable now, or to failed
--     when that was its last counted attempt, or to expired when it is past
--     its expires_at (it could never be claimed again). Its errors record
--     {"class": "LeaseExpired", "message": "lease expired", ...}, and the next
--     claim reports reclaimed = true. The old attempt is fenced out from then on.
--   * Every active job that is not processing and is past its expires_at
--     (never started, or a retry waiting past its deadline) becomes expired.
--   * Each job changed counts once in the result.
--   * Idempotent: any number of workers, or pg_cron, may call it at any time;
--     no leader is needed. Waiting workers are notified (_notify_waiting)
--     of jobs it put back to enqueued.
-- Concurrency: FOR UPDATE SKIP LOCKED: rows another transaction holds (a
--   completing worker, a concurrent rescue) are left for the next call.
-- Errors: none.
-- Tests: test/sql/rescue.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.rescue()
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_rescued int;
  v_expired int;
  v_queues text[];
BEGIN
  WITH lost AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.state = 'processing' AND j.lease_expires_at < now()
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), moved AS (
    UPDATE idemq.jobs AS j
    -- Straight to expired rather than enqueued-then-expired below, so the
    -- job counts once and no worker is woken for it.
    SET state = CASE WHEN j.attempt - j.uncounted >= j.max_attempts THEN 'failed'
                     WHEN j.expires_at <= now() THEN 'expired'
                     ELSE 'enqueued' END::idemq.job_state,
        finished_at = CASE WHEN j.attempt - j.uncounted >= j.max_attempts OR j.expires_at <= now()
                           THEN now() END,
        run_at = now(),
        lease_lost = true,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by,
          'class', 'LeaseExpired',
          'message', format('lease expired at %s while %s held the job', j.lease_expires_at, j.locked_by))),
        locked_by = NULL, lease_expires_at = NULL
    FROM lost l
    WHERE j.id = l.id
    RETURNING j.queue, j.state
  )
  SELECT count(*), array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued')
  INTO v_rescued, v_queues
  FROM moved m;
  PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;

  WITH late AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.expires_at <= now() AND j.state IN ('enqueued', 'scheduled', 'awaiting')
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), expired AS (
    UPDATE idemq.jobs AS j
    SET state = 'expired', finished_at = now()
    FROM late l
    WHERE j.id = l.id
    RETURNING j.id
  )
  SELECT count(*) INTO v_expired FROM expired;

  RETURN v_rescued + v_expired;
END;
$$;

COMMENT ON FUNCTION idemq.rescue() IS
  'Return jobs with expired leases to enqueued (or failed on their last attempt) and expire jobs past expires_at.';

-- sql/functions/retry.sql as of 0004_test_paths_in_headers
-- idemq.retry(job_id bigint) RETURNS idemq.job_state
--
-- Runs a failed, cancelled or expired job again: back to `enqueued`, runnable
-- now, with fresh attempts. Returns `enqueued`.
--
-- Guarantees:
--   * Fresh attempts: the attempts spent so far stop counting against
--     max_attempts; `attempt` itself keeps growing (it is the fencing token,
--     so a worker of the old run can never complete the new one).
--   * The error history is kept. An expired job's expires_at is cleared (so
--     is any expires_at already past).
--   * A keyed job takes its key again; if another active job holds the key,
--     IQ409. Waiting workers are notified (_notify_waiting).
--   * An operator's override: a job cancelled because a parent (after) did
--     not succeed runs now, without waiting on that parent again.
-- Concurrency: row locks on the job and its key row.
-- Errors: IQ404; IQ412 the job is active or succeeded (DETAIL {"job_id","state"});
--   IQ409 its key is held by another active job (DETAIL {"key","existing_job_id",
--   "existing_state","policy"}, policy null).
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.retry(job_id bigint)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
  v_holder record;
BEGIN
  v_job := idemq._lock_job(retry.job_id, 'retry');
  IF v_job.state <> ALL (idemq._unsuccessful_states()) THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('retry: job %s is %s; only failed, cancelled or expired jobs can be retried', v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = CASE WHEN v_job.state = 'succeeded' THEN 'A succeeded job''s effect happened; enqueue new work instead.'
                  ELSE 'The job has not finished; wait for it, or cancel it first.' END;
  END IF;

  IF v_job.idempotency_key IS NOT NULL THEN
    SELECT k.job_id, k.finished_state INTO v_holder
    FROM idemq.keys k WHERE k.key = v_job.idempotency_key FOR NO KEY UPDATE;
    IF FOUND AND v_holder.job_id <> v_job.id AND v_holder.finished_state IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'IQ409',
        MESSAGE = format('retry: idempotency key "%s" of job %s is held by active job %s',
                         v_job.idempotency_key, v_job.id, v_holder.job_id),
        DETAIL = jsonb_build_object('key', v_job.idempotency_key, 'existing_job_id', v_holder.job_id,
                                    'existing_state', (SELECT j.state FROM idemq.jobs j WHERE j.id = v_holder.job_id),
                                    'policy', NULL)::text,
        HINT = format('Job %s already does this work; cancel it first to retry job %s.', v_holder.job_id, v_job.id);
    END IF;
    INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
    VALUES (v_job.idempotency_key, v_job.id, v_job.task, md5(v_job.payload::text))
    ON CONFLICT ON CONSTRAINT keys_pkey DO UPDATE
      SET job_id = EXCLUDED.job_id, task = EXCLUDED.task, payload_md5 = EXCLUDED.payload_md5,
          finished_state = NULL, finished_at = NULL;
  END IF;

  UPDATE idemq.jobs AS j
  SET state = 'enqueued', run_at = now(), finished_at = NULL, uncounted = j.attempt,
      expires_at = CASE WHEN j.state = 'expired' OR j.expires_at <= now() THEN NULL ELSE j.expires_at END
  WHERE j.id = v_job.id;
  PERFORM idemq._notify_waiting(v_job.queue);
  RETURN 'enqueued';
END;
$$;

COMMENT ON FUNCTION idemq.retry(bigint) IS
  'Run a failed, cancelled or expired job again with fresh attempts; IQ409 if its key is held by another active job.';

-- sql/functions/retry_horizon.sql as of 0004_test_paths_in_headers
-- idemq.retry_horizon(backoff jsonb, counted_attempts int, max_attempts int) RETURNS interval
--
-- The longest the remaining retries of a job can take: the sum of the
-- longest backoff delays after each failure still possible.
--
-- Guarantees:
--   * A delay follows every failure but the last: failures
--     max(counted_attempts, 1) .. max_attempts - 1, each delay
--     _backoff_delay(backoff, failure, draw => 1), the top of its random range
--     and capped as fail() caps it. NULL backoff is the default (polynomial).
--   * At most 36500 days (100 years): a longer horizon is reported as that.
--     A delay that stops changing (a fixed schedule's last delay, a capped
--     exponential) is multiplied out, so even max_attempts = 2^31-1 answers at once.
--   * Deterministic (draw => 1 takes no random number), hence STABLE though
--     _backoff_delay is VOLATILE for its random().
--   `idemq doctor` compares it with the key retention: a key pruned before its
--   job's last retry no longer deduplicates a replayed enqueue.
-- Concurrency: none (reads nothing).
-- Errors: 22004 NULL counted_attempts or max_attempts; 22023 a malformed backoff.
-- Tests: test/sql/retry-horizon.test.ts, test/cli/doctor.test.ts
CREATE OR REPLACE FUNCTION idemq.retry_horizon(backoff jsonb, counted_attempts int, max_attempts int)
RETURNS interval
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict error
DECLARE
  v_cap constant numeric := 36500 * 86400::numeric; -- 100 years of 365 days, in seconds
  v_last int := max_attempts - 1;
  v_problem text := idemq._backoff_problem(backoff);
  v_total numeric := 0;
  v_delay numeric;
  v_previous numeric;
BEGIN
  IF counted_attempts IS NULL OR max_attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'retry_horizon: counted_attempts and max_attempts must not be NULL',
      HINT = 'Pass the job''s attempt - uncounted (0 before its first attempt) and its max_attempts.';
  END IF;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_horizon: %s', v_problem),
      HINT = 'Pass a job''s backoff column, or NULL for the default.';
  END IF;
  FOR v_failure IN greatest(counted_attempts, 1) .. v_last LOOP
    v_delay := extract(epoch FROM idemq._backoff_delay(backoff, v_failure, draw => 1));
    IF v_delay = v_previous THEN
      -- Constant from here on: multiply.
      v_total := v_total + v_delay * (v_last - v_failure + 1);
      EXIT;
    END IF;
    v_total := v_total + v_delay;
    v_previous := v_delay;
    -- A slowly growing exponential (factor near 1) reaches neither the cap nor
    -- a constant delay: 100,000 delays are plenty for a diagnosis.
    EXIT WHEN v_total >= v_cap OR v_failure - counted_attempts > 100000;
  END LOOP;
  RETURN make_interval(secs => least(v_total, v_cap)::float8);
END;
$$;

COMMENT ON FUNCTION idemq.retry_horizon(jsonb, int, int) IS
  'Longest time the remaining retries of a job can take (the worst-case backoff delays summed, at most 100 years).';

-- sql/functions/snooze.sql as of 0004_test_paths_in_headers
-- idemq.snooze(job_id bigint, attempt int, run_at timestamptz) RETURNS void
--
-- Puts a held job back to `scheduled` at run_at without spending an attempt.
--
-- Guarantees:
--   * Waiting on a rate limit or a dependency is not a failure: no error is
--     recorded and the snoozed attempt does not count against max_attempts
--     (attempt still advances on the next claim, since it is the fencing token).
--   * Fenced like complete().
--   * A run_at not in the future NOTIFYs idemq_jobs when a listener waits
--     (_notify_waiting).
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL arguments.
-- Tests: test/sql/snooze.test.ts
CREATE OR REPLACE FUNCTION idemq.snooze(job_id bigint, attempt int, run_at timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_queue text;
BEGIN
  IF snooze.run_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'snooze: run_at must not be NULL',
      HINT = 'Pass when the job should run again, e.g. now() + interval ''1 minute''.';
  END IF;
  UPDATE idemq.jobs AS j
  SET state = 'scheduled', run_at = snooze.run_at, uncounted = j.uncounted + 1,
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = snooze.job_id AND j.attempt = snooze.attempt AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.queue INTO v_queue;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(snooze.job_id, snooze.attempt, 'snooze');
  END IF;
  IF snooze.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_queue);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.snooze(bigint, int, timestamptz) IS
  'Reschedule a held job without spending an attempt (rate limits, dependencies).';

-- sql/functions/stats.sql as of 0004_test_paths_in_headers
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
-- Guarantees: a consistent snapshot of the jobs table (one statement).
-- Concurrency: plain reads; no locks beyond the snapshot.
-- Errors: none.
-- Tests: test/sql/stats.test.ts, test/contract/examples.test.ts
CREATE OR REPLACE FUNCTION idemq.stats()
RETURNS TABLE(queue text, task text, metric text, value bigint)
LANGUAGE plpgsql STABLE
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
  SELECT j.queue, j.task, 'oldest_runnable_seconds',
         floor(extract(epoch FROM now() - min(j.run_at)))::bigint
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

-- sql/functions/stop_waiting.sql as of 0004_test_paths_in_headers
-- idemq.stop_waiting(queues text[] DEFAULT NULL) RETURNS void
--
-- Ends wait_for_jobs(queues) for this session: jobs becoming runnable in those
-- queues no longer NOTIFY on its account. A worker calls it when a claim came
-- back full (a backlog: it will claim again without being told).
--
-- Guarantees: releases this session's markers for exactly these queues (NULL:
--   the all-queues marker; wait_for_jobs holds each once); markers it does not
--   hold are ignored.
-- Concurrency: advisory locks only.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.stop_waiting(queues text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_marker bigint;
BEGIN
  FOR v_marker IN SELECT m.marker FROM idemq._wait_markers(queues, 'stop_waiting') m WHERE m.held LOOP
    PERFORM pg_advisory_unlock_shared(v_marker);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.stop_waiting(text[]) IS
  'Stop waiting for jobs of these queues (see wait_for_jobs): enqueues into them no longer notify on this session''s account.';

-- sql/functions/wait_for_jobs.sql as of 0004_test_paths_in_headers
-- idemq.wait_for_jobs(queues text[] DEFAULT NULL) RETURNS boolean
--
-- Declares this session a listener waiting for jobs of `queues` (NULL: every
-- queue): from now on a job becoming runnable in them sends NOTIFY idemq_jobs.
-- Call it (in the session that LISTENs, or any session that lives as long)
-- when a claim came back with fewer jobs than asked for, then claim once more
-- after it returned true, then wait for a notification. Enqueues skip the
-- NOTIFY while nobody waits: that is what keeps their commits from queueing.
--
-- Guarantees:
--   * Returns true when every transaction that made a job runnable without
--     notifying (nobody was waiting then) has ended: a claim started after it
--     sees all of their jobs. From then on every such job notifies, so a
--     waiting listener misses none.
--   * Returns false while such a transaction is still open (or another session
--     is checking at that instant): call again shortly. The marker is held
--     either way, so notifications already flow.
--   * Idempotent: calling again with the same queues holds one marker per queue.
--     The marker lasts until stop_waiting() or the end of the session
--     (including a lost connection), not of the transaction.
-- Concurrency: advisory locks: markers are shared (any number of waiting
--   sessions), the barrier is only tried, never waited on.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/worker/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.wait_for_jobs(queues text[] DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_marker bigint;
BEGIN
  FOR v_marker IN SELECT m.marker FROM idemq._wait_markers(queues, 'wait_for_jobs') m WHERE NOT m.held LOOP
    PERFORM pg_advisory_lock_shared(v_marker);
  END LOOP;
  IF pg_try_advisory_lock(idemq._wait_key('')) THEN
    PERFORM pg_advisory_unlock(idemq._wait_key(''));
    RETURN true;
  END IF;
  RETURN false;
END;
$$;

COMMENT ON FUNCTION idemq.wait_for_jobs(text[]) IS
  'Wait for jobs of these queues: enqueues NOTIFY while this session waits; true once a claim would see every job that did not notify.';

DROP FUNCTION idemq._grant_roles;

-- Back to 0004's privileges: the public functions executable by PUBLIC, the
-- roles (which stay: they are cluster-wide) with nothing in idemq.
DO $$
DECLARE
  v_fn regprocedure;
  v_role text;
BEGIN
  FOR v_fn IN
    SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
    WHERE p.pronamespace = 'idemq'::regnamespace AND pg_catalog.left(p.proname, 1) <> '_'
  LOOP
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', v_fn);
  END LOOP;
  FOREACH v_role IN ARRAY ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'] LOOP
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = v_role);
    EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA idemq FROM %I', v_role);
    EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA idemq FROM %I', v_role);
    EXECUTE pg_catalog.format('REVOKE ALL ON SCHEMA idemq FROM %I', v_role);
  END LOOP;
END $$;
