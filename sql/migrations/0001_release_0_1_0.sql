-- Migration 0001_release_0_1_0: idemq 0.1.0, the whole schema in one migration.
--
-- The 30 migrations written before the first release (0001_init ..
-- 0030_cheaper_guard) squashed into one: every type, table, constraint,
-- index, trigger, setting and grant they left, and every function once, as
-- sql/functions/ has it without its header comment (the header is the
-- function's documentation: it stays in sql/functions/ and docs/sql-api.md).
-- test/install/release.test.ts holds the catalog this builds equal to the one
-- the 30 migrations built, object by object; a database migrated through them
-- is recognised as 0.1.0 (src/migrate.ts, PRE_RELEASE_MIGRATIONS) and upgrades
-- like one installed from this file. Released: sql/released.sha256 holds its
-- hash and this file never changes again; later releases add upgrade files.
-- Up Migration

-- Function bodies are checked when they run, not here: some SQL-language
-- functions read tables created after them in this file and the other way
-- round (a table's CHECK calls a function). pg_dump restores the same way.
-- SET LOCAL: the setting ends with this migration's transaction.
SET LOCAL check_function_bodies = false;

CREATE SCHEMA IF NOT EXISTS idemq;

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

-- ==== Types ====

CREATE TYPE idemq._enqueue_limits AS (
	payload_bytes bigint,
	key_bytes bigint,
	task_bytes bigint,
	parents_per_job bigint,
	jobs_per_call bigint,
	duration_days bigint
);

CREATE TYPE idemq.duplicate_policy AS ENUM (
    'allow_after_failed',
    'reject_if_failed',
    'reject_always',
    'reject_if_succeeded'
);

CREATE TYPE idemq.job_state AS ENUM (
    'scheduled',
    'enqueued',
    'processing',
    'awaiting',
    'succeeded',
    'failed',
    'expired',
    'cancelled'
);

CREATE TYPE idemq._planned_job AS (
	ordinal integer,
	job_id bigint,
	outcome text,
	existing_state idemq.job_state,
	task text,
	payload jsonb,
	queue text,
	run_at timestamp with time zone,
	priority integer,
	max_attempts integer,
	idempotency_key text,
	duplicate_policy idemq.duplicate_policy,
	backoff jsonb,
	expires_at timestamp with time zone,
	after bigint[],
	key_retention interval,
	traceparent text
);

CREATE TYPE idemq.claimed_job AS (
	id bigint,
	task text,
	queue text,
	payload jsonb,
	attempt integer,
	max_attempts integer,
	idempotency_key text,
	lease_expires_at timestamp with time zone,
	reclaimed boolean,
	traceparent text
);

CREATE TYPE idemq.schedule_misfire AS ENUM (
    'once',
    'skip',
    'all'
);

CREATE TYPE idemq.schedule_overlap AS ENUM (
    'skip',
    'allow',
    'queue_one'
);

-- ==== Tables ====

CREATE TABLE idemq.enqueue_limits OF idemq._enqueue_limits (
    payload_bytes NOT NULL,
    key_bytes NOT NULL,
    task_bytes NOT NULL,
    parents_per_job NOT NULL,
    jobs_per_call NOT NULL,
    duration_days NOT NULL
);

COMMENT ON TABLE idemq.enqueue_limits IS 'The limits an enqueue checks, one row kept from idemq.settings by the trigger settings_keep_enqueue_limits; change idemq.settings, not this.';

CREATE TABLE idemq.jobs (
    id bigint NOT NULL,
    task text NOT NULL,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    state idemq.job_state NOT NULL,
    priority integer NOT NULL,
    run_at timestamp with time zone NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    uncounted integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    idempotency_key text,
    backoff jsonb,
    locked_by text,
    locked_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    lease_lost boolean DEFAULT false NOT NULL,
    has_children boolean DEFAULT false NOT NULL,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    result jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    expires_at timestamp with time zone,
    traceparent text,
    CONSTRAINT jobs_errors_is_array CHECK ((jsonb_typeof(errors) = 'array'::text)),
    CONSTRAINT jobs_lease_iff_processing CHECK (((state = 'processing'::idemq.job_state) = ((lease_expires_at IS NOT NULL) AND (locked_by IS NOT NULL)))),
    CONSTRAINT jobs_max_attempts_positive CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_queue_not_empty CHECK ((queue <> ''::text)),
    CONSTRAINT jobs_task_not_empty CHECK ((task <> ''::text))
)
WITH (fillfactor='50');
ALTER TABLE ONLY idemq.jobs ALTER COLUMN task SET (n_distinct=100);
ALTER TABLE ONLY idemq.jobs ALTER COLUMN queue SET (n_distinct=100);

CREATE TABLE idemq.success_retention (
    default_zero boolean NOT NULL,
    zero_tasks text[] NOT NULL,
    kept_tasks text[] NOT NULL,
    zero_queues text[] NOT NULL,
    kept_queues text[] NOT NULL
);

COMMENT ON TABLE idemq.success_retention IS 'Which succeeded jobs have retention 0, one row kept from idemq.settings and idemq.retention by triggers; change those, not this.';

CREATE TABLE idemq.counters (
    task text NOT NULL,
    event text NOT NULL,
    n bigint NOT NULL,
    CONSTRAINT counters_event_known CHECK ((event = ANY (ARRAY['deduplicated'::text, 'rejected'::text, 'conflict'::text, 'guard_duplicate'::text]))),
    CONSTRAINT counters_n_positive CHECK ((n > 0))
);

CREATE TABLE idemq.effects (
    key text NOT NULL,
    owner text NOT NULL,
    status text NOT NULL,
    claimed_at timestamp with time zone NOT NULL,
    reclaims integer DEFAULT 0 NOT NULL,
    done_at timestamp with time zone,
    result jsonb,
    job_id bigint,
    attempt integer,
    CONSTRAINT effects_done_iff_done_at CHECK (((status = 'done'::text) = (done_at IS NOT NULL))),
    CONSTRAINT effects_job_and_attempt_together CHECK (((job_id IS NULL) = (attempt IS NULL))),
    CONSTRAINT effects_key_not_empty CHECK ((key <> ''::text)),
    CONSTRAINT effects_status_known CHECK ((status = ANY (ARRAY['claimed'::text, 'done'::text])))
);

CREATE TABLE idemq.job_dependencies (
    parent_id bigint NOT NULL,
    child_id bigint NOT NULL
);

ALTER TABLE idemq.jobs ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME idemq.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE idemq.keys (
    key text NOT NULL,
    job_id bigint NOT NULL,
    task text NOT NULL,
    payload_md5 text NOT NULL,
    finished_state idemq.job_state,
    finished_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    retention interval NOT NULL,
    CONSTRAINT keys_finished_consistent CHECK (((finished_state IS NULL) = (finished_at IS NULL))),
    CONSTRAINT keys_key_not_empty CHECK ((key <> ''::text)),
    CONSTRAINT keys_retention_not_negative CHECK ((retention >= '00:00:00'::interval))
);

CREATE TABLE idemq.processed (
    key text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT processed_key_not_empty CHECK ((key <> ''::text))
);

CREATE TABLE idemq.retention (
    queue text,
    task text,
    state idemq.job_state NOT NULL,
    keep interval NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT retention_keep_not_negative CHECK ((keep >= '00:00:00'::interval)),
    CONSTRAINT retention_queue_not_empty CHECK ((queue <> ''::text)),
    CONSTRAINT retention_queue_or_task CHECK (((queue IS NULL) <> (task IS NULL))),
    CONSTRAINT retention_state_terminal CHECK ((state = ANY (ARRAY['succeeded'::idemq.job_state, 'failed'::idemq.job_state, 'expired'::idemq.job_state, 'cancelled'::idemq.job_state]))),
    CONSTRAINT retention_task_not_empty CHECK ((task <> ''::text))
);

CREATE TABLE idemq.schedules (
    name text NOT NULL,
    cron text NOT NULL,
    timezone text NOT NULL,
    task text NOT NULL,
    payload jsonb NOT NULL,
    queue text NOT NULL,
    priority integer NOT NULL,
    max_attempts integer NOT NULL,
    overlap idemq.schedule_overlap NOT NULL,
    misfire idemq.schedule_misfire NOT NULL,
    misfire_grace interval NOT NULL,
    next_at timestamp with time zone NOT NULL,
    last_slot_at timestamp with time zone,
    last_job_id bigint,
    skipped bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedules_cron_not_empty CHECK ((cron <> ''::text)),
    CONSTRAINT schedules_last_job_has_slot CHECK (((last_job_id IS NULL) OR (last_slot_at IS NOT NULL))),
    CONSTRAINT schedules_max_attempts_positive CHECK ((max_attempts >= 1)),
    CONSTRAINT schedules_misfire_grace_in_range CHECK (((misfire_grace >= '00:00:01'::interval) AND (misfire_grace <= '1 day'::interval))),
    CONSTRAINT schedules_name_length CHECK ((length(name) <= 200)),
    CONSTRAINT schedules_name_not_empty CHECK ((name <> ''::text)),
    CONSTRAINT schedules_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT schedules_queue_not_empty CHECK ((queue <> ''::text)),
    CONSTRAINT schedules_skipped_not_negative CHECK ((skipped >= 0)),
    CONSTRAINT schedules_task_not_empty CHECK ((task <> ''::text))
);

CREATE TABLE idemq.settings (
    name text NOT NULL,
    value bigint NOT NULL,
    min_value bigint NOT NULL,
    max_value bigint NOT NULL,
    description text NOT NULL,
    CONSTRAINT settings_value_in_range CHECK (((value >= min_value) AND (value <= max_value)))
);

CREATE TABLE idemq.workers (
    worker_id text NOT NULL,
    queues text[],
    tasks text[],
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workers_id_not_empty CHECK ((worker_id <> ''::text)),
    CONSTRAINT workers_queues_not_empty CHECK ((cardinality(queues) > 0)),
    CONSTRAINT workers_tasks_not_empty CHECK ((cardinality(tasks) > 0))
);

ALTER TABLE ONLY idemq.effects
    ADD CONSTRAINT effects_pkey PRIMARY KEY (key);

ALTER TABLE ONLY idemq.job_dependencies
    ADD CONSTRAINT job_dependencies_pkey PRIMARY KEY (parent_id, child_id);

ALTER TABLE ONLY idemq.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY idemq.keys
    ADD CONSTRAINT keys_pkey PRIMARY KEY (key);

ALTER TABLE ONLY idemq.processed
    ADD CONSTRAINT processed_pkey PRIMARY KEY (key);

ALTER TABLE ONLY idemq.retention
    ADD CONSTRAINT retention_queue_state UNIQUE (queue, state);

ALTER TABLE ONLY idemq.retention
    ADD CONSTRAINT retention_task_state UNIQUE (task, state);

ALTER TABLE ONLY idemq.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);

ALTER TABLE ONLY idemq.settings
    ADD CONSTRAINT settings_pkey PRIMARY KEY (name);

ALTER TABLE ONLY idemq.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (worker_id);

-- ==== Functions (sql/functions/, without their header comments) ====

-- ---- sql/functions/_append_error.sql ----
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

-- ---- sql/functions/_backoff_delay.sql ----
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

-- ---- sql/functions/_check_delete_batch.sql ----
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

-- ---- sql/functions/_check_duration.sql ----
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

-- ---- sql/functions/_check_instant.sql ----
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

-- ---- sql/functions/_check_key_bytes.sql ----
CREATE OR REPLACE FUNCTION idemq._check_key_bytes(operation text, key text, owner text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_limit bigint;
BEGIN
  SELECT l.key_bytes INTO v_limit FROM idemq.enqueue_limits l;
  IF octet_length(_check_key_bytes.key) > v_limit OR octet_length(_check_key_bytes.owner) > v_limit THEN
    PERFORM idemq._check_size(operation, 'key', _check_key_bytes.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
    PERFORM idemq._check_size(operation, 'owner', _check_key_bytes.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_key_bytes(text, text, text) IS
  'Raise 22023 when a guard or effect key, or an effect owner, is over key_bytes bytes.';

-- ---- sql/functions/_check_key_owner.sql ----
CREATE OR REPLACE FUNCTION idemq._check_key_owner(operation text, key text, owner text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_key_owner.key IS NULL OR _check_key_owner.owner IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: key and owner must not be NULL', operation),
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  IF _check_key_owner.key = '' OR _check_key_owner.owner = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: key and owner must be non-empty', operation),
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  PERFORM idemq._check_key_bytes(operation, _check_key_owner.key, _check_key_owner.owner);
END;
$$;

COMMENT ON FUNCTION idemq._check_key_owner(text, text, text) IS
  'Raise 22004/22023 unless the key and owner of effect_done or effect_release are non-empty and within key_bytes.';

-- ---- sql/functions/_check_lease.sql ----
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

-- ---- sql/functions/_check_size.sql ----
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

-- ---- sql/functions/_check_timezone.sql ----
CREATE OR REPLACE FUNCTION idemq._check_timezone(timezone text, operation text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_timezone.timezone IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: timezone must not be NULL', _check_timezone.operation),
      HINT = 'Leave it out for UTC, or pass an IANA zone name such as ''Europe/Berlin''.';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names z WHERE z.name = _check_timezone.timezone) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: timezone "%s" is not an IANA time zone name', _check_timezone.operation, _check_timezone.timezone),
      HINT = 'Use a name from pg_timezone_names, such as UTC, Europe/Berlin or America/New_York (not an abbreviation like CEST).';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_timezone(text, text) IS
  'Raise unless the time zone is an IANA name PostgreSQL knows.';

-- ---- sql/functions/_claim_merge.sql ----
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

-- ---- sql/functions/_cron_field.sql ----
CREATE OR REPLACE FUNCTION idemq._cron_field(field text, field_number int, label text, lo int, hi int, names text[] DEFAULT NULL)
RETURNS int[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_hint text;
  v_item text;
  v_parts text[];
  v_ends text[];
  v_token text;
  v_bounds int[];
  v_value int;
  v_step int;
  v_values int[] := '{}';
BEGIN
  v_hint := format('Field %s (%s) takes %s-%s%s: *, a value, a list (1,5), a range (1-5) or a step (*/7, 1-10/2).',
                   _cron_field.field_number, _cron_field.label, _cron_field.lo, _cron_field.hi,
                   CASE WHEN _cron_field.names IS NULL THEN ''
                        ELSE format(' or %s-%s', _cron_field.names[1], _cron_field.names[cardinality(_cron_field.names)]) END);
  FOREACH v_item IN ARRAY string_to_array(_cron_field.field, ',') LOOP
    v_parts := string_to_array(v_item, '/');
    IF v_item = '' OR cardinality(v_parts) > 2 OR v_parts[1] = '' THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('cron field %s (%s) "%s" is not a value, range or step', _cron_field.field_number, _cron_field.label, v_item),
        HINT = v_hint;
    END IF;
    v_step := 1;
    IF cardinality(v_parts) = 2 THEN
      IF v_parts[2] !~ '^[0-9]{1,9}$' OR v_parts[2]::int < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
          MESSAGE = format('cron field %s (%s) step "%s" is not a whole number of at least 1', _cron_field.field_number, _cron_field.label, v_parts[2]),
          HINT = v_hint;
      END IF;
      v_step := v_parts[2]::int;
    END IF;

    IF v_parts[1] = '*' THEN
      v_bounds := ARRAY[_cron_field.lo, _cron_field.hi];
    ELSE
      v_ends := string_to_array(v_parts[1], '-');
      IF cardinality(v_ends) > 2 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
          MESSAGE = format('cron field %s (%s) "%s" is not a value, range or step', _cron_field.field_number, _cron_field.label, v_item),
          HINT = v_hint;
      END IF;
      v_bounds := '{}';
      FOREACH v_token IN ARRAY v_ends LOOP
        IF v_token ~ '^[0-9]{1,9}$' THEN
          v_value := v_token::int;
        ELSE
          v_value := array_position(_cron_field.names, upper(v_token)) + _cron_field.lo - 1;
          IF v_value IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
              MESSAGE = format('cron field %s (%s) "%s" is not a number%s', _cron_field.field_number, _cron_field.label, v_token,
                               CASE WHEN _cron_field.names IS NULL THEN '' ELSE ' or a name' END),
              HINT = v_hint;
          END IF;
        END IF;
        IF v_value < _cron_field.lo OR v_value > _cron_field.hi THEN
          RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('cron field %s (%s) "%s" is out of range %s-%s', _cron_field.field_number, _cron_field.label, v_token,
                             _cron_field.lo, _cron_field.hi),
            HINT = v_hint;
        END IF;
        v_bounds := v_bounds || v_value;
      END LOOP;
      IF cardinality(v_ends) = 1 THEN
        -- `5/15` runs from 5 to the end of the range, as in Vixie cron.
        v_bounds := ARRAY[v_bounds[1], CASE WHEN cardinality(v_parts) = 2 THEN _cron_field.hi ELSE v_bounds[1] END];
      ELSIF v_bounds[1] > v_bounds[2] THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
          MESSAGE = format('cron field %s (%s) range "%s" starts after it ends', _cron_field.field_number, _cron_field.label, v_parts[1]),
          HINT = format('Write the smaller value first, or a list for a range that wraps (e.g. 22-23,0-2). %s', v_hint);
      END IF;
    END IF;
    v_values := v_values || ARRAY(SELECT generate_series(v_bounds[1], v_bounds[2], v_step));
  END LOOP;
  RETURN ARRAY(SELECT DISTINCT v FROM unnest(v_values) v ORDER BY v);
END;
$$;

COMMENT ON FUNCTION idemq._cron_field(text, int, text, int, int, text[]) IS
  'The sorted values one cron field matches; raises 22023 naming the field and the bad item.';

-- ---- sql/functions/_cron_instant.sql ----
CREATE OR REPLACE FUNCTION idemq._cron_instant(local_time timestamp, timezone text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_at timestamptz := _cron_instant.local_time AT TIME ZONE _cron_instant.timezone;
  v_day_before timestamptz;
  v_offset_before interval;
  v_offset_after interval;
  v_first timestamptz;
  v_lo timestamptz;
  v_hi timestamptz;
  v_mid timestamptz;
BEGIN
  -- UTC offsets a day earlier and at v_at: a DST change lies between them
  -- when they differ (changes are months apart).
  v_day_before := v_at - interval '1 day';
  v_offset_before := (v_day_before AT TIME ZONE _cron_instant.timezone) - (v_day_before AT TIME ZONE 'UTC');
  v_first := (_cron_instant.local_time - v_offset_before) AT TIME ZONE 'UTC';
  IF v_first < v_at AND (v_first AT TIME ZONE _cron_instant.timezone) = _cron_instant.local_time THEN
    RETURN v_first;
  END IF;
  IF (v_at AT TIME ZONE _cron_instant.timezone) = _cron_instant.local_time THEN
    RETURN v_at;
  END IF;
  -- A gap: v_at is past the change by the offset difference; bisect for the
  -- change itself (the first instant with the new offset), to the second.
  v_offset_after := (v_at AT TIME ZONE _cron_instant.timezone) - (v_at AT TIME ZONE 'UTC');
  IF v_offset_after <= v_offset_before THEN
    RETURN v_at;
  END IF;
  v_lo := v_at - (v_offset_after - v_offset_before);
  v_hi := v_at;
  WHILE v_hi - v_lo > interval '1 second' LOOP
    v_mid := v_lo + (v_hi - v_lo) / 2;
    IF (v_mid AT TIME ZONE _cron_instant.timezone) - (v_mid AT TIME ZONE 'UTC') = v_offset_after THEN
      v_hi := v_mid;
    ELSE
      v_lo := v_mid;
    END IF;
  END LOOP;
  -- Changes happen on whole seconds: the second after v_lo.
  RETURN date_trunc('second', v_lo) + interval '1 second';
END;
$$;

COMMENT ON FUNCTION idemq._cron_instant(timestamp, text) IS
  'The instant a local slot fires at: the first occurrence of a repeated time, the change instant for a skipped one.';

-- ---- sql/functions/_cron_latest.sql ----
CREATE OR REPLACE FUNCTION idemq._cron_latest(spec jsonb, timezone text, lo timestamptz, hi timestamptz, n int)
RETURNS timestamptz[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_width interval := interval '1 minute';
  v_from timestamptz;
  v_slot timestamptz;
  v_slots timestamptz[];
BEGIN
  IF _cron_latest.n < 1 OR _cron_latest.lo > _cron_latest.hi THEN
    RETURN '{}';
  END IF;
  LOOP
    v_from := greatest(_cron_latest.lo, _cron_latest.hi - v_width);
    v_slots := '{}';
    v_slot := idemq._cron_next(_cron_latest.spec, _cron_latest.timezone, v_from - interval '1 microsecond');
    WHILE v_slot IS NOT NULL AND v_slot <= _cron_latest.hi LOOP
      v_slots := v_slots || v_slot;
      IF cardinality(v_slots) > _cron_latest.n THEN
        v_slots := v_slots[2:];
      END IF;
      v_slot := idemq._cron_next(_cron_latest.spec, _cron_latest.timezone, v_slot);
    END LOOP;
    EXIT WHEN cardinality(v_slots) >= _cron_latest.n OR v_from = _cron_latest.lo;
    v_width := v_width * 8;
  END LOOP;
  RETURN v_slots;
END;
$$;

COMMENT ON FUNCTION idemq._cron_latest(jsonb, text, timestamptz, timestamptz, int) IS
  'The latest n slots of a parsed cron expression between two instants, oldest first.';

-- ---- sql/functions/_cron_next.sql ----
CREATE OR REPLACE FUNCTION idemq._cron_next(spec jsonb, timezone text, after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_every numeric := (_cron_next.spec ->> 'every')::numeric;
  v_start timestamp;
  v_year int;
  v_month0 int;
  v_day0 int;
  v_hour0 int;
  v_minute0 int;
  v_second0 int;
  v_seconds int[];
  v_minutes int[];
  v_hours int[];
  v_days int[];
  v_months int[];
  v_weekdays int[];
  v_or boolean;
  v_y int;
  v_m int;
  v_d int;
  v_h int;
  v_mi int;
  v_s int;
  v_date date;
  v_last_day int;
  v_today boolean;
  v_this_hour boolean;
  v_this_minute boolean;
  v_at timestamptz;
BEGIN
  IF v_every IS NOT NULL THEN
    RETURN to_timestamp(((floor(extract(epoch FROM _cron_next.after) / v_every) + 1) * v_every)::float8);
  END IF;
  v_seconds := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'second')::int);
  v_minutes := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'minute')::int);
  v_hours := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'hour')::int);
  v_days := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'day')::int);
  v_months := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'month')::int);
  v_weekdays := ARRAY(SELECT jsonb_array_elements_text(_cron_next.spec -> 'weekday')::int);
  v_or := (_cron_next.spec ->> 'day_or_weekday')::boolean;

  v_start := date_trunc('second', _cron_next.after AT TIME ZONE _cron_next.timezone);
  v_year := extract(year FROM v_start)::int;
  v_month0 := extract(month FROM v_start)::int;
  v_day0 := extract(day FROM v_start)::int;
  v_hour0 := extract(hour FROM v_start)::int;
  v_minute0 := extract(minute FROM v_start)::int;
  v_second0 := extract(second FROM v_start)::int;

  FOR v_y IN v_year .. v_year + 50 LOOP
    FOREACH v_m IN ARRAY v_months LOOP
      CONTINUE WHEN v_y = v_year AND v_m < v_month0;
      v_last_day := extract(day FROM make_date(v_y, v_m, 1) + interval '1 month' - interval '1 day')::int;
      FOR v_d IN CASE WHEN v_y = v_year AND v_m = v_month0 THEN v_day0 ELSE 1 END .. v_last_day LOOP
        v_date := make_date(v_y, v_m, v_d);
        IF v_or THEN
          CONTINUE WHEN NOT (v_d = ANY (v_days) OR extract(dow FROM v_date)::int = ANY (v_weekdays));
        ELSE
          CONTINUE WHEN NOT (v_d = ANY (v_days) AND extract(dow FROM v_date)::int = ANY (v_weekdays));
        END IF;
        v_today := v_date = v_start::date;
        FOREACH v_h IN ARRAY v_hours LOOP
          CONTINUE WHEN v_today AND v_h < v_hour0;
          v_this_hour := v_today AND v_h = v_hour0;
          FOREACH v_mi IN ARRAY v_minutes LOOP
            CONTINUE WHEN v_this_hour AND v_mi < v_minute0;
            v_this_minute := v_this_hour AND v_mi = v_minute0;
            FOREACH v_s IN ARRAY v_seconds LOOP
              CONTINUE WHEN v_this_minute AND v_s < v_second0;
              v_at := idemq._cron_instant(v_date + make_interval(hours => v_h, mins => v_mi, secs => v_s),
                                          _cron_next.timezone);
              IF v_at > _cron_next.after THEN
                RETURN v_at;
              END IF;
            END LOOP;
          END LOOP;
        END LOOP;
      END LOOP;
    END LOOP;
  END LOOP;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._cron_next(jsonb, text, timestamptz) IS
  'The first slot of a parsed cron expression after an instant, in a time zone (DST-aware); NULL within 50 years none.';

-- ---- sql/functions/_cron_parse.sql ----
CREATE OR REPLACE FUNCTION idemq._cron_parse(cron text)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_text text := btrim(_cron_parse.cron);
  v_fields text[];
  v_every interval;
  v_seconds numeric;
  v_offset int;
  v_second int[];
  v_minute int[];
  v_hour int[];
  v_day int[];
  v_month int[];
  v_weekday int[];
  v_or boolean;
BEGIN
  IF _cron_parse.cron IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'cron must not be NULL',
      HINT = 'Pass a cron expression such as ''0 3 * * *'' (03:00 every day) or ''@every 10 minutes''.';
  END IF;

  IF v_text ~* '^@every\s' THEN
    BEGIN
      v_every := btrim(substr(v_text, 7))::interval;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('cron "%s": "%s" is not an interval', v_text, btrim(substr(v_text, 7))),
        HINT = 'Write @every followed by a PostgreSQL interval, e.g. @every 10 minutes or @every 1 hour 30 minutes.';
    END;
    v_seconds := extract(epoch FROM v_every);
    IF extract(year FROM v_every) <> 0 OR extract(month FROM v_every) <> 0
       OR v_seconds < 1 OR v_seconds <> trunc(v_seconds) THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('cron "%s": the period must be a whole number of seconds, at least 1, without months or years', v_text),
        HINT = 'Use seconds to days (e.g. @every 90 seconds, @every 7 days); for calendar periods use @monthly, @yearly or a cron expression.';
    END IF;
    RETURN jsonb_build_object('every', v_seconds::bigint);
  END IF;

  v_text := CASE lower(v_text)
    WHEN '@yearly' THEN '0 0 1 1 *'
    WHEN '@annually' THEN '0 0 1 1 *'
    WHEN '@monthly' THEN '0 0 1 * *'
    WHEN '@weekly' THEN '0 0 * * 0'
    WHEN '@daily' THEN '0 0 * * *'
    WHEN '@midnight' THEN '0 0 * * *'
    WHEN '@hourly' THEN '0 * * * *'
    ELSE v_text END;
  IF v_text LIKE '@%' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('cron "%s" is not a known macro', v_text),
      HINT = 'The macros are @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly and @every <interval>.';
  END IF;

  v_fields := regexp_split_to_array(v_text, '\s+');
  IF cardinality(v_fields) NOT IN (5, 6) OR v_text = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('cron "%s" has %s fields, not 5 or 6', v_text, CASE WHEN v_text = '' THEN 0 ELSE cardinality(v_fields) END),
      HINT = 'Write minute hour day-of-month month day-of-week (e.g. 30 2 * * MON-FRI), with an optional seconds field first.';
  END IF;
  v_offset := cardinality(v_fields) - 5;
  v_second := CASE WHEN v_offset = 1 THEN idemq._cron_field(v_fields[1], 1, 'second', 0, 59) ELSE '{0}' END;
  v_minute := idemq._cron_field(v_fields[v_offset + 1], v_offset + 1, 'minute', 0, 59);
  v_hour := idemq._cron_field(v_fields[v_offset + 2], v_offset + 2, 'hour', 0, 23);
  v_day := idemq._cron_field(v_fields[v_offset + 3], v_offset + 3, 'day of month', 1, 31);
  v_month := idemq._cron_field(v_fields[v_offset + 4], v_offset + 4, 'month', 1, 12,
    '{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}');
  v_weekday := idemq._cron_field(v_fields[v_offset + 5], v_offset + 5, 'day of week', 0, 7,
    '{SUN,MON,TUE,WED,THU,FRI,SAT}');
  v_weekday := ARRAY(SELECT DISTINCT w % 7 FROM unnest(v_weekday) w ORDER BY 1);
  v_or := v_fields[v_offset + 3] NOT LIKE '*%' AND v_fields[v_offset + 5] NOT LIKE '*%';

  -- With the OR rule any listed weekday fires; otherwise some listed day
  -- must exist in some listed month (a weekday restriction alone always meets one).
  IF NOT v_or AND NOT EXISTS (
    SELECT 1 FROM unnest(v_month) m, unnest(v_day) d
    WHERE d <= CASE WHEN m = 2 THEN 29 WHEN m IN (4, 6, 9, 11) THEN 30 ELSE 31 END) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('cron "%s" never fires: no month in field %s (month) has a day in field %s (day of month)',
                       v_text, v_offset + 4, v_offset + 3),
      HINT = 'Check the day of month against the months (February has at most 29 days; April, June, September and November 30).';
  END IF;

  RETURN jsonb_build_object('second', v_second, 'minute', v_minute, 'hour', v_hour, 'day', v_day,
                            'month', v_month, 'weekday', v_weekday, 'day_or_weekday', v_or);
END;
$$;

COMMENT ON FUNCTION idemq._cron_parse(text) IS
  'Parse and validate a cron expression (5 or 6 fields, names, steps, @macros, @every) into its value sets.';

-- ---- sql/functions/_default_retention.sql ----
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

-- ---- sql/functions/_delete_jobs.sql ----
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

-- ---- sql/functions/_enqueue_fields.sql ----
CREATE OR REPLACE FUNCTION idemq._enqueue_fields()
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
RETURN ARRAY(SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = 'idemq._planned_job'::regclass AND a.attnum > 4 AND NOT a.attisdropped
             ORDER BY a.attnum);

COMMENT ON FUNCTION idemq._enqueue_fields() IS
  'The fields of a job to enqueue (enqueue()''s parameters, enqueue_many''s element fields): idemq._planned_job''s after its plan fields.';

-- ---- sql/functions/_enqueue_limits.sql ----
CREATE OR REPLACE FUNCTION idemq._enqueue_limits()
RETURNS SETOF idemq._enqueue_limits
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT l.payload_bytes, l.key_bytes, l.task_bytes, l.parents_per_job, l.jobs_per_call, l.duration_days
  FROM idemq.enqueue_limits l;
END;

COMMENT ON FUNCTION idemq._enqueue_limits() IS
  'The limits an enqueue checks (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days): the row idemq.enqueue_limits keeps.';

-- ---- sql/functions/_enqueue_planned.sql ----
CREATE OR REPLACE FUNCTION idemq._enqueue_planned(jobs idemq._planned_job[], keyed boolean, parents boolean)
RETURNS idemq._planned_job[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans: with a custom plan (the first five calls of a session, and
-- after them whenever its estimate wins) each statement that reads the
-- jobs array took the whole array into its plan as a constant, copied it
-- and planned around it at every call: 1,100 instructions per job of a
-- 10,000-job enqueue_many, 2,900 with keys (callgrind, PostgreSQL 15;
-- bench/FINDINGS.md). enqueue_many, _parse_jobs and _insert_jobs are set
-- the same way, for the same reason.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_planned idemq._planned_job[] := CASE WHEN keyed THEN idemq._resolve_keys(jobs) ELSE jobs END;
BEGIN
  IF parents THEN
    PERFORM idemq._lock_parents(v_planned);
  END IF;
  PERFORM idemq._insert_jobs(v_planned, keyed, parents);
  RETURN v_planned;
END;
$$;

COMMENT ON FUNCTION idemq._enqueue_planned(idemq._planned_job[], boolean, boolean) IS
  'Resolve keys, lock parents and insert a checked plan of jobs: the pipeline enqueue and enqueue_many share.';

-- ---- sql/functions/_error_entry.sql ----
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

-- ---- sql/functions/_excerpt.sql ----
CREATE OR REPLACE FUNCTION idemq._excerpt(value text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN value IS NULL THEN 'NULL'
            WHEN length(value) <= 60 THEN value
            ELSE left(value, 60) || format('… (%s characters)', length(value)) END;

COMMENT ON FUNCTION idemq._excerpt(text) IS
  'The first 60 characters of an input, for error messages (bounded whatever the input).';

-- ---- sql/functions/_gone_on_success.sql ----
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

-- ---- sql/functions/_held.sql ----
CREATE OR REPLACE FUNCTION idemq._held(lease_expires_at timestamptz, locked_by text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN lease_expires_at IS NOT NULL AND locked_by IS NOT NULL;

COMMENT ON FUNCTION idemq._held(timestamptz, text) IS
  'Held by an attempt (processing, under a lease), from the lease columns: the fencing predicate, index-friendly once inlined.';

-- ---- sql/functions/_initial_state.sql ----
CREATE OR REPLACE FUNCTION idemq._initial_state(run_at timestamptz)
RETURNS idemq.job_state
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN run_at > now() THEN 'scheduled' ELSE 'enqueued' END::idemq.job_state;

COMMENT ON FUNCTION idemq._initial_state(timestamptz) IS
  'scheduled when run_at is after now(), else enqueued: the state of a job that becomes runnable at run_at.';

-- ---- sql/functions/_insert_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq._insert_jobs(jobs idemq._planned_job[], keyed boolean, parents boolean)
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
                                 idempotency_key, backoff, expires_at, traceparent)
    SELECT p.job_id, p.task, p.queue, p.payload,
           CASE WHEN parents AND p.after IS NOT NULL AND EXISTS (
                  SELECT 1 FROM idemq.jobs pj WHERE pj.id = ANY (p.after) AND pj.state <> 'succeeded')
                THEN 'awaiting'::idemq.job_state
                ELSE idemq._initial_state(p.run_at) END,
           p.priority, p.run_at, p.max_attempts, p.idempotency_key, p.backoff, p.expires_at, p.traceparent
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
END;
$$;

COMMENT ON FUNCTION idemq._insert_jobs(idemq._planned_job[], boolean, boolean) IS
  'Write a plan''s created jobs (state, continuations), count the other outcomes, and notify waiting consumers.';

-- ---- sql/functions/_is_traceparent.sql ----
CREATE OR REPLACE FUNCTION idemq._is_traceparent(value text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN value ~ '^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$';

COMMENT ON FUNCTION idemq._is_traceparent(text) IS
  'Whether a value is a W3C traceparent of version 00 (the shape of idemq.jobs.traceparent); NULL for NULL.';

-- ---- sql/functions/_job_defaults.sql ----
CREATE OR REPLACE FUNCTION idemq._job_defaults()
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{"payload": {}, "queue": "default", "priority": 0, "max_attempts": 10,
         "duplicate_policy": "allow_after_failed", "key_retention": "14 days"}'::jsonb;

COMMENT ON FUNCTION idemq._job_defaults() IS
  'Defaults of optional job fields for enqueue_many; equal to enqueue()''s DEFAULTs.';

-- ---- sql/functions/_queue_name_limit.sql ----
CREATE OR REPLACE FUNCTION idemq._queue_name_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1000;

COMMENT ON FUNCTION idemq._queue_name_limit() IS
  'The longest queue name enqueue accepts (1000 characters): it travels as the NOTIFY payload.';

-- ---- sql/functions/_job_rule_broken.sql ----
CREATE OR REPLACE FUNCTION idemq._job_rule_broken(job idemq._planned_job, limits idemq._enqueue_limits)
RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
  WHEN job.task IS NULL OR job.task = '' THEN 1
  WHEN octet_length(job.task) > limits.task_bytes THEN 2
  WHEN jsonb_typeof(job.payload) IS DISTINCT FROM 'object' THEN 3
  WHEN octet_length(job.payload::text) > limits.payload_bytes THEN 4
  WHEN job.queue = '' THEN 5
  WHEN length(job.queue) > idemq._queue_name_limit() THEN 6
  WHEN NOT isfinite(job.run_at) THEN 7
  WHEN job.max_attempts < 1 THEN 8
  WHEN job.idempotency_key = '' THEN 9
  WHEN octet_length(job.idempotency_key) > limits.key_bytes THEN 10
  WHEN cardinality(job.after) > limits.parents_per_job THEN 11
  WHEN array_position(job.after, NULL) IS NOT NULL OR 0 >= ANY (job.after) THEN 12
  WHEN job.key_retention < interval '0' THEN 13
  WHEN job.key_retention > make_interval(days => limits.duration_days::int) THEN 14
  WHEN NOT idemq._is_traceparent(job.traceparent) THEN 15
END;

COMMENT ON FUNCTION idemq._job_rule_broken(idemq._planned_job, idemq._enqueue_limits) IS
  'The number of the first value rule of enqueue a job breaks (NULL: none); _job_problem words it.';

-- ---- sql/functions/_job_problem.sql ----
CREATE OR REPLACE FUNCTION idemq._job_problem(job idemq._planned_job, limits idemq._enqueue_limits)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE idemq._job_rule_broken(job, limits)
  WHEN 1 THEN
    ARRAY['task must be a non-empty string: the name of a task your workers handle', NULL]
  WHEN 2 THEN
    ARRAY[format('task is %s bytes, over the limit of %s bytes (task_bytes): %s',
                 octet_length(job.task), limits.task_bytes, idemq._excerpt(job.task)),
          'Name tasks briefly, e.g. ''send_email''; an admin can raise task_bytes in idemq.settings.']
  WHEN 3 THEN
    ARRAY[format('payload must be a JSON object, not %s', idemq._excerpt(coalesce(job.payload::text, 'NULL'))),
          'Wrap the value in an object, e.g. {"value": ...}.']
  WHEN 4 THEN
    ARRAY[format('payload is %s bytes of JSON text, over the limit of %s bytes (payload_bytes): %s',
                 octet_length(job.payload::text), limits.payload_bytes, idemq._excerpt(job.payload::text)),
          'Store large data elsewhere (a table, object storage) and put its id in the payload; '
          'an admin can raise payload_bytes in idemq.settings.']
  WHEN 5 THEN
    ARRAY['queue must be a non-empty string', 'Leave queue out for the default queue.']
  WHEN 6 THEN
    ARRAY[format('queue must be at most %s characters, not %s: %s', idemq._queue_name_limit(), length(job.queue),
                 idemq._excerpt(job.queue)),
          'Use a short queue name: it travels as the NOTIFY payload.']
  WHEN 7 THEN
    ARRAY[format('run_at must be a finite time, not %s', job.run_at),
          'Pass a real time, e.g. now() + interval ''1 hour'', or leave run_at out to run at once.']
  WHEN 8 THEN
    ARRAY[format('max_attempts must be at least 1, not %s', job.max_attempts), NULL]
  WHEN 9 THEN
    ARRAY['idempotency_key must be a non-empty string or null', NULL]
  WHEN 10 THEN
    ARRAY[format('idempotency_key is %s bytes, over the limit of %s bytes (key_bytes): %s',
                 octet_length(job.idempotency_key), limits.key_bytes, idemq._excerpt(job.idempotency_key)),
          'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''order:'' || md5(...).']
  WHEN 11 THEN
    ARRAY[format('after names %s parents, over the limit of %s (parents_per_job)', cardinality(job.after),
                 limits.parents_per_job),
          'Wait for fewer jobs: chain through an intermediate job that waits for a part of them; '
          'an admin can raise parents_per_job in idemq.settings.']
  WHEN 12 THEN
    ARRAY[format('after must be an array of job ids, not %s', idemq._excerpt(job.after::text)), NULL]
  WHEN 13 THEN
    ARRAY[format('key_retention must not be negative, not %s', job.key_retention),
          'key_retention is how long a finished job''s key stays held, e.g. ''14 days''.']
  WHEN 14 THEN
    ARRAY[format('key_retention must be at most %s days (duration_days), not %s', limits.duration_days, job.key_retention),
          format('Use a retention of at most %s days (duration_days in idemq.settings).', limits.duration_days)]
  WHEN 15 THEN
    ARRAY[format('traceparent must be a W3C traceparent (00-<32 hex digits>-<16 hex digits>-<2 hex digits>, '
                 'lower case, ids not all zeros), not %s', idemq._excerpt(job.traceparent)),
          'Pass the traceparent of the producer''s span as OpenTelemetry formats it, '
          'e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01, or leave traceparent out.']
END;

COMMENT ON FUNCTION idemq._job_problem(idemq._planned_job, idemq._enqueue_limits) IS
  'What is wrong with one job to enqueue, and the fix (NULL: nothing): the value rules of enqueue and enqueue_many, once.';

-- ---- sql/functions/_keep_enqueue_limits.sql ----
CREATE OR REPLACE FUNCTION idemq._keep_enqueue_limits()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM 1 FROM idemq.enqueue_limits FOR UPDATE;
  DELETE FROM idemq.enqueue_limits;
  INSERT INTO idemq.enqueue_limits (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days)
  SELECT coalesce(max(s.value) FILTER (WHERE s.name = 'payload_bytes'), idemq._limit('payload_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'key_bytes'), idemq._limit('key_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'task_bytes'), idemq._limit('task_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'parents_per_job'), idemq._limit('parents_per_job')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'jobs_per_call'), idemq._limit('jobs_per_call')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'duration_days'), idemq._limit('duration_days'))
  FROM idemq.settings s;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._keep_enqueue_limits() IS
  'Trigger on idemq.settings: rewrites the one row of idemq.enqueue_limits from the settings rows of its fields.';

-- ---- sql/functions/_keep_success_retention.sql ----
CREATE OR REPLACE FUNCTION idemq._keep_success_retention()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM 1 FROM idemq.success_retention FOR UPDATE;
  DELETE FROM idemq.success_retention;
  -- The settings row is read directly, its name from _retention_setting, as
  -- _default_retention reads it through _limit.
  INSERT INTO idemq.success_retention (default_zero, zero_tasks, kept_tasks, zero_queues, kept_queues)
  SELECT s.value = 0,
         coalesce(array_agg(r.task ORDER BY r.task) FILTER (WHERE r.task IS NOT NULL AND r.keep = interval '0'), '{}'),
         coalesce(array_agg(r.task ORDER BY r.task) FILTER (WHERE r.task IS NOT NULL AND r.keep > interval '0'), '{}'),
         coalesce(array_agg(r.queue ORDER BY r.queue) FILTER (WHERE r.queue IS NOT NULL AND r.keep = interval '0'), '{}'),
         coalesce(array_agg(r.queue ORDER BY r.queue) FILTER (WHERE r.queue IS NOT NULL AND r.keep > interval '0'), '{}')
  FROM idemq.settings s
  LEFT JOIN idemq.retention r ON r.state = 'succeeded'
  WHERE s.name = idemq._retention_setting('succeeded')
  GROUP BY s.value;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._keep_success_retention() IS
  'Trigger on idemq.settings and idemq.retention: rewrites the one row of idemq.success_retention (which succeeded jobs have retention 0).';

-- ---- sql/functions/_key_leaders.sql ----
CREATE OR REPLACE FUNCTION idemq._key_leaders(jobs idemq._planned_job[], first_round boolean)
RETURNS TABLE(key text, job_id bigint, task text, payload jsonb, payload_md5 text,
              duplicate_policy idemq.duplicate_policy, elements bigint, retention interval)
LANGUAGE sql IMMUTABLE
BEGIN ATOMIC
  SELECT l.idempotency_key, l.job_id, l.task, l.payload, md5(l.payload::text), l.duplicate_policy, l.elements,
         l.key_retention
  FROM (SELECT DISTINCT ON (p.idempotency_key) p.idempotency_key, p.job_id, p.task, p.payload, p.duplicate_policy,
               count(*) OVER (PARTITION BY p.idempotency_key) AS elements, p.key_retention
        FROM unnest(jobs) p
        WHERE p.idempotency_key IS NOT NULL AND (first_round OR p.outcome IS NULL)
        ORDER BY p.idempotency_key, p.ordinal) l
  ORDER BY l.idempotency_key;
END;

COMMENT ON FUNCTION idemq._key_leaders(idemq._planned_job[], boolean) IS
  'The first undecided element of each idempotency key in a plan, in key order: the one that decides for the key.';

-- ---- sql/functions/_limit.sql ----
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

-- ---- sql/functions/_lock_job.sql ----
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

-- ---- sql/functions/_lock_parents.sql ----
CREATE OR REPLACE FUNCTION idemq._lock_parents(jobs idemq._planned_job[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_parents bigint[];
  v_missing bigint;
BEGIN
  v_parents := ARRAY(SELECT DISTINCT a FROM unnest(jobs) p, unnest(p.after) a ORDER BY a);
  IF cardinality(v_parents) = 0 THEN
    RETURN;
  END IF;
  PERFORM 1 FROM idemq.jobs j WHERE j.id = ANY (v_parents) ORDER BY j.id FOR NO KEY UPDATE;
  SELECT a INTO v_missing
  FROM unnest(v_parents) a
  WHERE NOT EXISTS (SELECT 1 FROM idemq.jobs j WHERE j.id = a)
  LIMIT 1;
  IF v_missing IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('parent job %s (named in after) does not exist', v_missing),
      HINT = 'Name existing job ids in after; nothing was enqueued.';
  END IF;
  UPDATE idemq.jobs AS j SET has_children = true WHERE j.id = ANY (v_parents) AND NOT j.has_children;
END;
$$;

COMMENT ON FUNCTION idemq._lock_parents(idemq._planned_job[]) IS
  'Lock the parents named in after (in id order), raise IQ404 for a missing one, and mark them as having children.';

-- ---- sql/functions/_name_key.sql ----
CREATE OR REPLACE FUNCTION idemq._name_key(name text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(name, 0);

COMMENT ON FUNCTION idemq._name_key(text) IS
  'The 64-bit key of a task or queue name in the runnable index jobs_runnable_by_task_queue (its names are compared too).';

-- ---- sql/functions/_names_valid.sql ----
CREATE OR REPLACE FUNCTION idemq._names_valid(names text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN names IS NULL OR (cardinality(names) > 0 AND ('' = ANY (names)) IS FALSE);

COMMENT ON FUNCTION idemq._names_valid(text[]) IS
  'NULL, or a non-empty list of names none of which is NULL or empty: a valid queue or task filter.';

-- ---- sql/functions/_notify_waiting.sql ----
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

-- ---- sql/functions/_on_job_finished.sql ----
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

-- ---- sql/functions/_pairs_by_id.sql ----
CREATE OR REPLACE FUNCTION idemq._pairs_by_id(job_ids bigint[], attempts int[], operation text, null_hint text,
                                              OUT ids bigint[], OUT attempts_by_id int[])
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF job_ids IS NULL OR attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_ids and attempts must not be NULL', operation),
      HINT = null_hint;
  END IF;
  IF cardinality(job_ids) <> cardinality(attempts) OR cardinality(job_ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: job_ids (%s) and attempts (%s) must have the same length, at most 10000',
                       operation, cardinality(job_ids), cardinality(attempts)),
      HINT = 'attempts[i] is the attempt that claimed job_ids[i].';
  END IF;
  -- plpgsql, not LANGUAGE sql: a SQL function with a SET clause is never
  -- inlined, and PostgreSQL 15-17 parse and plan its body again at every
  -- call from complete_many's or heartbeat's statement (18 caches it);
  -- plpgsql keeps the plan for the session. As LANGUAGE sql, `npm run bench
  -- -- profile` (process.c10, 20,000 jobs, PG15): 180 us per call, 19.3 us
  -- per completed job.
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}')
    INTO ids, attempts_by_id
  FROM (SELECT u.id, max(u.attempt) AS attempt
        FROM unnest(job_ids, attempts) AS u(id, attempt)
        WHERE u.id IS NOT NULL
        GROUP BY u.id) t;
END;
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[], text, text) IS
  'Check (job_id, attempt) pairs and sort them by id, each id once with its highest attempt, for width_bucket() lookups.';

-- ---- sql/functions/_parse_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq._parse_jobs(jobs jsonb, OUT planned idemq._planned_job[], OUT keyed boolean,
                                             OUT parents boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the jobs array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_fields text[] := idemq._enqueue_fields();
  v_policies text[] := enum_range(NULL::idemq.duplicate_policy)::text[];
  v_now timestamptz := now();
  -- The defaults, typed once: read per element (v_defaults->>'priority', then
  -- numeric_in and enum_in for each element without the field) they cost
  -- about 8 ms per 20,000 elements (backend CPU, enqueue.bulk's batch).
  v_payload jsonb := idemq._job_defaults()->'payload';
  v_queue text := idemq._job_defaults()->>'queue';
  v_priority int := (idemq._job_defaults()->>'priority')::int;
  v_max_attempts int := (idemq._job_defaults()->>'max_attempts')::int;
  v_policy idemq.duplicate_policy := (idemq._job_defaults()->>'duplicate_policy')::idemq.duplicate_policy;
  v_key_retention interval := (idemq._job_defaults()->>'key_retention')::interval;
  v_bad int;
  v_problem text;
  v_ord int;
  v_value_problem text[];
  v_hint text;
  v_limits idemq._enqueue_limits;
  v_bad_backoffs jsonb[];
  v_elem jsonb;
BEGIN
  IF jobs IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'jobs must not be NULL',
      HINT = 'Pass a JSON array of job objects, e.g. [{"task": "send_email"}].';
  END IF;
  IF jsonb_typeof(jobs) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('jobs must be a JSON array of job objects, not %s', jsonb_typeof(jobs)),
      HINT = 'Pass jsonb like [{"task": "send_email", "payload": {"to": "a@example.com"}}].';
  END IF;
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  IF jsonb_array_length(jobs) > v_limits.jobs_per_call THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('jobs has %s elements, over the limit of %s jobs per call (jobs_per_call)',
                       jsonb_array_length(jobs), v_limits.jobs_per_call),
      HINT = format('Split the batch into calls of at most %s jobs (one transaction can hold several calls); '
                    'an admin can raise jobs_per_call in idemq.settings. Nothing was enqueued.', v_limits.jobs_per_call);
  END IF;

  BEGIN
    -- One pass in C (jsonb_to_recordset, every field as text or jsonb, which
    -- any JSON value converts to) and cheap checks that skip absent fields.
    -- OFFSET 0 keeps the subquery `d` from being pulled up: pulled up, the
    -- checks would run once per use of `shape` (three). A MATERIALIZED CTE
    -- did the same but copied every decoded row into a tuplestore first:
    -- 10 ms more per 20,000 elements (backend CPU, 46 against 36 ms).
    -- In element order (the subquery scan keeps its input's order): ids are
    -- taken in that order, and the array needs no sort.
    SELECT array_agg(CASE WHEN d.shape IS NULL THEN ROW(
               d.ord, nextval('idemq.jobs_id_seq'), 'created', NULL,
               d.task,
               coalesce(nullif(d.payload, 'null'), v_payload),
               coalesce(d.queue, v_queue),
               coalesce(d.run_at::timestamptz, v_now),
               coalesce(d.priority::numeric::int, v_priority),
               coalesce(d.max_attempts::numeric::int, v_max_attempts),
               d.idempotency_key,
               coalesce(d.duplicate_policy::idemq.duplicate_policy, v_policy),
               nullif(d.backoff, 'null'),
               d.expires_at::timestamptz,
               CASE WHEN jsonb_typeof(d.after) = 'array' AND jsonb_array_length(d.after) > 0
                    THEN ARRAY(SELECT a::numeric::bigint FROM jsonb_array_elements_text(d.after) a) END,
               coalesce(d.key_retention::interval, v_key_retention),
               d.traceparent
             )::idemq._planned_job END),
           coalesce(bool_or(d.idempotency_key IS NOT NULL), false),
           coalesce(bool_or(jsonb_typeof(d.after) = 'array' AND jsonb_array_length(d.after) > 0), false),
           min(d.ord) FILTER (WHERE d.shape IS NOT NULL),
           (array_agg(d.shape ORDER BY d.ord) FILTER (WHERE d.shape IS NOT NULL))[1]
    FROM (SELECT r.*, CASE
          WHEN r.v - v_fields <> '{}' THEN
            format('has an unknown field "%s" (fields: %s)',
                   idemq._excerpt((SELECT min(f) FROM jsonb_object_keys(r.v - v_fields) f)), array_to_string(v_fields, ', '))
          WHEN r.task IS NOT NULL AND jsonb_typeof(r.v->'task') <> 'string' THEN
            format('task must be a string, not %s', idemq._excerpt((r.v->'task')::text))
          WHEN r.queue IS NOT NULL AND jsonb_typeof(r.v->'queue') <> 'string' THEN
            format('queue must be a string, not %s', idemq._excerpt((r.v->'queue')::text))
          WHEN r.run_at IS NOT NULL AND jsonb_typeof(r.v->'run_at') <> 'string' THEN
            format('run_at must be a timestamp string, not %s', idemq._excerpt((r.v->'run_at')::text))
          WHEN r.expires_at IS NOT NULL AND jsonb_typeof(r.v->'expires_at') <> 'string' THEN
            format('expires_at must be a timestamp string, not %s', idemq._excerpt((r.v->'expires_at')::text))
          WHEN r.priority IS NOT NULL AND (jsonb_typeof(r.v->'priority') <> 'number'
               OR r.priority::numeric NOT BETWEEN -2147483648 AND 2147483647
               OR r.priority::numeric <> trunc(r.priority::numeric)) THEN
            format('priority must be a whole number (higher runs first), not %s', idemq._excerpt((r.v->'priority')::text))
          WHEN r.max_attempts IS NOT NULL AND (jsonb_typeof(r.v->'max_attempts') <> 'number'
               OR r.max_attempts::numeric NOT BETWEEN -2147483648 AND 2147483647
               OR r.max_attempts::numeric <> trunc(r.max_attempts::numeric)) THEN
            format('max_attempts must be a whole number >= 1, not %s', idemq._excerpt((r.v->'max_attempts')::text))
          WHEN r.idempotency_key IS NOT NULL AND jsonb_typeof(r.v->'idempotency_key') <> 'string' THEN
            format('idempotency_key must be a string or null, not %s', idemq._excerpt((r.v->'idempotency_key')::text))
          WHEN r.duplicate_policy IS NOT NULL AND (jsonb_typeof(r.v->'duplicate_policy') <> 'string'
               OR r.duplicate_policy <> ALL (v_policies)) THEN
            format('duplicate_policy must be one of %s, not %s', array_to_string(v_policies, ', '),
                   idemq._excerpt((r.v->'duplicate_policy')::text))
          WHEN r.after IS NOT NULL AND jsonb_typeof(r.after) <> 'null' AND (jsonb_typeof(r.after) <> 'array'
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(r.after) a
                          WHERE jsonb_typeof(a) NOT IN ('number', 'null')
                             OR (jsonb_typeof(a) = 'number' AND (a::numeric NOT BETWEEN 1 AND 9223372036854775807
                                                                 OR a::numeric <> trunc(a::numeric))))) THEN
            format('after must be an array of job ids, not %s', idemq._excerpt(r.after::text))
          WHEN r.key_retention IS NOT NULL AND jsonb_typeof(r.v->'key_retention') <> 'string' THEN
            format('key_retention must be an interval string such as "14 days", not %s',
                   idemq._excerpt((r.v->'key_retention')::text))
          WHEN r.traceparent IS NOT NULL AND jsonb_typeof(r.v->'traceparent') <> 'string' THEN
            format('traceparent must be a string (a W3C traceparent) or null, not %s',
                   idemq._excerpt((r.v->'traceparent')::text))
        END AS shape
      FROM ROWS FROM (jsonb_array_elements(jobs),
                      jsonb_to_recordset(jobs) AS (task text, payload jsonb, queue text, run_at text, priority text,
                        max_attempts text, idempotency_key text, duplicate_policy text, backoff jsonb,
                        expires_at text, after jsonb, key_retention text, traceparent text)) WITH ORDINALITY
           AS r(v, task, payload, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy,
                backoff, expires_at, after, key_retention, traceparent, ord)
          OFFSET 0) d
    INTO planned, keyed, parents, v_bad, v_problem;
  EXCEPTION WHEN data_exception THEN
    -- An element that is not an object, or a timestamp or interval that does not parse,
    -- fails the statement: find the first such element; an earlier
    -- element's problem comes first.
    FOR v_bad, v_elem IN SELECT e.ord, e.v FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(v, ord) LOOP
      v_problem := CASE WHEN jsonb_typeof(v_elem) <> 'object' THEN format('must be a JSON object, not %s', idemq._excerpt(v_elem::text)) END;
      IF v_problem IS NULL THEN
        BEGIN
          PERFORM (v_elem->>'run_at')::timestamptz, (v_elem->>'expires_at')::timestamptz,
                  (v_elem->>'key_retention')::interval;
        EXCEPTION WHEN data_exception THEN
          v_problem := format('run_at/expires_at is not a timestamp, or key_retention not an interval: %s',
                              idemq._excerpt(SQLERRM));
        END;
      END IF;
      IF v_problem IS NOT NULL THEN
        IF v_bad > 1 THEN
          PERFORM idemq._parse_jobs(jsonb_path_query_array(jobs, format('$[0 to %s]', v_bad - 2)::jsonpath));
        END IF;
        PERFORM idemq._raise_bad_job(v_problem, v_bad);
      END IF;
    END LOOP;
    RAISE;
  END;
  -- The value rules, on the decoded elements before the first that did not
  -- decode (its own problem comes first otherwise).
  SELECT p.ordinal, idemq._job_problem(p, v_limits) INTO v_ord, v_value_problem
  FROM unnest(planned) p
  WHERE p.ordinal < coalesce(v_bad, 2147483647) AND idemq._job_rule_broken(p, v_limits) IS NOT NULL
  ORDER BY p.ordinal LIMIT 1;
  IF FOUND THEN
    v_bad := v_ord;
    v_problem := v_value_problem[1];
    v_hint := v_value_problem[2];
  END IF;
  IF v_bad IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem, v_bad, v_hint);
  END IF;

  IF jobs @? '$[*].backoff ? (@.type() != "null")' THEN
    SELECT array_agg(d.spec) INTO v_bad_backoffs
    FROM (SELECT DISTINCT p.backoff AS spec FROM unnest(planned) p WHERE p.backoff IS NOT NULL) d
    WHERE idemq._backoff_problem(d.spec) IS NOT NULL;
    IF v_bad_backoffs IS NOT NULL THEN
      SELECT p.ordinal, idemq._backoff_problem(p.backoff) INTO v_bad, v_problem
      FROM unnest(planned) p WHERE p.backoff = ANY (v_bad_backoffs)
      ORDER BY p.ordinal LIMIT 1;
      PERFORM idemq._raise_bad_job(v_problem, v_bad);
    END IF;
  END IF;
  planned := coalesce(planned, '{}');
END;
$$;

COMMENT ON FUNCTION idemq._parse_jobs(jsonb) IS
  'Parse and check enqueue_many''s JSON array into planned jobs, raising 22023 for the first bad element.';

-- ---- sql/functions/_policy_rejects.sql ----
CREATE OR REPLACE FUNCTION idemq._policy_rejects(policy idemq.duplicate_policy, finished_state idemq.job_state)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE policy
  WHEN 'allow_after_failed' THEN false
  WHEN 'reject_if_failed' THEN finished_state = 'failed'
  WHEN 'reject_always' THEN true
  WHEN 'reject_if_succeeded' THEN finished_state = 'succeeded'
END;

COMMENT ON FUNCTION idemq._policy_rejects(idemq.duplicate_policy, idemq.job_state) IS
  'The duplicate-policy matrix: true when the policy refuses a new job after that terminal state.';

-- ---- sql/functions/_raise_bad_job.sql ----
CREATE OR REPLACE FUNCTION idemq._raise_bad_job(problem text, ordinal int, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22023',
    MESSAGE = CASE WHEN ordinal IS NULL THEN problem ELSE format('jobs[%s] %s', ordinal, problem) END,
    HINT = coalesce(hint || ' ', '')
           || CASE WHEN ordinal IS NULL THEN 'Fix the argument; nothing was enqueued.'
                   ELSE format('Fix element %s (1-based) of the jobs array; nothing was enqueued.', ordinal) END;
END;
$$;

COMMENT ON FUNCTION idemq._raise_bad_job(text, int, text) IS
  'Raise 22023 for a refused job, naming jobs[N] for an enqueue_many element, with the fix; nothing was enqueued.';

-- ---- sql/functions/_raise_bad_names.sql ----
CREATE OR REPLACE FUNCTION idemq._raise_bad_names(operation text, what text, names text[], null_means text, hint text,
                                                  max_length int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22023',
    -- left(what, -1): 'queues' -> 'queue names'.
    MESSAGE = format('%s: %s must be NULL (%s) or a non-empty list of %s names%s, not %s',
                     operation, what, null_means, left(what, -1),
                     CASE WHEN max_length IS NOT NULL THEN format(' of 1 to %s characters', max_length) END,
                     idemq._excerpt(names::text)),
    HINT = hint;
END;
$$;

COMMENT ON FUNCTION idemq._raise_bad_names(text, text, text[], text, text, int) IS
  'Raise 22023 for a queue or task filter that is neither NULL nor a non-empty list of non-empty names.';

-- ---- sql/functions/_raise_not_held.sql ----
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

-- ---- sql/functions/_raise_not_owner.sql ----
CREATE OR REPLACE FUNCTION idemq._raise_not_owner(operation text, key text, owner text, hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('%s: the claim on effect "%s" is not held by %s',
                     operation, idemq._excerpt(_raise_not_owner.key), idemq._excerpt(_raise_not_owner.owner)),
    DETAIL = jsonb_build_object('key', _raise_not_owner.key, 'owner', _raise_not_owner.owner)::text,
    HINT = hint;
END;
$$;

COMMENT ON FUNCTION idemq._raise_not_owner(text, text, text, text) IS
  'Raise IQ410 (DETAIL {"key","owner"}) for an effect claim that this owner does not hold.';

-- ---- sql/functions/_raise_null_argument.sql ----
CREATE OR REPLACE FUNCTION idemq._raise_null_argument(operation text, argument text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22004',
    MESSAGE = format('%s: %s must not be NULL', operation, argument),
    HINT = format('Pass a value for %s, or leave the argument out to use its default.', argument);
END;
$$;

COMMENT ON FUNCTION idemq._raise_null_argument(text, text) IS
  'Raise 22004 for an argument passed as NULL where it has a default, with a HINT to leave it out.';

-- ---- sql/functions/_resolve_keys.sql ----
CREATE OR REPLACE FUNCTION idemq._resolve_keys(jobs idemq._planned_job[])
RETURNS idemq._planned_job[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_round int := 0;
  v_undecided bigint;
  v_leaders bigint;
  v_inserted bigint;
BEGIN
  -- A batch whose keys are all new, the common bulk case, first tries a
  -- plain INSERT of its leaders in a subtransaction: ON CONFLICT DO NOTHING
  -- checks the index before each insert and confirms each speculative
  -- insertion in the WAL, which cost 25 ms per 20,000 new keys (backend CPU)
  -- and 26 bytes of WAL per key (enqueue.bulk-keyed: 536 B/job with the plain
  -- insert, 562 with ON CONFLICT). A key that exists, or that a concurrent
  -- inserter commits first (the insert waits for its transaction, as ON
  -- CONFLICT does), raises unique_violation: the subtransaction rolls back
  -- and the round below decides with ON CONFLICT. A first key that exists
  -- (a resubmitted batch) skips the attempt. Only for batches of 64 elements
  -- or more: each attempt holds a subtransaction id until the caller's
  -- transaction ends, and a transaction with more than 64 of them slows every
  -- session's snapshots; below that ON CONFLICT's cost is a few microseconds.
  IF cardinality(jobs) >= 64
     AND NOT EXISTS (SELECT 1 FROM idemq.keys k WHERE k.key = (jobs[1]).idempotency_key) THEN
    BEGIN
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
      SELECT l.key, l.job_id, l.task, l.payload_md5, l.retention FROM idemq._key_leaders(jobs, true) l ORDER BY l.key;
      GET DIAGNOSTICS v_inserted = ROW_COUNT;
      v_leaders := v_inserted;
      SELECT count(*) INTO v_undecided FROM unnest(jobs) p WHERE p.idempotency_key IS NOT NULL;
    EXCEPTION WHEN unique_violation THEN
      v_inserted := NULL;
    END;
  END IF;

  LOOP
    -- The plan's outcomes start as `created`: in the first round every keyed
    -- element is undecided, later only those left NULL by the round before.
    IF v_round > 0 OR v_inserted IS NULL THEN
      WITH leader AS MATERIALIZED (
        SELECT * FROM idemq._key_leaders(jobs, v_round = 0)
      ), ins AS (
        INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
        SELECT l.key, l.job_id, l.task, l.payload_md5, l.retention FROM leader l ORDER BY l.key
        ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
        RETURNING 1
      )
      SELECT (SELECT coalesce(sum(l.elements), 0) FROM leader l), (SELECT count(*) FROM leader),
             (SELECT count(*) FROM ins)
      INTO v_undecided, v_leaders, v_inserted;
    END IF;
    -- Every undecided element led a new key: all stay created.
    EXIT WHEN v_inserted = v_undecided;

    v_round := v_round + 1;
    IF v_round > 10 THEN
      RAISE EXCEPTION USING ERRCODE = '40001',
        MESSAGE = 'idempotency keys kept changing during enqueue (pruned and re-created concurrently)',
        HINT = 'Retry the call.';
    END IF;

    IF v_inserted < v_leaders THEN
      UPDATE idemq.keys AS k
      SET job_id = l.job_id, task = l.task, payload_md5 = l.payload_md5, retention = l.retention,
          finished_state = NULL, finished_at = NULL, created_at = now()
      FROM idemq._key_leaders(jobs, v_round = 1) l
      WHERE k.key = l.key
        AND k.finished_state IS NOT NULL
        AND NOT idemq._policy_rejects(l.duplicate_policy, k.finished_state);
    END IF;

    -- Decide from the key rows as they now stand (this call's writes
    -- included). A key held by this call's leader has no job row yet: its
    -- payload is the leader's. An active key's job exists (purge deletes only
    -- terminal jobs) and committed with the key row, so its payload settles
    -- jsonb equality. A key that vanished (pruned) or turned terminal in
    -- between stays undecided (outcome NULL) for the next round. Named
    -- fields replace the decided ones (jsonb_populate_record on the row).
    jobs := ARRAY(
      SELECT CASE WHEN w.undecided
                  THEN jsonb_populate_record(w.p, jsonb_build_object(
                         'outcome', d.outcome,
                         'job_id', CASE WHEN coalesce(d.outcome, 'created') = 'created' THEN (w.p).job_id
                                        ELSE w.holder_id END,
                         'existing_state', CASE WHEN d.outcome = 'rejected' THEN w.holder_finished END,
                         'traceparent', CASE WHEN coalesce(d.outcome, 'created') = 'created' THEN (w.p).traceparent
                                             WHEN w.holder_id = w.lead_job_id THEN w.lead_traceparent
                                             ELSE w.holder_traceparent END))
                  ELSE w.p END
      FROM (SELECT p, p.idempotency_key IS NOT NULL AND (v_round = 1 OR p.outcome IS NULL) AS undecided,
                   h.job_id AS holder_id, h.task AS holder_task, h.payload_md5 AS holder_md5,
                   h.finished_state AS holder_finished, h.payload AS holder_payload,
                   h.traceparent AS holder_traceparent, first_value(p.traceparent) OVER k AS lead_traceparent,
                   first_value(p.ordinal) OVER k AS lead_ordinal, first_value(p.job_id) OVER k AS lead_job_id,
                   first_value(p.payload) OVER k AS lead_payload,
                   first_value(p.duplicate_policy) OVER k AS lead_policy
            FROM unnest(jobs) p
            LEFT JOIN LATERAL (
              SELECT hk.job_id, hk.task, hk.payload_md5, hk.finished_state, hj.payload, hj.traceparent
              FROM idemq.keys hk
              LEFT JOIN idemq.jobs hj ON hj.id = hk.job_id AND hk.finished_state IS NULL
              WHERE hk.key = p.idempotency_key) h ON true
            WINDOW k AS (PARTITION BY p.idempotency_key ORDER BY p.ordinal)) w
      CROSS JOIN LATERAL (SELECT CASE
          WHEN w.holder_id IS NULL THEN NULL
          WHEN w.holder_id = w.lead_job_id AND (w.p).ordinal = w.lead_ordinal THEN 'created'
          WHEN w.holder_id = w.lead_job_id OR w.holder_finished IS NULL THEN
            CASE WHEN (w.p).task = w.holder_task
                      AND (md5((w.p).payload::text) = w.holder_md5
                           OR (w.p).payload = coalesce(w.holder_payload, w.lead_payload))
                 THEN 'deduplicated' ELSE 'conflict' END
          WHEN idemq._policy_rejects(w.lead_policy, w.holder_finished) THEN 'rejected'
        END AS outcome) d
      ORDER BY (w.p).ordinal);
  END LOOP;
  RETURN jobs;
END;
$$;

COMMENT ON FUNCTION idemq._resolve_keys(idemq._planned_job[]) IS
  'Decide every keyed element of a plan against the key ledger (created, deduplicated, rejected, conflict), writing the key rows it wins.';

-- ---- sql/functions/_retention_setting.sql ----
CREATE OR REPLACE FUNCTION idemq._retention_setting(state idemq.job_state)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'retention_' || state::text || '_seconds';

COMMENT ON FUNCTION idemq._retention_setting(idemq.job_state) IS
  'The settings row of a terminal state''s default retention: retention_<state>_seconds.';

-- ---- sql/functions/_runnable_jobs.sql ----
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

-- ---- sql/functions/_success_retention.sql ----
CREATE OR REPLACE FUNCTION idemq._success_retention()
RETURNS TABLE(any_zero boolean, default_zero boolean, zero_tasks text[], kept_tasks text[],
              zero_queues text[], kept_queues text[])
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT r.default_zero OR cardinality(r.zero_tasks) > 0 OR cardinality(r.zero_queues) > 0,
         r.default_zero, r.zero_tasks, r.kept_tasks, r.zero_queues, r.kept_queues
  FROM idemq.success_retention r;
END;

COMMENT ON FUNCTION idemq._success_retention() IS
  'Which succeeded jobs have retention 0 (default, tasks, queues), read once per completion call from idemq.success_retention.';

-- ---- sql/functions/_tick.sql ----
CREATE OR REPLACE FUNCTION idemq._tick(at timestamptz)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_created int := 0;
  v_s record;
  v_spec jsonb;
  v_on_time timestamptz[];
  v_missed timestamptz[];
  v_slot timestamptz;
  v_last_job bigint;
  v_last_slot timestamptz;
  v_last_state idemq.job_state;
  v_skipped int;
  v_after bigint[];
  v_job bigint;
  v_deduplicated boolean;
BEGIN
  FOR v_s IN
    SELECT s.name, s.cron, s.timezone, s.task, s.payload, s.queue, s.priority, s.max_attempts,
           s.overlap, s.misfire, s.misfire_grace, s.next_at, s.last_job_id, s.last_slot_at
    FROM idemq.schedules s
    WHERE s.next_at <= _tick.at
    ORDER BY s.next_at, s.name
    FOR UPDATE SKIP LOCKED
  LOOP
    v_spec := idemq._cron_parse(v_s.cron);
    v_on_time := idemq._cron_latest(v_spec, v_s.timezone,
                                    greatest(v_s.next_at, _tick.at - v_s.misfire_grace + interval '1 microsecond'),
                                    _tick.at, 100);
    v_missed := '{}';
    IF v_s.next_at <= _tick.at - v_s.misfire_grace THEN
      IF v_s.misfire = 'all' THEN
        v_missed := idemq._cron_latest(v_spec, v_s.timezone, v_s.next_at, _tick.at - v_s.misfire_grace,
                                       100 - cardinality(v_on_time));
      ELSIF v_s.misfire = 'once' AND cardinality(v_on_time) = 0 THEN
        v_missed := idemq._cron_latest(v_spec, v_s.timezone, v_s.next_at, _tick.at - v_s.misfire_grace, 1);
      END IF;
    END IF;

    v_last_job := v_s.last_job_id;
    v_last_slot := v_s.last_slot_at;
    v_skipped := 0;
    FOREACH v_slot IN ARRAY v_missed || v_on_time LOOP
      v_after := NULL;
      IF v_s.overlap <> 'allow' THEN
        SELECT j.state INTO v_last_state FROM idemq.jobs j WHERE j.id = v_last_job;
        IF v_last_state = ANY (idemq.active_states()) THEN
          IF v_s.overlap = 'skip' OR v_last_state <> 'processing' THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
          END IF;
          v_after := ARRAY[v_last_job];
        END IF;
      END IF;
      BEGIN
        SELECT e.job_id, e.deduplicated INTO v_job, v_deduplicated
        FROM idemq.enqueue(
          task => v_s.task, payload => v_s.payload, queue => v_s.queue, priority => v_s.priority,
          max_attempts => v_s.max_attempts,
          idempotency_key => format('schedule:%s:%s', v_s.name,
                                    to_char(v_slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
          duplicate_policy => 'reject_always', after => v_after) e;
      EXCEPTION WHEN SQLSTATE 'IQ409' OR SQLSTATE 'IQ422' THEN
        -- The slot's key was used already: the slot ran (or was replayed) before.
        CONTINUE;
      END;
      IF NOT v_deduplicated THEN
        v_created := v_created + 1;
      END IF;
      v_last_job := v_job;
      v_last_slot := v_slot;
    END LOOP;

    UPDATE idemq.schedules AS s
    SET next_at = coalesce(idemq._cron_next(v_spec, v_s.timezone, _tick.at), 'infinity'),
        last_slot_at = v_last_slot,
        last_job_id = v_last_job,
        skipped = s.skipped + v_skipped
    WHERE s.name = v_s.name;
  END LOOP;
  RETURN v_created;
END;
$$;

COMMENT ON FUNCTION idemq._tick(timestamptz) IS
  'tick() on a given clock: enqueue each due slot of every due schedule once, by its overlap and misfire policies.';

-- ---- sql/functions/_unsuccessful_states.sql ----
CREATE OR REPLACE FUNCTION idemq._unsuccessful_states()
RETURNS idemq.job_state[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY['failed', 'cancelled', 'expired']::idemq.job_state[];

COMMENT ON FUNCTION idemq._unsuccessful_states() IS
  'The terminal states other than succeeded (failed, cancelled, expired): retry() takes them, and a parent in one cancels its children.';

-- ---- sql/functions/_wait_key.sql ----
CREATE OR REPLACE FUNCTION idemq._wait_key(queue text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ('x' || left(md5(CASE WHEN queue IS NULL THEN 'idemq:all-queues' ELSE 'idemq:queue:' || queue END), 16))::bit(64)::bigint;

COMMENT ON FUNCTION idemq._wait_key(text) IS
  'Advisory-lock key of the wake-up protocol: a queue''s waiting marker, NULL for all queues, '''' for the barrier.';

-- ---- sql/functions/_wait_marker_limit.sql ----
CREATE OR REPLACE FUNCTION idemq._wait_marker_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 16;

COMMENT ON FUNCTION idemq._wait_marker_limit() IS
  'The most queue markers a session holds (16); past it, wait_for_jobs waits for every queue instead.';

-- ---- sql/functions/_wait_markers.sql ----
CREATE OR REPLACE FUNCTION idemq._wait_markers(queues text[], operation text, taking boolean)
RETURNS TABLE(marker bigint, held boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_held bigint[];
  v_keys bigint[];
BEGIN
  IF NOT idemq._names_valid(queues) THEN
    PERFORM idemq._raise_bad_names(operation, 'queues', queues, 'all queues',
      'Pass the queues you claim from, or NULL for every queue.');
  END IF;
  -- pg_locks copies the whole lock table: read it once, not once per key.
  SELECT coalesce(array_agg((l.classid::bigint << 32) | l.objid::bigint), '{}') INTO v_held
  FROM pg_locks l
  WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock'
    AND l.objsubid = 1 AND l.granted;
  SELECT array_agg(DISTINCT idemq._wait_key(q)) INTO v_keys
  FROM unnest(coalesce(queues, ARRAY[NULL::text])) q;
  IF cardinality(v_keys) > idemq._wait_marker_limit()
     OR (taking AND cardinality(v_held) + (SELECT count(*) FROM unnest(v_keys) k WHERE k <> ALL (v_held))
                    > idemq._wait_marker_limit()) THEN
    v_keys := ARRAY[idemq._wait_key(NULL)];
  END IF;
  RETURN QUERY SELECT k, k = ANY (v_held) FROM unnest(v_keys) k;
END;
$$;

COMMENT ON FUNCTION idemq._wait_markers(text[], text, boolean) IS
  'The waiting markers of these queues (wait_for_jobs), at most _wait_marker_limit() per session, and whether this session holds each.';

-- ---- sql/functions/active_states.sql ----
CREATE OR REPLACE FUNCTION idemq.active_states()
RETURNS idemq.job_state[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY['scheduled', 'enqueued', 'processing', 'awaiting']::idemq.job_state[];

COMMENT ON FUNCTION idemq.active_states() IS
  'States of jobs that have not finished (an idempotency key is held while its job is in one).';

-- ---- sql/functions/apply_retention.sql ----
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

-- ---- sql/functions/cancel.sql ----
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
-- Generic plans, planned once per session: with custom plans (the first five
-- calls, and then whenever a custom plan's estimate beats the generic one, as
-- it does for the key lookups below, which know the array lengths) PL/pgSQL
-- planned the key statements at every call: claim(tasks => '{x}') 2.2 ms a
-- call against 0.65 ms generic (500 calls, same session, loaded machine).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_lost bigint[];
  v_key_tasks text[];
  v_key_queues text[];
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
  IF NOT idemq._names_valid(queues) THEN
    PERFORM idemq._raise_bad_names('claim', 'queues', queues, 'all queues', 'Pass NULL to claim from every queue.');
  END IF;
  IF NOT idemq._names_valid(tasks) THEN
    PERFORM idemq._raise_bad_names('claim', 'tasks', tasks, 'any task',
      'Pass the names of the tasks this worker has, or NULL to claim jobs of any task.');
  END IF;
  PERFORM idemq._check_lease(lease, 'claim');

  -- Two steps: lock the jobs (SKIP LOCKED, in claim order) into an array, then
  -- update them by primary key. One UPDATE joined to the locking subquery let
  -- the planner hash the whole jobs table for claims of a few hundred (seen in
  -- EXPLAIN: a sequential scan of every row, finished ones included, per
  -- claim); "id = ANY (array)" is an index probe per job whatever the table
  -- holds. The jobs whose previous attempt lost its lease are noted before the
  -- update resets the flag.
  --
  -- One index holds the runnable jobs: jobs_runnable_by_task_queue
  -- (_name_key(task), _name_key(queue), priority DESC, run_at, id), walked
  -- one (task, queue) key at a time, where an equality on both leading
  -- columns leaves that key's jobs, already in claim order; each walk then
  -- compares the names themselves (a Filter), so two names with one 64-bit
  -- key never mix (_name_key). The keys: the listed tasks crossed with the
  -- listed queues; for a list that is NULL, the values present among
  -- runnable jobs, read by a loose index scan (one index descent per value:
  -- "next key after this one", the name read from the row found), and for
  -- an unfiltered claim the (task, queue) pairs present, read the same way;
  -- so finding the keys costs the number of distinct keys, tasks or queues,
  -- not backlogs. The loose scans read keys, not names: a name whose key
  -- another name present shares is not listed (_name_key says what that
  -- costs).
  -- Why keys and not the names (migration 0028): with the variable-width
  -- names first, every comparison of an index insertion walked them to
  -- reach priority, run_at and id: 84.4k -> 71.4k instructions per job of
  -- a 10,000-job enqueue_many (callgrind, PostgreSQL 15).
  -- Planner trap (why the index leads with task and queue, migration 0019):
  -- a filter on queue or task checked on the rows of a walk over an index
  -- in claim order alone (the former jobs_runnable (priority DESC, run_at,
  -- id)) reads every runnable job of the other queues and tasks before it
  -- finds none of its own. EXPLAIN (ANALYZE, BUFFERS), generic plan
  -- (PG15), 200,000 runnable jobs in queue A, a claim on the empty queue B:
  -- Index Scan using jobs_runnable, Rows Removed by Filter: 200000, 6,394
  -- buffers, 138-166 ms; claim(queues => '{B}') 54-59 ms. Walking this
  -- index per key: 0 rows removed, 3 buffers; claim(queues => '{B}', tasks
  -- => '{t}') 0.36-0.49 ms a call (500 calls, one session, loaded machine).
  -- Second trap, in the pair scan: "next pair" must be the row comparison
  -- (task key, queue key) > (k.task_key, k.queue_key), which is an Index
  -- Cond that starts the descent at the next pair. Spelt "j.task > $1 OR
  -- (j.task = $1 AND j.queue > $2)" it is a Filter on a walk from the first
  -- entry: EXPLAIN (ANALYZE, BUFFERS), generic plan, 50,000 runnable jobs
  -- over 50 pairs, the step after the 49th pair: Rows Removed by Filter:
  -- 44000, 917 buffers, 8.6 ms; as a row comparison, 5 buffers, 0.04 ms.
  -- Third trap (0028), in the queue scan of a claim by tasks: a task-name
  -- Filter on its step ("j.task = k.task") made the planner expect one row
  -- and read the task's whole key with a Bitmap Heap Scan and a sort
  -- (EXPLAIN ANALYZE, generic plan, 50,000 runnable jobs over 10 pairs:
  -- rows=2500 per step); on the keys alone it is an Index Scan that stops
  -- at the first entry (rows=1 per step). So the step compares keys only.
  -- Fourth trap (0019, gone with jobs_runnable): with statistics that saw
  -- one queue and one task, an equality on either looked like it kept every
  -- row, and a generic plan tied the two indexes and walked jobs_runnable
  -- with the filter again (Rows Removed by Filter: 100000 per key, 201 ms);
  -- the schema sets n_distinct = 100 on both columns, which the key columns
  -- of the index (expressions, with statistics of their own) no longer
  -- read. n_distinct stays (the schema's, harmless here).
  IF queues IS NULL AND tasks IS NULL THEN
    WITH RECURSIVE present(task_key, queue_key, task, queue) AS (
      (SELECT idemq._name_key(j.task), idemq._name_key(j.queue), j.task, j.queue
       FROM idemq.jobs j
       WHERE j.state IN ('enqueued', 'scheduled')
       ORDER BY idemq._name_key(j.task), idemq._name_key(j.queue)
       LIMIT 1)
      UNION ALL
      SELECT n.task_key, n.queue_key, n.task, n.queue
      FROM present k
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.task) AS task_key, idemq._name_key(j.queue) AS queue_key, j.task, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND (idemq._name_key(j.task), idemq._name_key(j.queue)) > (k.task_key, k.queue_key)
        ORDER BY idemq._name_key(j.task), idemq._name_key(j.queue)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present k;
  ELSIF tasks IS NULL THEN
    WITH RECURSIVE present(task_key, task) AS (
      (SELECT idemq._name_key(j.task), j.task
       FROM idemq.jobs j
       WHERE j.state IN ('enqueued', 'scheduled')
       ORDER BY idemq._name_key(j.task)
       LIMIT 1)
      UNION ALL
      SELECT n.task_key, n.task
      FROM present t
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.task) AS task_key, j.task
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled') AND idemq._name_key(j.task) > t.task_key
        ORDER BY idemq._name_key(j.task)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(t.task ORDER BY t.task, q.queue), '{}'),
           coalesce(array_agg(q.queue ORDER BY t.task, q.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present t CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q;
  ELSIF queues IS NULL THEN
    WITH RECURSIVE present(task, queue_key, queue) AS (
      SELECT u.task, n.queue_key, n.queue
      FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) u
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.queue) AS queue_key, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND idemq._name_key(j.task) = idemq._name_key(u.task)
        ORDER BY idemq._name_key(j.queue)
        LIMIT 1
      ) n
      UNION ALL
      SELECT k.task, n.queue_key, n.queue
      FROM present k
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.queue) AS queue_key, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND idemq._name_key(j.task) = idemq._name_key(k.task)
          AND idemq._name_key(j.queue) > k.queue_key
        ORDER BY idemq._name_key(j.queue)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present k;
  ELSE
    SELECT coalesce(array_agg(t.task), '{}'), coalesce(array_agg(q.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) t
    CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q;
  END IF;

  IF cardinality(v_key_tasks) = 0 THEN
    -- No runnable job of any key asked for (unfiltered: none at all).
    RETURN;
  ELSIF cardinality(v_key_tasks) = 1 THEN
    -- One key (a worker of one task, or of one queue and one task; an
    -- unfiltered claim while one key has runnable jobs): its walk is the
    -- claim order itself, locked as it goes.
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND idemq._name_key(j.task) = idemq._name_key(v_key_tasks[1])
        AND idemq._name_key(j.queue) = idemq._name_key(v_key_queues[1])
        AND j.task = v_key_tasks[1]
        AND j.queue = v_key_queues[1]
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT batch_size
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSE
    -- Several keys: _claim_merge reads each key only as far as the claim
    -- order needs and locks the jobs it takes (its header says how, and
    -- what it costs). Only a claim of several keys pays its call.
    SELECT m.ids, m.lost INTO v_ids, v_lost
    FROM idemq._claim_merge(v_key_tasks, v_key_queues, batch_size) m;
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
              j.traceparent, j.priority, j.run_at
  )
  SELECT c.id, c.task, c.queue, c.payload, c.attempt, c.max_attempts,
         c.idempotency_key, c.lease_expires_at, c.reclaimed, c.traceparent
  FROM claimed c
  ORDER BY c.priority DESC, c.run_at, c.id;
END;
$$;

COMMENT ON FUNCTION idemq.claim(text, text[], int, interval, text[]) IS
  'Claim up to batch_size runnable jobs (priority desc, run_at, id) under a lease; FOR UPDATE SKIP LOCKED.';

-- ---- sql/functions/complete.sql ----
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
  -- The pairs checked and sorted by id (_pairs_by_id), so width_bucket() finds an id's
  -- attempt by binary search. The UPDATE itself selects by "id = ANY (ids)", a primary-key probe
  -- per job whatever the table holds: joined to the arrays instead, the planner
  -- hashed or scanned the whole table for batches of a few hundred (seen in
  -- EXPLAIN). The held-check and the attempt sit in the UPDATE's own WHERE, so
  -- a row changed concurrently (rescue, a new claim) is re-checked on its newest
  -- version and skipped if no longer held by that attempt. No row lock first:
  -- that wrote a WAL record per job for nothing. "Held" is _held(), the lease
  -- columns, not "state = 'processing'", which matches the jobs_leases partial
  -- index: the planner then scanned every job in flight once per pair.
  SELECT p.ids, p.attempts_by_id INTO v_ids, v_attempts
  FROM idemq._pairs_by_id(job_ids, attempts, 'complete_many',
                          'Pass two arrays of equal length: the ids and attempts claim() returned.') p;

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

-- ---- sql/functions/effect_claim.sql ----
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
  PERFORM idemq._check_key_bytes('effect_claim', effect_claim.key, effect_claim.owner);
  PERFORM idemq._check_duration('effect_claim', 'stale_after', effect_claim.stale_after);

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
  PERFORM idemq._check_key_owner('effect_done', effect_done.key, effect_done.owner);
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
  PERFORM idemq._raise_not_owner('effect_done', effect_done.key, effect_done.owner,
    'Another owner reclaimed it after it went stale: raise stale_after above the longest call.');
END;
$$;

COMMENT ON FUNCTION idemq.effect_done(text, text, jsonb) IS
  'Record that the claimed external effect happened (with its result); IQ410 if the claim is not this owner''s.';

-- ---- sql/functions/effect_release.sql ----
CREATE OR REPLACE FUNCTION idemq.effect_release(key text, owner text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM idemq._check_key_owner('effect_release', effect_release.key, effect_release.owner);
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
  PERFORM idemq._raise_not_owner('effect_release', effect_release.key, effect_release.owner,
    'Another owner reclaimed it after it went stale; leave it to them.');
END;
$$;

COMMENT ON FUNCTION idemq.effect_release(text, text) IS
  'Give up a claim whose external call did not happen; IQ410 if not this owner''s.';

-- ---- sql/functions/enqueue.sql ----
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
  after bigint[] DEFAULT NULL,
  key_retention interval DEFAULT '14 days',
  traceparent text DEFAULT NULL)
RETURNS TABLE(job_id bigint, deduplicated boolean, job_traceparent text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_null text;
  v_job idemq._planned_job;
  v_problem text[];
  v_limits idemq._enqueue_limits;
  v_key_job bigint;
  v_state idemq.job_state;
BEGIN
  v_null := CASE
    WHEN enqueue.task IS NULL THEN 'task'
    WHEN enqueue.payload IS NULL THEN 'payload'
    WHEN enqueue.queue IS NULL THEN 'queue'
    WHEN enqueue.priority IS NULL THEN 'priority'
    WHEN enqueue.max_attempts IS NULL THEN 'max_attempts'
    WHEN enqueue.duplicate_policy IS NULL THEN 'duplicate_policy'
    WHEN enqueue.key_retention IS NULL THEN 'key_retention'
  END;
  IF v_null IS NOT NULL THEN
    PERFORM idemq._raise_null_argument('enqueue', v_null);
  END IF;

  -- Parse and check: the arguments are typed already; the rules are the
  -- ones every enqueue_many element meets.
  v_job.ordinal := 1;
  v_job.outcome := 'created';
  v_job.task := enqueue.task;
  v_job.payload := enqueue.payload;
  v_job.queue := enqueue.queue;
  v_job.run_at := coalesce(enqueue.run_at, now());
  v_job.priority := enqueue.priority;
  v_job.max_attempts := enqueue.max_attempts;
  v_job.idempotency_key := enqueue.idempotency_key;
  v_job.duplicate_policy := enqueue.duplicate_policy;
  v_job.backoff := nullif(enqueue.backoff, 'null');
  v_job.expires_at := enqueue.expires_at;
  v_job.after := CASE WHEN cardinality(enqueue.after) > 0 THEN enqueue.after END;
  v_job.key_retention := enqueue.key_retention;
  v_job.traceparent := enqueue.traceparent;
  -- The limits in a variable first (one query, _enqueue_limits inlined):
  -- passed as _job_rule_broken(v_job, idemq._enqueue_limits()), a function call
  -- as an argument its body uses more than once, the planner would not
  -- inline _job_rule_broken, and a SQL function called per enqueue costs about
  -- 20 us (5,000 calls: 55 against 35 us each, backend CPU).
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  -- The rules, and their wording only for a job that breaks one: PL/pgSQL
  -- compiles an expression whole, once per transaction (_job_rule_broken).
  IF idemq._job_rule_broken(v_job, v_limits) IS NOT NULL THEN
    v_problem := idemq._job_problem(v_job, v_limits);
  ELSIF v_job.backoff IS NOT NULL THEN
    v_problem := ARRAY[idemq._backoff_problem(v_job.backoff), NULL];
  END IF;
  IF v_problem[1] IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem[1], NULL, v_problem[2]);
  END IF;
  v_job.job_id := nextval('idemq.jobs_id_seq');

  -- The fast path: no parents, and no key or a key nobody holds: one or two
  -- INSERTs. The pipeline's parts (_enqueue_planned) cost about 15 us more per
  -- call for a job without key and 70 us more with a new key (backend CPU, 5,000
  -- calls), which single-enqueue throughput shows. A key that exists, or a
  -- concurrent inserter that committed it, goes to the pipeline, which decides;
  -- the test "writes the same row as enqueue_many" keeps the two INSERTs alike.
  IF v_job.after IS NULL THEN
    IF v_job.idempotency_key IS NOT NULL THEN
      -- A new key: the key row's primary key serialises concurrent callers
      -- (ON CONFLICT waits for an inserter's transaction).
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
      VALUES (v_job.idempotency_key, v_job.job_id, v_job.task, md5(v_job.payload::text), v_job.key_retention)
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.job_id INTO v_key_job;
    END IF;
    IF v_job.idempotency_key IS NULL OR v_key_job IS NOT NULL THEN
      v_state := idemq._initial_state(v_job.run_at);
      INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                   idempotency_key, backoff, expires_at, traceparent)
      VALUES (v_job.job_id, v_job.task, v_job.queue, v_job.payload, v_state, v_job.priority, v_job.run_at,
              v_job.max_attempts, v_job.idempotency_key, v_job.backoff, v_job.expires_at, v_job.traceparent);
      IF v_state = 'enqueued' THEN
        PERFORM idemq._notify_waiting(v_job.queue);
      END IF;
      job_id := v_job.job_id;
      deduplicated := false;
      job_traceparent := v_job.traceparent;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;

  v_job := (idemq._enqueue_planned(ARRAY[v_job], v_job.idempotency_key IS NOT NULL, v_job.after IS NOT NULL))[1];

  IF v_job.outcome = 'rejected' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ409',
      MESSAGE = format('idempotency key "%s" was used by job %s, which %s; duplicate_policy %s rejects a new job',
                       enqueue.idempotency_key, v_job.job_id, v_job.existing_state, v_job.duplicate_policy),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id,
                                  'existing_state', v_job.existing_state, 'policy', v_job.duplicate_policy)::text,
      HINT = format('Read job %s for its outcome; to run the work again, enqueue with a policy that allows it '
                    '(allow_after_failed) or retry job %s.', v_job.job_id, v_job.job_id);
  ELSIF v_job.outcome = 'conflict' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ422',
      MESSAGE = format('idempotency key "%s" is held by active job %s for different work (task or payload differ)',
                       enqueue.idempotency_key, v_job.job_id),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id)::text,
      HINT = 'A key must name one piece of work: derive it from the task and the payload''s identity, '
             'or wait until the existing job finishes.';
  END IF;

  job_id := v_job.job_id;
  deduplicated := v_job.outcome = 'deduplicated';
  job_traceparent := v_job.traceparent;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue(text, jsonb, text, timestamptz, int, int, text, idemq.duplicate_policy, jsonb, timestamptz, bigint[], interval, text) IS
  'Add a job, or return the active job holding its idempotency key; the duplicate policy decides after a terminal job.';

-- ---- sql/functions/enqueue_many.sql ----
CREATE OR REPLACE FUNCTION idemq.enqueue_many(jobs jsonb)
RETURNS TABLE(ordinal int, job_id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the jobs array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_parsed record := idemq._parse_jobs(enqueue_many.jobs);
BEGIN
  RETURN QUERY
  SELECT p.ordinal, p.job_id, p.outcome
  FROM unnest(idemq._enqueue_planned(v_parsed.planned, v_parsed.keyed, v_parsed.parents)) p;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue_many(jsonb) IS
  'Add many jobs in one call; returns (ordinal, job_id, outcome) per element, never raising for duplicates.';

-- ---- sql/functions/fail.sql ----
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
        'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by,
        'max_attempts', least(v_job.max_attempts, fail.max_attempts))),
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
  -- _check_key_bytes decides and words the 22023; called only for a key
  -- over key_bytes, since the call itself (a PL/pgSQL function pinning
  -- search_path, and its read of the limit) cost a guard 26k of its 226k
  -- instructions (callgrind, PostgreSQL 15, each guard its own
  -- transaction). The call, not its body, is the cost: as a SQL-language
  -- function _check_key_bytes made a guard cost 404k. limits.test.ts holds
  -- this test and _check_key_bytes equal at the boundary.
  IF octet_length(guard.key) > (SELECT l.key_bytes FROM idemq.enqueue_limits l) THEN
    PERFORM idemq._check_key_bytes('guard', guard.key, NULL);
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
  -- As in complete_many: the pairs checked and sorted by id (_pairs_by_id),
  -- width_bucket() finding an id's attempt by binary search, and "id = ANY
  -- (ids)", a primary-key probe per job whatever the table holds (joined to
  -- the arrays, the planner hashed or scanned the whole table). The attempt
  -- and the held-check are re-checked on the newest row version.
  SELECT p.ids, p.attempts_by_id INTO v_ids, v_attempts
  FROM idemq._pairs_by_id(job_ids, attempts, 'heartbeat',
                          'Pass two arrays of equal length: the ids and attempts of the jobs this worker runs.') p;
  PERFORM idemq._check_lease(lease, 'heartbeat');

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

-- ---- sql/functions/overview.sql ----
CREATE OR REPLACE FUNCTION idemq.overview(recent interval DEFAULT '15 minutes', exact_up_to bigint DEFAULT 10000)
RETURNS TABLE(queue text, task text, metric text, value bigint, exact boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_state idemq.job_state;
  v_count bigint;
  v_estimate numeric;
BEGIN
  IF recent IS NULL OR exact_up_to IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'overview: recent and exact_up_to must not be NULL',
      HINT = 'Leave an argument out to take its default.';
  END IF;
  IF recent <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: recent must be positive, not %s', recent),
      HINT = 'Give the window of recent finishes, e.g. recent => ''15 minutes''.';
  END IF;
  PERFORM idemq._check_duration('overview', 'recent', recent);
  IF exact_up_to NOT BETWEEN 0 AND 10000000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: exact_up_to must be from 0 to 10000000, not %s', exact_up_to),
      HINT = 'Totals over it are estimated; 10000 (the default) keeps the call fast.';
  END IF;

  -- Each branch names the state(s) as constants so the planner matches the
  -- partial index of active rows instead of scanning the finished ones.
  RETURN QUERY
  SELECT j.queue, j.task, j.state::text, count(*), true
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled')
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT j.queue, j.task, 'processing', count(*), true
  FROM idemq.jobs j WHERE j.state = 'processing'
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, 'awaiting', count(*), true
  FROM idemq.jobs j WHERE j.state = 'awaiting'
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, 'lease_expired', count(*), true
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  -- As stats() computes it (capped epoch seconds: a run_at of -infinity must not fail the call).
  SELECT j.queue, j.task, 'oldest_runnable_seconds',
         least(floor(extract(epoch FROM now()) - extract(epoch FROM min(j.run_at))),
               9223372036854775807)::bigint, true
  FROM idemq.jobs j
  WHERE j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
    AND (j.expires_at IS NULL OR j.expires_at > now())
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT j.queue, j.task, j.state::text || '_recent', count(*), true
  FROM idemq.jobs j
  WHERE j.state IN ('succeeded', 'failed', 'expired', 'cancelled')
    AND j.finished_at IS NOT NULL AND j.finished_at >= now() - recent
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint, true
  FROM idemq.counters c
  GROUP BY c.task, c.event;

  -- Totals per terminal state: counted through jobs_by_finish up to the cap,
  -- estimated beyond it (a count(*) of a million rows is what this avoids).
  FOREACH v_state IN ARRAY ARRAY['succeeded', 'failed', 'expired', 'cancelled']::idemq.job_state[] LOOP
    SELECT count(*) INTO v_count
    FROM (SELECT FROM idemq.jobs j
          WHERE j.state = v_state AND j.finished_at IS NOT NULL
          LIMIT exact_up_to + 1) s;
    CONTINUE WHEN v_count = 0;
    queue := NULL;
    task := NULL;
    metric := v_state::text;
    IF v_count <= exact_up_to THEN
      value := v_count;
      exact := true;
    ELSE
      SELECT c.reltuples * s.most_common_freqs[array_position(s.most_common_vals::text::text[], v_state::text)]
      INTO v_estimate
      FROM pg_class c
      LEFT JOIN pg_stats s
        ON s.schemaname = 'idemq' AND s.tablename = 'jobs' AND s.attname = 'state'
      WHERE c.oid = 'idemq.jobs'::regclass AND c.reltuples > 0;
      value := greatest(exact_up_to + 1, coalesce(round(v_estimate), 0))::bigint;
      exact := false;
    END IF;
    RETURN NEXT;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.overview(interval, bigint) IS
  'Dashboard overview: exact active counts and recent finishes per queue and task, terminal totals exact up to a cap and estimated beyond it.';

-- ---- sql/functions/prune_keys.sql ----
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
      AND k.finished_at < now() - k.retention
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
  'Release keys finished longer ago than their own retention and older_than (and guard rows, done effect records older than older_than); default 14 days.';

-- ---- sql/functions/terminal_states.sql ----
CREATE OR REPLACE FUNCTION idemq.terminal_states()
RETURNS idemq.job_state[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY['succeeded', 'failed', 'expired', 'cancelled']::idemq.job_state[];

COMMENT ON FUNCTION idemq.terminal_states() IS
  'States a job ends in; purge() defaults to these.';

-- ---- sql/functions/purge.sql ----
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

-- ---- sql/functions/reschedule.sql ----
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

-- ---- sql/functions/retry.sql ----
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
    INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
    VALUES (v_job.idempotency_key, v_job.id, v_job.task, md5(v_job.payload::text),
            (idemq._job_defaults()->>'key_retention')::interval)
    ON CONFLICT ON CONSTRAINT keys_pkey DO UPDATE
      SET job_id = EXCLUDED.job_id, task = EXCLUDED.task, payload_md5 = EXCLUDED.payload_md5,
          finished_state = NULL, finished_at = NULL;
  END IF;

  UPDATE idemq.jobs AS j
  SET state = 'enqueued', run_at = now(), finished_at = NULL, uncounted = j.attempt,
      errors = idemq._append_error(j.errors, jsonb_build_object(
        'attempt', j.attempt, 'class', 'Retried',
        'message', format('retried by an operator after the job was %s', j.state),
        'previous_state', j.state, 'finished_at', j.finished_at, 'retried_at', now())),
      expires_at = CASE WHEN j.state = 'expired' OR j.expires_at <= now() THEN NULL ELSE j.expires_at END
  WHERE j.id = v_job.id;
  PERFORM idemq._notify_waiting(v_job.queue);
  RETURN 'enqueued';
END;
$$;

COMMENT ON FUNCTION idemq.retry(bigint) IS
  'Run a failed, cancelled or expired job again with fresh attempts; IQ409 if its key is held by another active job.';

-- ---- sql/functions/retry_horizon.sql ----
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

-- ---- sql/functions/schedule.sql ----
CREATE OR REPLACE FUNCTION idemq.schedule(
  name text,
  cron text,
  task text,
  payload jsonb DEFAULT NULL,
  queue text DEFAULT NULL,
  timezone text DEFAULT 'UTC',
  overlap idemq.schedule_overlap DEFAULT 'skip',
  misfire idemq.schedule_misfire DEFAULT 'once',
  misfire_grace interval DEFAULT '1 minute',
  priority int DEFAULT NULL,
  max_attempts int DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_defaults jsonb := idemq._job_defaults();
  v_null text;
  v_problem text;
  v_hint text;
  v_spec jsonb;
  v_next timestamptz;
  v_payload jsonb := coalesce(schedule.payload, v_defaults -> 'payload');
  v_queue text := coalesce(schedule.queue, v_defaults ->> 'queue');
  v_priority int := coalesce(schedule.priority, (v_defaults ->> 'priority')::int);
  v_max_attempts int := coalesce(schedule.max_attempts, (v_defaults ->> 'max_attempts')::int);
  v_job idemq._planned_job;
  v_limits idemq._enqueue_limits;
  v_job_problem text[];
BEGIN
  v_null := CASE
    WHEN schedule.name IS NULL THEN 'name'
    WHEN schedule.cron IS NULL THEN 'cron'
    WHEN schedule.task IS NULL THEN 'task'
    WHEN schedule.overlap IS NULL THEN 'overlap'
    WHEN schedule.misfire IS NULL THEN 'misfire'
    WHEN schedule.misfire_grace IS NULL THEN 'misfire_grace'
  END;
  IF v_null IS NOT NULL THEN
    PERFORM idemq._raise_null_argument('schedule', v_null);
  END IF;
  SELECT p.problem, p.hint INTO v_problem, v_hint FROM (VALUES
    (schedule.name = '', 'name must not be empty', 'Name the schedule, e.g. ''nightly-report''; it is part of each slot''s idempotency key.'),
    (length(schedule.name) > 200, 'name must be at most 200 characters', 'Use a shorter name; it is part of each slot''s idempotency key.'),
    (schedule.task = '', 'task must not be empty', 'Pass the task name a worker handles.'),
    (jsonb_typeof(v_payload) <> 'object', format('payload must be a JSON object, not %s', v_payload), 'Wrap the value in an object, e.g. {"value": ...}.'),
    (v_queue = '' OR length(v_queue) > idemq._queue_name_limit(),
     format('queue must be 1 to %s characters', idemq._queue_name_limit()), 'Leave queue out for the default queue, or pass a short name.'),
    (v_max_attempts < 1, format('max_attempts must be at least 1, not %s', v_max_attempts), 'Leave it out for the default, or pass 1 or more.'),
    (schedule.misfire_grace < interval '1 second' OR schedule.misfire_grace > interval '1 day',
     format('misfire_grace must be between 1 second and 1 day, not %s', schedule.misfire_grace),
     'misfire_grace is how late a slot may run and still count as on time; call tick() more often than that.')
  ) AS p(bad, problem, hint)
  WHERE p.bad
  LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'schedule: ' || v_problem, HINT = v_hint;
  END IF;
  -- The job a slot enqueues (_tick: key schedule:<name>:<UTC slot>, its
  -- timestamp always 20 characters), checked by enqueue's rules.
  v_job.task := schedule.task;
  v_job.payload := v_payload;
  v_job.queue := v_queue;
  v_job.run_at := now();
  v_job.priority := v_priority;
  v_job.max_attempts := v_max_attempts;
  v_job.idempotency_key := format('schedule:%s:%s', schedule.name, '0000-00-00T00:00:00Z');
  v_job.duplicate_policy := 'reject_always';
  v_job.key_retention := (v_defaults ->> 'key_retention')::interval;
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  v_job_problem := idemq._job_problem(v_job, v_limits);
  IF v_job_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'schedule: its jobs would be refused: ' || v_job_problem[1],
      HINT = coalesce(v_job_problem[2] || ' ', '') || 'Nothing was scheduled.';
  END IF;
  PERFORM idemq._check_timezone(schedule.timezone, 'schedule');
  v_spec := idemq._cron_parse(schedule.cron);
  v_next := idemq._cron_next(v_spec, schedule.timezone, now());
  IF v_next IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('schedule: cron "%s" does not fire within 50 years', schedule.cron),
      HINT = 'Check the day-of-month, month and day-of-week fields together.';
  END IF;

  INSERT INTO idemq.schedules AS s (name, cron, timezone, task, payload, queue, priority, max_attempts,
                                    overlap, misfire, misfire_grace, next_at)
  VALUES (schedule.name, schedule.cron, schedule.timezone, schedule.task, v_payload, v_queue, v_priority,
          v_max_attempts, schedule.overlap, schedule.misfire, schedule.misfire_grace, v_next)
  ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
  SET cron = excluded.cron, timezone = excluded.timezone, task = excluded.task, payload = excluded.payload,
      queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
      overlap = excluded.overlap, misfire = excluded.misfire, misfire_grace = excluded.misfire_grace,
      next_at = CASE WHEN s.cron = excluded.cron AND s.timezone = excluded.timezone THEN s.next_at
                     ELSE excluded.next_at END,
      updated_at = now()
  WHERE (s.cron, s.timezone, s.task, s.payload, s.queue, s.priority, s.max_attempts, s.overlap, s.misfire, s.misfire_grace)
        IS DISTINCT FROM (excluded.cron, excluded.timezone, excluded.task, excluded.payload, excluded.queue,
                          excluded.priority, excluded.max_attempts, excluded.overlap, excluded.misfire, excluded.misfire_grace)
  RETURNING s.next_at INTO v_next;
  IF NOT FOUND THEN
    -- The same definition: ON CONFLICT locked the row and left it as it was.
    SELECT s.next_at INTO v_next FROM idemq.schedules AS s WHERE s.name = schedule.name;
  END IF;
  RETURN v_next;
END;
$$;

COMMENT ON FUNCTION idemq.schedule(text, text, text, jsonb, text, text, idemq.schedule_overlap, idemq.schedule_misfire, interval, int, int) IS
  'Create or replace a recurring schedule (cron, time zone, overlap and misfire policies); returns its next slot.';

-- ---- sql/functions/schedule_next.sql ----
CREATE OR REPLACE FUNCTION idemq.schedule_next(cron text, timezone text DEFAULT 'UTC', after timestamptz DEFAULT now(),
                                               count int DEFAULT 1)
RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_spec jsonb;
  v_at timestamptz := schedule_next.after;
BEGIN
  IF schedule_next.after IS NULL OR schedule_next.count IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('schedule_next: %s must not be NULL', CASE WHEN schedule_next.after IS NULL THEN 'after' ELSE 'count' END),
      HINT = 'Leave the argument out to use its default.';
  END IF;
  IF schedule_next.count NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('schedule_next: count must be between 1 and 1000, not %s', schedule_next.count),
      HINT = 'Ask for a few slots, e.g. count => 5.';
  END IF;
  PERFORM idemq._check_timezone(schedule_next.timezone, 'schedule_next');
  v_spec := idemq._cron_parse(schedule_next.cron);
  FOR i IN 1 .. schedule_next.count LOOP
    v_at := idemq._cron_next(v_spec, schedule_next.timezone, v_at);
    EXIT WHEN v_at IS NULL;
    RETURN NEXT v_at;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.schedule_next(text, text, timestamptz, int) IS
  'The next slots of a cron expression in a time zone after an instant (to check an expression).';

-- ---- sql/functions/schedules.sql ----
CREATE OR REPLACE FUNCTION idemq.schedules()
RETURNS TABLE(name text, cron text, timezone text, task text, queue text, payload jsonb,
              priority int, max_attempts int, overlap idemq.schedule_overlap, misfire idemq.schedule_misfire,
              misfire_grace interval, next_at timestamptz, last_slot_at timestamptz, last_job_id bigint,
              last_job_state idemq.job_state, skipped bigint, created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT s.name, s.cron, s.timezone, s.task, s.queue, s.payload, s.priority, s.max_attempts, s.overlap,
         s.misfire, s.misfire_grace, s.next_at, s.last_slot_at, s.last_job_id, j.state, s.skipped,
         s.created_at, s.updated_at
  FROM idemq.schedules s
  LEFT JOIN idemq.jobs j ON j.id = s.last_job_id
  ORDER BY s.name;
$$;

COMMENT ON FUNCTION idemq.schedules() IS
  'List the recurring schedules, with the state of each one''s latest job.';

-- ---- sql/functions/set_retention.sql ----
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

-- ---- sql/functions/snooze.sql ----
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

-- ---- sql/functions/stop_waiting.sql ----
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
  FOR v_marker IN SELECT m.marker FROM idemq._wait_markers(queues, 'stop_waiting', false) m WHERE m.held LOOP
    PERFORM pg_advisory_unlock_shared(v_marker);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.stop_waiting(text[]) IS
  'Stop waiting for jobs of these queues (see wait_for_jobs): enqueues into them no longer notify on this session''s account.';

-- ---- sql/functions/tick.sql ----
CREATE OR REPLACE FUNCTION idemq.tick()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN idemq._tick(now());
END;
$$;

COMMENT ON FUNCTION idemq.tick() IS
  'Enqueue every due schedule slot once; safe to call from any number of workers or pg_cron.';

-- ---- sql/functions/unschedule.sql ----
CREATE OR REPLACE FUNCTION idemq.unschedule(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_found boolean;
BEGIN
  IF unschedule.name IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'unschedule: name must not be NULL',
      HINT = 'Pass the name the schedule was created with; idemq.schedules() lists them.';
  END IF;
  DELETE FROM idemq.schedules AS s WHERE s.name = unschedule.name;
  GET DIAGNOSTICS v_found = ROW_COUNT;
  RETURN v_found;
END;
$$;

COMMENT ON FUNCTION idemq.unschedule(text) IS
  'Remove a recurring schedule; jobs it already enqueued stay.';

-- ---- sql/functions/unserved_jobs.sql ----
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

-- ---- sql/functions/wait_for_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq.wait_for_jobs(queues text[] DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_marker bigint;
  v_marked boolean := true;
BEGIN
  -- Tried, never waited on: any role that can connect may hold any key.
  FOR v_marker IN SELECT m.marker FROM idemq._wait_markers(queues, 'wait_for_jobs', true) m WHERE NOT m.held LOOP
    IF NOT pg_try_advisory_lock_shared(v_marker) THEN
      v_marked := false;
    END IF;
  END LOOP;
  IF v_marked AND pg_try_advisory_lock(idemq._wait_key('')) THEN
    PERFORM pg_advisory_unlock(idemq._wait_key(''));
    RETURN true;
  END IF;
  RETURN false;
END;
$$;

COMMENT ON FUNCTION idemq.wait_for_jobs(text[]) IS
  'Wait for jobs of these queues: enqueues NOTIFY while this session waits; true once a claim would see every job that did not notify.';

-- ---- sql/functions/worker_seen.sql ----
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
  IF NOT idemq._names_valid(queues)
     OR EXISTS (SELECT 1 FROM unnest(queues) q WHERE length(q) > idemq._queue_name_limit()) THEN
    PERFORM idemq._raise_bad_names('worker_seen', 'queues', queues, 'every queue',
      'Pass the queues the worker claims from, as claim() gets them.', idemq._queue_name_limit());
  END IF;
  IF NOT idemq._names_valid(tasks) THEN
    PERFORM idemq._raise_bad_names('worker_seen', 'tasks', tasks, 'any task',
      'Pass the task names the worker has, as claim() gets them.');
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

-- ==== Constraints that call functions ====

ALTER TABLE idemq.jobs
    ADD CONSTRAINT jobs_attempt_in_range CHECK (((0 <= uncounted) AND (uncounted <= attempt) AND (attempt <= (max_attempts + uncounted)))) NOT VALID;

ALTER TABLE idemq.jobs
    ADD CONSTRAINT jobs_finished_iff_terminal CHECK (((state = ANY ('{succeeded,failed,expired,cancelled}'::idemq.job_state[])) = (finished_at IS NOT NULL))) NOT VALID;

ALTER TABLE idemq.jobs
    ADD CONSTRAINT jobs_traceparent_w3c CHECK ((traceparent ~ '^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$'::text)) NOT VALID;

ALTER TABLE idemq.keys
    ADD CONSTRAINT keys_finished_state_terminal CHECK ((finished_state = ANY ('{succeeded,failed,expired,cancelled}'::idemq.job_state[]))) NOT VALID;

-- ==== Indexes ====

CREATE UNIQUE INDEX enqueue_limits_one_row ON idemq.enqueue_limits USING btree ((true));

CREATE INDEX job_dependencies_child ON idemq.job_dependencies USING btree (child_id);

CREATE INDEX jobs_awaiting ON idemq.jobs USING btree (id) WHERE (state = 'awaiting'::idemq.job_state);

CREATE INDEX jobs_by_finish ON idemq.jobs USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);

CREATE INDEX jobs_deadlines ON idemq.jobs USING btree (expires_at) WHERE ((expires_at IS NOT NULL) AND (state = ANY (ARRAY['enqueued'::idemq.job_state, 'scheduled'::idemq.job_state, 'awaiting'::idemq.job_state])));

CREATE INDEX jobs_leases ON idemq.jobs USING btree (lease_expires_at) WHERE (state = 'processing'::idemq.job_state);

CREATE INDEX jobs_runnable_by_task_queue ON idemq.jobs USING btree (idemq._name_key(task), idemq._name_key(queue), priority DESC, run_at, id) WITH (deduplicate_items=off) WHERE (state = ANY (ARRAY['enqueued'::idemq.job_state, 'scheduled'::idemq.job_state]));

CREATE INDEX jobs_with_errors ON idemq.jobs USING btree (id) WHERE (errors <> '[]'::jsonb);

CREATE INDEX keys_finished_at ON idemq.keys USING btree (finished_at) WHERE (finished_at IS NOT NULL);

CREATE INDEX schedules_due ON idemq.schedules USING btree (next_at);

CREATE UNIQUE INDEX success_retention_one_row ON idemq.success_retention USING btree ((true));

-- ==== Triggers ====

CREATE TRIGGER jobs_finished AFTER UPDATE OF state ON idemq.jobs FOR EACH ROW WHEN (((new.state = ANY (ARRAY['succeeded'::idemq.job_state, 'failed'::idemq.job_state, 'expired'::idemq.job_state, 'cancelled'::idemq.job_state])) AND (old.state <> ALL (ARRAY['succeeded'::idemq.job_state, 'failed'::idemq.job_state, 'expired'::idemq.job_state, 'cancelled'::idemq.job_state])) AND ((new.idempotency_key IS NOT NULL) OR new.has_children))) EXECUTE FUNCTION idemq._on_job_finished();

CREATE TRIGGER retention_keep_success_retention AFTER INSERT OR DELETE OR UPDATE OR TRUNCATE ON idemq.retention FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_success_retention();

CREATE TRIGGER settings_keep_enqueue_limits AFTER INSERT OR DELETE OR UPDATE ON idemq.settings FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_enqueue_limits();

CREATE TRIGGER settings_keep_success_retention AFTER INSERT OR DELETE OR UPDATE ON idemq.settings FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_success_retention();

-- The settings and their defaults (statement triggers fill idemq.enqueue_limits and
-- idemq.success_retention from them).
INSERT INTO idemq.settings (name, value, min_value, max_value, description) VALUES
  ('worker_id_bytes', 256, 1, 1000, 'longest worker_id claim() accepts, in bytes of UTF-8'),
  ('error_history', 20, 1, 100, 'errors kept per job: the latest entries of its history'),
  ('error_message_chars', 4096, 100, 65536, 'longest class and message of a recorded error (and its other fields together), in characters'),
  ('error_stack_chars', 16384, 100, 262144, 'longest stack of a recorded error, in characters'),
  ('duration_days', 36500, 1, 1000000, 'longest retention or staleness (purge, prune_keys older_than; effect_claim stale_after), in days'),
  ('task_bytes', 256, 1, 2000, 'longest task name enqueue accepts, in bytes of UTF-8'),
  ('jobs_per_call', 50000, 1, 1000000, 'most jobs one enqueue_many call accepts'),
  ('parents_per_job', 1000, 1, 100000, 'most parents one job may wait for (enqueue''s after)'),
  ('key_bytes', 512, 1, 2000, 'longest idempotency key, guard key, effect key and effect owner, in bytes of UTF-8'),
  ('payload_bytes', 1048576, 1, 268435455, 'largest job payload, in bytes of its JSON text'),
  ('retention_succeeded_seconds', 604800, 0, 3153600000, 'how long a succeeded job is kept, in seconds (default 7 days; 0: deleted by its completion)'),
  ('retention_failed_seconds', 2592000, 0, 3153600000, 'how long a failed job is kept, in seconds (default 30 days)'),
  ('retention_cancelled_seconds', 2592000, 0, 3153600000, 'how long a cancelled job is kept, in seconds (default 30 days)'),
  ('retention_expired_seconds', 2592000, 0, 3153600000, 'how long an expired job is kept, in seconds (default 30 days)'),
  ('worker_names', 10000, 1, 100000, 'most queue and task names one worker_seen() call may list, together'),
  ('worker_retention_seconds', 86400, 60, 3153600000, 'how long the row of a worker not seen is kept in idemq.workers, in seconds (default a day)');

-- ==== Grants ====

-- PUBLIC gets nothing, the idemq roles what their names say.
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- Reverting the first migration removes idemq and every job in it. The group
-- roles are cluster-wide and may serve other databases: they stay.
DROP SCHEMA idemq CASCADE;
