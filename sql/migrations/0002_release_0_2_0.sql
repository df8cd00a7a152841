-- Migration 0002_release_0_2_0: the upgrade from 0.1.0 to 0.2.0 (its changes: CHANGELOG.md, "0.2.0").
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ from CREATE on (npm run migration:check compares them). Until
-- it is released (listed in sql/released.sha256), migration:new amends it;
-- after that it never changes again.
-- Up Migration

-- ==== hand-written: schema changes (kept when migration:new amends this file) ====
-- Schema changes (tables, columns, indexes) go here, before the functions
-- that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes in a
-- migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration
-- commits on its own, so the next migration can use it.

-- A job's id is job_id in every row a function returns (enqueue and
-- enqueue_many already named it so; claim's rows called it id). Renamed in
-- place: claim's PL/pgSQL body returns its columns by position.
ALTER TYPE idemq.claimed_job RENAME ATTRIBUTE id TO job_id;

-- What idemq.job() returns: a type, not RETURNS TABLE, because a TABLE column
-- may not share its name with the parameter job_id.
CREATE TYPE idemq.job_row AS (
  job_id bigint,
  task text,
  queue text,
  payload jsonb,
  state idemq.job_state,
  priority integer,
  run_at timestamptz,
  attempt integer,
  uncounted integer,
  max_attempts integer,
  idempotency_key text,
  locked_by text,
  locked_at timestamptz,
  lease_expires_at timestamptz,
  errors jsonb,
  result jsonb,
  created_at timestamptz,
  finished_at timestamptz,
  expires_at timestamptz
);
-- ==== end hand-written ====

-- ---- sql/functions/_excerpt.sql ----
CREATE OR REPLACE FUNCTION idemq._excerpt(value text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN value IS NULL THEN 'NULL'
            -- Cut first, then escape: a cut never splits an escape sequence.
            WHEN left(value, 60) !~ '[\u0001-\u001f\u007f-\u009f]' THEN left(value, 60)
            ELSE (SELECT string_agg(CASE WHEN s.c !~ '[\u0001-\u001f\u007f-\u009f]' THEN s.c
                                         WHEN s.c = E'\n' THEN '\n' WHEN s.c = E'\r' THEN '\r' WHEN s.c = E'\t' THEN '\t'
                                         ELSE format('\u%s', lpad(to_hex(ascii(s.c)), 4, '0')) END, '' ORDER BY s.n)
                    FROM regexp_split_to_table(left(value, 60), '') WITH ORDINALITY AS s(c, n))
       END || CASE WHEN length(value) > 60 THEN format('… (%s characters)', length(value)) ELSE '' END;

COMMENT ON FUNCTION idemq._excerpt(text) IS
  'The first 60 characters of an input, control characters escaped, for error messages (bounded and inert whatever the input).';

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
  v_producer text[] := ARRAY['enqueue', 'enqueue_many', 'job'];
  v_worker text[] := ARRAY['job', 'claim', 'complete', 'complete_many', 'fail', 'heartbeat', 'snooze',
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
                       idemq._excerpt(enqueue.idempotency_key), v_job.job_id, v_job.existing_state, v_job.duplicate_policy),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id,
                                  'existing_state', v_job.existing_state, 'policy', v_job.duplicate_policy)::text,
      HINT = format('Read job %s for its outcome; to run the work again, enqueue with a policy that allows it '
                    '(allow_after_failed) or retry job %s.', v_job.job_id, v_job.job_id);
  ELSIF v_job.outcome = 'conflict' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ422',
      MESSAGE = format('idempotency key "%s" is held by active job %s for different work (task or payload differ)',
                       idemq._excerpt(enqueue.idempotency_key), v_job.job_id),
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

-- ---- sql/functions/job.sql ----
CREATE OR REPLACE FUNCTION idemq.job(job_id bigint)
RETURNS SETOF idemq.job_row
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_payloads boolean;
BEGIN
  IF job.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'job: job_id must not be NULL',
      HINT = 'Pass the id enqueue() returned.';
  END IF;
  -- session_user, not current_user: inside SECURITY DEFINER current_user is
  -- the owner. A session that may SET ROLE away from its login can SET it
  -- back, so the login's privilege is the one that counts.
  v_payloads := has_table_privilege(session_user, 'idemq.jobs', 'SELECT');
  RETURN QUERY
  SELECT j.id, j.task, j.queue, CASE WHEN v_payloads THEN j.payload END, j.state, j.priority,
         j.run_at, j.attempt, j.uncounted, j.max_attempts, j.idempotency_key, j.locked_by,
         j.locked_at, j.lease_expires_at, j.errors, j.result, j.created_at, j.finished_at,
         j.expires_at
  FROM idemq.jobs j
  WHERE j.id = job.job_id;
END;
$$;

COMMENT ON FUNCTION idemq.job(bigint) IS
  'One job''s state and outcome (no row when it does not exist); the payload only for a login that may read idemq.jobs.';

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
                         idemq._excerpt(v_job.idempotency_key), v_job.id, v_holder.job_id),
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
  v_last int;
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
  IF counted_attempts < 0 OR max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_horizon: counted_attempts must be at least 0 and max_attempts at least 1, not %s and %s',
                       counted_attempts, max_attempts),
      HINT = 'Pass the job''s attempt - uncounted (0 before its first attempt) and its max_attempts.';
  END IF;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_horizon: %s', v_problem),
      HINT = 'Pass a job''s backoff column, or NULL for the default.';
  END IF;
  v_last := max_attempts - 1;
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

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- sql/functions/_excerpt.sql as of 0001_release_0_1_0
CREATE OR REPLACE FUNCTION idemq._excerpt(value text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN value IS NULL THEN 'NULL'
            WHEN length(value) <= 60 THEN value
            ELSE left(value, 60) || format('… (%s characters)', length(value)) END;

COMMENT ON FUNCTION idemq._excerpt(text) IS
  'The first 60 characters of an input, for error messages (bounded whatever the input).';

-- sql/functions/_grant_roles.sql as of 0001_release_0_1_0
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

-- sql/functions/enqueue.sql as of 0001_release_0_1_0
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

-- sql/functions/retry.sql as of 0001_release_0_1_0
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

-- sql/functions/retry_horizon.sql as of 0001_release_0_1_0
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

DROP FUNCTION idemq.job;

-- ==== hand-written: the reversal (kept when migration:new amends this file) ====
-- The reversal of the schema changes above goes here, after the functions.
ALTER TYPE idemq.claimed_job RENAME ATTRIBUTE job_id TO id;
DROP TYPE idemq.job_row;
-- ==== end hand-written ====
