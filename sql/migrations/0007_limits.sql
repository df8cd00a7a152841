-- Migration 0007_limits (issue 11, bounded cost): limits in one table (idemq.settings, read by idemq._limit) checked up front with 22023: key and worker-id sizes, a bounded error history, finite instants, durations that cannot overflow; stats() survives a stored -infinity.
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

-- The limits every function checks (idemq._limit), one row each: the one
-- place a limit and its default is defined. An admin tunes one with UPDATE,
-- within [min_value, max_value]: the ranges keep each limit where it cannot
-- break storage (a btree entry holds about 2,700 bytes; jsonb 255 MB).
CREATE TABLE idemq.settings (
  name         text PRIMARY KEY,
  value        bigint NOT NULL,
  min_value    bigint NOT NULL,
  max_value    bigint NOT NULL,
  description  text NOT NULL,
  CONSTRAINT settings_value_in_range CHECK (value BETWEEN min_value AND max_value)
);
INSERT INTO idemq.settings (name, value, min_value, max_value, description) VALUES
  ('key_bytes', 512, 1, 2000,
   'longest guard key, effect key and effect owner, in bytes of UTF-8'),
  ('worker_id_bytes', 256, 1, 1000,
   'longest worker_id claim() accepts, in bytes of UTF-8'),
  ('error_history', 20, 1, 100,
   'errors kept per job: the latest entries of its history'),
  ('error_message_chars', 4096, 100, 65536,
   'longest class and message of a recorded error (and its other fields together), in characters'),
  ('error_stack_chars', 16384, 100, 262144,
   'longest stack of a recorded error, in characters'),
  ('duration_days', 36500, 1, 1000000,
   'longest retention or staleness (purge, prune_keys older_than; effect_claim stale_after), in days'),
  ('payload_bytes', 1048576, 1, 268435455,
   'largest job payload, in bytes of its JSON text (enqueue does not check it yet)');

-- ---- sql/functions/_check_instant.sql ----
-- idemq._check_instant(operation text, what text, value timestamptz) RETURNS void
--
-- Refuses an instant that is infinity or -infinity where a job needs a real
-- time (a run_at, a retry_at): such a job would run never, or sort before
-- every other and break the age arithmetic of stats().
--
-- Guarantees: returns only when value is NULL or finite.
-- Concurrency: none.
-- Errors: 22023 infinite.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_instant(operation text, what text, value timestamptz)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF NOT isfinite(value) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: %s must be a finite time, not %s', operation, what, value),
      HINT = 'Pass a real time, e.g. now() + interval ''1 hour'' (or now() to run at once).';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_instant(text, text, timestamptz) IS
  'Raise 22023 when an instant is infinity or -infinity.';

-- ---- sql/functions/_excerpt.sql ----
-- idemq._excerpt(value text) RETURNS text
--
-- What an error message quotes of an input: its first 60 characters, with
-- "… (N characters)" when it was longer.
--
-- Guarantees: at most 60 characters of `value` and a short suffix, so a bad
--   input of any size makes an error message of bounded size; NULL gives
--   'NULL'. The full value stays in DETAIL where the contract puts it there.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._excerpt(value text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN value IS NULL THEN 'NULL'
            WHEN length(value) <= 60 THEN value
            ELSE left(value, 60) || format('… (%s characters)', length(value)) END;

COMMENT ON FUNCTION idemq._excerpt(text) IS
  'The first 60 characters of an input, for error messages (bounded whatever the input).';

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
--     prune_keys. idemq_admin: every public function, SELECT on the
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

-- ---- sql/functions/_limit.sql ----
-- idemq._limit(name text) RETURNS bigint
--
-- The value of one of idemq's limits, read from idemq.settings: the one place
-- each limit and its default is defined (the migration that adds a limit
-- inserts its row; docs/design.md, "Limits", lists them).
--
-- Guarantees: returns the row's value, within the row's [min_value,
--   max_value] (a CHECK holds it). An admin changes a limit with
--   UPDATE idemq.settings SET value = ... WHERE name = ...; the ranges keep
--   every limit where it cannot break storage (a btree entry, jsonb's 255 MB).
--   A name with no row raises: a misspelt limit never silently passes.
-- Concurrency: a plain read of a small table; a changed value applies to
--   statements that start after it commits.
-- Errors: 42704 no limit of that name (a schema older than its caller: run
--   idemq migrate).
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._limit(name text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_value bigint;
BEGIN
  SELECT s.value INTO v_value FROM idemq.settings s WHERE s.name = _limit.name;
  IF v_value IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '42704',
      MESSAGE = format('idemq: no limit named %s in idemq.settings', _limit.name),
      HINT = 'Run idemq migrate: the schema is older than the functions that use this limit.';
  END IF;
  RETURN v_value;
END;
$$;

COMMENT ON FUNCTION idemq._limit(text) IS
  'The value of the limit `name` (idemq.settings: one row per limit, admin-tunable within its range).';

-- ---- sql/functions/_append_error.sql ----
-- idemq._append_error(errors jsonb, entry jsonb) RETURNS jsonb
--
-- A job's error history with `entry` appended, keeping only the latest
-- error_history entries (idemq._limit): the history of a job with many
-- attempts stays bounded, so the next failure can always be recorded.
--
-- Guarantees: the result is the last error_history elements of
--   errors || [entry], in order (NULL errors counts as []). Every function
--   that appends to jobs.errors appends through this one.
-- Concurrency: none.
-- Errors: none.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._append_error(errors jsonb, entry jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_all jsonb := coalesce(errors, '[]') || jsonb_build_array(entry);
  v_keep constant bigint := idemq._limit('error_history');
  v_len int;
BEGIN
  v_len := jsonb_array_length(v_all);
  IF v_len <= v_keep THEN
    RETURN v_all;
  END IF;
  RETURN (SELECT jsonb_agg(e.value ORDER BY e.ordinality)
          FROM jsonb_array_elements(v_all) WITH ORDINALITY e
          WHERE e.ordinality > v_len - v_keep);
END;
$$;

COMMENT ON FUNCTION idemq._append_error(jsonb, jsonb) IS
  'A job''s error history with one entry appended, keeping the latest error_history entries.';

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
    RETURN format('backoff must be a JSON object like {"kind":"fixed","delays":["2 seconds"]}, not %s', idemq._excerpt(backoff::text));
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
                  idemq._excerpt(coalesce((backoff->'kind')::text, 'missing')));
  END IF;
  SELECT k INTO v_field FROM jsonb_object_keys(backoff) k WHERE k <> ALL (v_allowed) LIMIT 1;
  IF v_field IS NOT NULL THEN
    RETURN format('backoff kind "%s" has no field "%s" (fields: %s)', v_kind, idemq._excerpt(v_field), array_to_string(v_allowed, ', '));
  END IF;

  BEGIN
    IF v_kind = 'exponential' THEN
      IF jsonb_typeof(backoff->'initial') IS DISTINCT FROM 'string' THEN
        RETURN 'exponential backoff needs "initial", an interval such as "2 seconds"';
      END IF;
      v_interval := (backoff->>'initial')::interval;
      IF v_interval <= interval '0' THEN
        RETURN format('exponential backoff "initial" must be positive, not %s', idemq._excerpt((backoff->'initial')::text));
      END IF;
      IF backoff ? 'factor' AND (jsonb_typeof(backoff->'factor') <> 'number' OR (backoff->>'factor')::numeric < 1) THEN
        RETURN format('exponential backoff "factor" must be a number >= 1, not %s', idemq._excerpt((backoff->'factor')::text));
      END IF;
      IF backoff ? 'jitter' AND (jsonb_typeof(backoff->'jitter') <> 'number'
          OR (backoff->>'jitter')::numeric < 0 OR (backoff->>'jitter')::numeric >= 1) THEN
        RETURN format('exponential backoff "jitter" must be a number in [0, 1), not %s', idemq._excerpt((backoff->'jitter')::text));
      END IF;
      IF backoff ? 'max' THEN
        IF jsonb_typeof(backoff->'max') <> 'string' OR (backoff->>'max')::interval <= interval '0' THEN
          RETURN format('exponential backoff "max" must be a positive interval, not %s', idemq._excerpt((backoff->'max')::text));
        END IF;
      END IF;
    ELSIF v_kind = 'fixed' THEN
      IF jsonb_typeof(backoff->'delays') IS DISTINCT FROM 'array' OR jsonb_array_length(backoff->'delays') = 0 THEN
        RETURN 'fixed backoff needs "delays", a non-empty array of intervals such as ["2 seconds", "5 seconds"]';
      END IF;
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(backoff->'delays') d
                 WHERE jsonb_typeof(d) <> 'string' OR (d #>> '{}')::interval < interval '0') THEN
        RETURN format('fixed backoff "delays" must be non-negative intervals, not %s', idemq._excerpt((backoff->'delays')::text));
      END IF;
    END IF;
  EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
                 OR invalid_text_representation OR numeric_value_out_of_range THEN
    RETURN format('backoff %s has a value that is not an interval (%s); write intervals like "2 seconds" or "5 min"',
                  idemq._excerpt(backoff::text), idemq._excerpt(SQLERRM));
  END;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._backoff_problem(jsonb) IS
  'What is wrong with a backoff specification, or NULL when it is valid.';

-- ---- sql/functions/_check_duration.sql ----
-- idemq._check_duration(operation text, what text, value interval) RETURNS void
--
-- Refuses a duration longer than the limit duration_days (idemq._limit),
-- before now() plus or minus it can overflow a timestamp: a retention, a
-- staleness. (Whether it may be zero or negative is the caller's check.)
--
-- Guarantees: returns only when value is NULL or at most duration_days days
--   (an infinite interval, PostgreSQL 17 and later, is refused too).
-- Concurrency: none.
-- Errors: 22023 too long.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_duration(operation text, what text, value interval)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_days bigint := idemq._limit('duration_days');
BEGIN
  IF value > make_interval(days => v_days::int) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: %s must be at most %s days, not %s', operation, what, v_days, value),
      HINT = format('Use a duration of at most %s days (duration_days in idemq.settings).', v_days);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_duration(text, text, interval) IS
  'Raise 22023 when a duration is over the limit duration_days (so now() +/- it cannot overflow).';

-- ---- sql/functions/_check_size.sql ----
-- idemq._check_size(operation text, what text, value text, limit_name text, hint text) RETURNS void
--
-- Refuses a text argument longer, in bytes of UTF-8, than the limit
-- `limit_name` (idemq._limit): a key, an owner, a worker id.
--
-- Guarantees: returns only when value is NULL or at most the limit's bytes.
--   The message names the operation, the argument, its size and the limit,
--   and quotes only an excerpt (_excerpt) of the value.
-- Concurrency: none.
-- Errors: 22023 over the limit, with `hint` as its HINT.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_size(operation text, what text, value text, limit_name text, hint text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_limit bigint;
BEGIN
  IF value IS NULL THEN
    RETURN;
  END IF;
  v_limit := idemq._limit(limit_name);
  IF octet_length(value) > v_limit THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: %s is %s bytes, over the limit of %s bytes (%s %s)',
                       operation, what, octet_length(value), v_limit, limit_name, idemq._excerpt(value)),
      HINT = hint;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_size(text, text, text, text, text) IS
  'Raise 22023 when a text argument is over its byte limit (idemq._limit).';

-- ---- sql/functions/_error_entry.sql ----
-- idemq._error_entry(reported jsonb) RETURNS jsonb
--
-- The error a worker reports, as fail() stores it in the job's history: a
-- JSON object, cut to a bounded size so a failure can always be recorded.
--
-- Guarantees:
--   * An object stays an object; a JSON string becomes {"class": "Error",
--     "message": <the string>}; anything else gives NULL (the caller raises).
--   * "class" and "message" are cut to error_message_chars characters and
--     "stack" to error_stack_chars (idemq._limit); a value that is not a
--     string and is over its cap is replaced by its JSON text, cut.
--   * The other fields are kept while their JSON text totals at most
--     error_message_chars characters; otherwise they are dropped.
--   * Anything cut or dropped sets "truncated": true; an entry within every
--     cap is returned unchanged.
-- Concurrency: none.
-- Errors: none.
-- Tests: test/sql/limits.test.ts, test/sql/fail.test.ts
CREATE OR REPLACE FUNCTION idemq._error_entry(reported jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_entry jsonb;
  v_rest jsonb;
  v_field text;
  v_text text;
  v_cap bigint;
  v_cut boolean := false;
  v_message_chars constant bigint := idemq._limit('error_message_chars');
  v_stack_chars constant bigint := idemq._limit('error_stack_chars');
BEGIN
  v_entry := CASE jsonb_typeof(reported)
    WHEN 'object' THEN reported
    WHEN 'string' THEN jsonb_build_object('class', 'Error', 'message', reported #>> '{}')
  END;
  IF v_entry IS NULL THEN
    RETURN NULL;
  END IF;
  v_rest := v_entry - 'class' - 'message' - 'stack';
  IF v_rest <> '{}' AND length(v_rest::text) > v_message_chars THEN
    v_rest := '{}';
    v_cut := true;
  END IF;
  FOREACH v_field IN ARRAY ARRAY['class', 'message', 'stack'] LOOP
    CONTINUE WHEN NOT v_entry ? v_field;
    v_text := CASE WHEN jsonb_typeof(v_entry->v_field) = 'string' THEN v_entry->>v_field
                   ELSE (v_entry->v_field)::text END;
    v_cap := CASE WHEN v_field = 'stack' THEN v_stack_chars ELSE v_message_chars END;
    IF length(v_text) > v_cap THEN
      v_rest := v_rest || jsonb_build_object(v_field, left(v_text, v_cap::int));
      v_cut := true;
    ELSE
      v_rest := v_rest || jsonb_build_object(v_field, v_entry->v_field);
    END IF;
  END LOOP;
  IF v_cut THEN
    v_rest := v_rest || '{"truncated": true}';
  END IF;
  RETURN v_rest;
END;
$$;

COMMENT ON FUNCTION idemq._error_entry(jsonb) IS
  'An error as fail() stores it: an object with class, message and stack cut to their limits (truncated: true when cut).';

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
          errors = idemq._append_error(j.errors, jsonb_build_object(
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
                    THEN idemq._append_error(j.errors, jsonb_build_object(
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
-- Errors: 22004 worker_id/batch_size NULL; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes (idemq._limit), batch_size outside 1..1000, empty
--   queue or task name, bad lease.
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
  PERFORM idemq._check_size('claim', 'worker_id', worker_id, 'worker_id_bytes',
    'Use a shorter worker id, e.g. hostname:pid; it is stored in every job the worker claims.');
  IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN batch_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('claim: batch_size must be between 1 and 1000, not %s', coalesce(batch_size::text, 'NULL')),
      HINT = 'Claim at most as many jobs as the worker can start before their leases need a heartbeat.';
  END IF;
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim: queues must be NULL (all queues) or a non-empty list of queue names, not %s',
                       idemq._excerpt(queues::text)),
      HINT = 'Pass NULL to claim from every queue.';
  END IF;
  IF tasks IS NOT NULL AND (cardinality(tasks) = 0 OR EXISTS (
       SELECT 1 FROM unnest(tasks) t WHERE t IS NULL OR t = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim: tasks must be NULL (any task) or a non-empty list of task names, not %s',
                       idemq._excerpt(tasks::text)),
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

-- ---- sql/functions/effect_claim.sql ----
-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes',
--                    job_id bigint DEFAULT NULL, attempt int DEFAULT NULL)
--   RETURNS TABLE(status text, result jsonb)
--
-- The claim-first record for an effect outside the database (an email, a
-- charge, a webhook). Call it in its own transaction (autocommit) before the
-- external call, then effect_done() or effect_release().
--
-- Guarantees: status is one of
--   claimed   no record existed: this owner may make the call;
--   reclaimed an earlier claim is older than stale_after (its owner likely
--             died, perhaps after the call), or was made by an earlier
--             attempt of the caller's own job (job_id, attempt given and the
--             caller holds that attempt: the earlier one is fenced out, so
--             there is no need to wait out stale_after): check with the
--             external system first, or resend with the same idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at (or on the claim's job and attempt),
--   re-checked after a concurrent reclaimer commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner, key or owner over key_bytes
--   bytes (idemq._limit), stale_after <= 0 or over duration_days, or only one
--   of job_id and attempt given.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(
  key text,
  owner text,
  stale_after interval DEFAULT '10 minutes',
  job_id bigint DEFAULT NULL,
  attempt int DEFAULT NULL)
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
  IF (effect_claim.job_id IS NULL) <> (effect_claim.attempt IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: job_id and attempt go together',
      HINT = 'Pass both (the job and attempt this claim is made for, as claim() returned them) or neither.';
  END IF;
  PERFORM idemq._check_size('effect_claim', 'key', effect_claim.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  PERFORM idemq._check_duration('effect_claim', 'stale_after', effect_claim.stale_after);
  PERFORM idemq._check_size('effect_claim', 'owner', effect_claim.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at, job_id, attempt)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp(), effect_claim.job_id, effect_claim.attempt)
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    -- Stale, or left by an earlier attempt of the job the caller holds now
    -- (fencing: that attempt can no longer finish, so its claim is dead).
    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1,
        job_id = effect_claim.job_id, attempt = effect_claim.attempt
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND (e.claimed_at < clock_timestamp() - effect_claim.stale_after
           OR (e.job_id = effect_claim.job_id AND e.attempt < effect_claim.attempt
               AND EXISTS (SELECT 1 FROM idemq.jobs j
                           WHERE j.id = effect_claim.job_id AND j.attempt = effect_claim.attempt
                             AND idemq._held(j.lease_expires_at, j.locked_by))));
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

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval, bigint, int) IS
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
--   never claimed; DETAIL {"key","owner"}); 22004 NULL key/owner; 22023 empty key/owner,
--   key or owner over key_bytes bytes (idemq._limit).
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
  PERFORM idemq._check_size('effect_done', 'key', effect_done.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  PERFORM idemq._check_size('effect_done', 'owner', effect_done.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
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
    MESSAGE = format('effect_done: the claim on effect "%s" is not held by %s',
                   idemq._excerpt(effect_done.key), idemq._excerpt(effect_done.owner)),
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
--   by releasing; DETAIL {"key","status"}); 22004 NULL key/owner; 22023 empty key/owner,
--   key or owner over key_bytes bytes (idemq._limit).
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
  PERFORM idemq._check_size('effect_release', 'key', effect_release.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  PERFORM idemq._check_size('effect_release', 'owner', effect_release.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
  DELETE FROM idemq.effects AS e
  WHERE e.key = effect_release.key AND e.owner = effect_release.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM idemq.effects e WHERE e.key = effect_release.key AND e.status = 'done') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('effect_release: effect "%s" is already done and cannot be released', idemq._excerpt(effect_release.key)),
      DETAIL = jsonb_build_object('key', effect_release.key, 'status', 'done')::text,
      HINT = 'A done effect happened; do not retry it.';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('effect_release: the claim on effect "%s" is not held by %s',
                   idemq._excerpt(effect_release.key), idemq._excerpt(effect_release.owner)),
    DETAIL = jsonb_build_object('key', effect_release.key, 'owner', effect_release.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale; leave it to them.';
END;
$$;

COMMENT ON FUNCTION idemq.effect_release(text, text) IS
  'Give up a claim whose external call did not happen; IQ410 if not this owner''s.';

-- ---- sql/functions/fail.sql ----
-- idemq.fail(job_id bigint, attempt int, error jsonb, retryable boolean DEFAULT true,
--   retry_at timestamptz DEFAULT NULL, backoff jsonb DEFAULT NULL,
--   max_attempts int DEFAULT NULL, counted boolean DEFAULT true)
--   RETURNS TABLE(state idemq.job_state, run_at timestamptz)
--
-- Records a failed attempt; schedules a retry or fails the job for good.
-- Returns one row: the job's new state and the run_at of its retry (NULL
-- when it failed), exactly as stored.
--
-- Guarantees:
--   * Appends to errors one entry: the fields of `error` (by convention
--     class, message and stack; a JSON string is taken as the message, with
--     class "Error"), cut to their limits (_error_entry), with
--     attempt, started_at (the claim), failed_at and worker set by fail()
--     over any fields of the same names. The history keeps the latest
--     error_history entries (_append_error), so a failure can always be
--     recorded, whatever the size of the errors before it.
--   * The job goes to `scheduled` at retry_at, or after the job's backoff
--     (_backoff_delay with the number of counted attempts so far, 1 for the
--     first failure); or to `failed` when the error is not retryable or the
--     counted attempts reached max_attempts. Snoozes do not count.
--   * backoff and max_attempts override the job's for this decision (a
--     worker's task settings): the delay is _backoff_delay(backoff, counted
--     attempts) on the database clock, and the job fails once the counted
--     attempts reach the lower of the two limits.
--   * counted = false records the error without spending the attempt (a
--     worker handing a job back at shutdown: the attempt was cut short, it
--     did not fail): it does not count against max_attempts, like a snooze,
--     and the retry runs at retry_at or at once, with no backoff.
--   * A retry already due (retry_at not in the future) NOTIFYs idemq_jobs
--     when a listener waits (_notify_waiting).
--   * Fenced like complete(): a stale attempt changes nothing.
--   * The returned run_at is the one source of the retry time: a worker reports
--     it instead of computing the backoff again.
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id/attempt/error/retryable/counted;
--   22023 error is not a JSON object or string, a malformed backoff,
--   max_attempts < 1, retry_at infinity or -infinity.
-- Tests: test/sql/fail.test.ts, test/sql/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq.fail(
  job_id bigint,
  attempt int,
  error jsonb,
  retryable boolean DEFAULT true,
  retry_at timestamptz DEFAULT NULL,
  backoff jsonb DEFAULT NULL,
  max_attempts int DEFAULT NULL,
  counted boolean DEFAULT true)
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
  IF fail.error IS NULL OR fail.retryable IS NULL OR fail.counted IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'fail: error, retryable and counted must not be NULL',
      HINT = 'Pass the error as {"class": "TimeoutError", "message": "..."}.';
  END IF;
  v_error := idemq._error_entry(fail.error);
  IF v_error IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: error must be a JSON object or string, not %s', idemq._excerpt(fail.error::text)),
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
  PERFORM idemq._check_instant('fail', 'retry_at', fail.retry_at);

  SELECT j.attempt, j.uncounted, j.max_attempts, j.backoff INTO v_job
  FROM idemq.jobs j
  WHERE j.id = fail.job_id AND j.attempt = fail.attempt AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(fail.job_id, fail.attempt, 'fail');
  END IF;
  v_state := CASE WHEN NOT fail.retryable THEN 'failed'
                  WHEN NOT fail.counted THEN 'scheduled'
                  WHEN v_job.attempt - v_job.uncounted >= least(v_job.max_attempts, fail.max_attempts) THEN 'failed'
                  ELSE 'scheduled' END;

  UPDATE idemq.jobs AS j
  SET state = v_state,
      run_at = CASE WHEN v_state <> 'scheduled' THEN j.run_at
                    WHEN NOT fail.counted THEN coalesce(fail.retry_at, now())
                    ELSE coalesce(fail.retry_at, now() + idemq._backoff_delay(coalesce(nullif(fail.backoff, 'null'), v_job.backoff),
                                                                  v_job.attempt - v_job.uncounted)) END,
      uncounted = j.uncounted + CASE WHEN fail.counted THEN 0 ELSE 1 END,
      finished_at = CASE WHEN v_state = 'failed' THEN now() END,
      errors = idemq._append_error(j.errors, v_error || jsonb_build_object(
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

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int, boolean) IS
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
-- Errors: 22004 NULL key; 22023 empty key or empty task (NULL task is fine), a key
--   over key_bytes bytes (idemq._limit; a btree entry cannot hold much more).
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
  PERFORM idemq._check_size('guard', 'key', guard.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
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
-- Errors: 22004 NULL; 22023 negative older_than, or over duration_days (idemq._limit).
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
  PERFORM idemq._check_duration('prune_keys', 'older_than', older_than);

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
--   22004 NULL run_at; 22023 run_at infinity or -infinity.
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
  PERFORM idemq._check_instant('reschedule', 'run_at', reschedule.run_at);
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
--     its expires_at (it could never be claimed again). It keeps its run_at,
--     so it is claimed ahead of the jobs that became due after it. Its errors record
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
        -- run_at stays: the job was due before the backlog behind it, and
        -- keeps its place in line (claim orders by priority, run_at, id).
        lease_lost = true,
        errors = idemq._append_error(j.errors, jsonb_build_object(
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
-- Errors: IQ404; IQ410 lease lost; 22004 NULL arguments; 22023 run_at infinity or -infinity.
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
  PERFORM idemq._check_instant('snooze', 'run_at', snooze.run_at);
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

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._append_error FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_duration FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_instant FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_size FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._error_entry FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._excerpt FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._limit FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- sql/functions/_backoff_problem.sql as of 0005_least_privilege
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

-- sql/functions/_grant_roles.sql as of 0005_least_privilege
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

-- sql/functions/_on_job_finished.sql as of 0005_least_privilege
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

-- sql/functions/cancel.sql as of 0005_least_privilege
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

-- sql/functions/claim.sql as of 0005_least_privilege
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

-- sql/functions/effect_claim.sql as of 0006_survive_the_database
-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes',
--                    job_id bigint DEFAULT NULL, attempt int DEFAULT NULL)
--   RETURNS TABLE(status text, result jsonb)
--
-- The claim-first record for an effect outside the database (an email, a
-- charge, a webhook). Call it in its own transaction (autocommit) before the
-- external call, then effect_done() or effect_release().
--
-- Guarantees: status is one of
--   claimed   no record existed: this owner may make the call;
--   reclaimed an earlier claim is older than stale_after (its owner likely
--             died, perhaps after the call), or was made by an earlier
--             attempt of the caller's own job (job_id, attempt given and the
--             caller holds that attempt: the earlier one is fenced out, so
--             there is no need to wait out stale_after): check with the
--             external system first, or resend with the same idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at (or on the claim's job and attempt),
--   re-checked after a concurrent reclaimer commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner, stale_after <= 0, or
--   only one of job_id and attempt given.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(
  key text,
  owner text,
  stale_after interval DEFAULT '10 minutes',
  job_id bigint DEFAULT NULL,
  attempt int DEFAULT NULL)
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
  IF (effect_claim.job_id IS NULL) <> (effect_claim.attempt IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: job_id and attempt go together',
      HINT = 'Pass both (the job and attempt this claim is made for, as claim() returned them) or neither.';
  END IF;

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at, job_id, attempt)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp(), effect_claim.job_id, effect_claim.attempt)
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    -- Stale, or left by an earlier attempt of the job the caller holds now
    -- (fencing: that attempt can no longer finish, so its claim is dead).
    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1,
        job_id = effect_claim.job_id, attempt = effect_claim.attempt
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND (e.claimed_at < clock_timestamp() - effect_claim.stale_after
           OR (e.job_id = effect_claim.job_id AND e.attempt < effect_claim.attempt
               AND EXISTS (SELECT 1 FROM idemq.jobs j
                           WHERE j.id = effect_claim.job_id AND j.attempt = effect_claim.attempt
                             AND idemq._held(j.lease_expires_at, j.locked_by))));
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

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval, bigint, int) IS
  'Claim-first record for an external effect: claimed | reclaimed (stale) | done (with result) | busy.';

-- sql/functions/effect_done.sql as of 0005_least_privilege
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

-- sql/functions/effect_release.sql as of 0005_least_privilege
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

-- sql/functions/fail.sql as of 0006_survive_the_database
-- idemq.fail(job_id bigint, attempt int, error jsonb, retryable boolean DEFAULT true,
--   retry_at timestamptz DEFAULT NULL, backoff jsonb DEFAULT NULL,
--   max_attempts int DEFAULT NULL, counted boolean DEFAULT true)
--   RETURNS TABLE(state idemq.job_state, run_at timestamptz)
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
--   * counted = false records the error without spending the attempt (a
--     worker handing a job back at shutdown: the attempt was cut short, it
--     did not fail): it does not count against max_attempts, like a snooze,
--     and the retry runs at retry_at or at once, with no backoff.
--   * A retry already due (retry_at not in the future) NOTIFYs idemq_jobs
--     when a listener waits (_notify_waiting).
--   * Fenced like complete(): a stale attempt changes nothing.
--   * The returned run_at is the one source of the retry time: a worker reports
--     it instead of computing the backoff again.
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id/attempt/error/retryable/counted;
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
  max_attempts int DEFAULT NULL,
  counted boolean DEFAULT true)
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
  IF fail.error IS NULL OR fail.retryable IS NULL OR fail.counted IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'fail: error, retryable and counted must not be NULL',
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
  v_state := CASE WHEN NOT fail.retryable THEN 'failed'
                  WHEN NOT fail.counted THEN 'scheduled'
                  WHEN v_job.attempt - v_job.uncounted >= least(v_job.max_attempts, fail.max_attempts) THEN 'failed'
                  ELSE 'scheduled' END;

  UPDATE idemq.jobs AS j
  SET state = v_state,
      run_at = CASE WHEN v_state <> 'scheduled' THEN j.run_at
                    WHEN NOT fail.counted THEN coalesce(fail.retry_at, now())
                    ELSE coalesce(fail.retry_at, now() + idemq._backoff_delay(coalesce(nullif(fail.backoff, 'null'), v_job.backoff),
                                                                  v_job.attempt - v_job.uncounted)) END,
      uncounted = j.uncounted + CASE WHEN fail.counted THEN 0 ELSE 1 END,
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

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int, boolean) IS
  'Record a failed attempt; scheduled for a retry by backoff (or retry_at), or failed when not retryable or out of attempts.';

-- sql/functions/guard.sql as of 0005_least_privilege
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

-- sql/functions/prune_keys.sql as of 0005_least_privilege
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

-- sql/functions/purge.sql as of 0005_least_privilege
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

-- sql/functions/reschedule.sql as of 0005_least_privilege
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

-- sql/functions/rescue.sql as of 0006_survive_the_database
-- idemq.rescue() RETURNS int
--
-- Takes jobs away from workers whose lease ran out, and expires jobs past
-- their deadline. Returns how many jobs it changed.
--
-- Guarantees:
--   * A job in processing whose lease_expires_at has passed (a crashed or
--     partitioned worker) goes back to enqueued, runnable now, or to failed
--     when that was its last counted attempt, or to expired when it is past
--     its expires_at (it could never be claimed again). It keeps its run_at,
--     so it is claimed ahead of the jobs that became due after it. Its errors record
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
        -- run_at stays: the job was due before the backlog behind it, and
        -- keeps its place in line (claim orders by priority, run_at, id).
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

-- sql/functions/snooze.sql as of 0005_least_privilege
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

-- sql/functions/stats.sql as of 0005_least_privilege
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

DROP FUNCTION idemq._error_entry;
DROP FUNCTION idemq._check_size;
DROP FUNCTION idemq._check_duration;
DROP FUNCTION idemq._append_error;
DROP FUNCTION idemq._limit;
DROP FUNCTION idemq._excerpt;
DROP FUNCTION idemq._check_instant;

-- Hand-written reversal of the schema changes above goes here, after the functions.

DROP TABLE idemq.settings;
