-- Migration 0027_generic_plans_for_job_arrays: enqueue_many, _parse_jobs, _enqueue_planned and _insert_jobs plan their statements generically (plan_cache_mode = force_generic_plan), so a call no longer copies its whole jobs array into a custom plan: 1,100 instructions less per job of a 10,000-job enqueue_many, 2,900 with keys (callgrind, PostgreSQL 15).
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

-- ---- sql/functions/_insert_jobs.sql ----
-- idemq._insert_jobs(jobs idemq._planned_job[], keyed boolean, parents boolean) RETURNS void
--
-- Insert, the last part of an enqueue: writes the plan's `created` jobs,
-- wires their continuations, counts the other outcomes, and wakes waiting
-- consumers. `keyed` / `parents` (see _enqueue_planned): some element has a
-- key (so outcomes other than created may need counting) / parents.
--
-- Guarantees:
--   * Each created job starts `awaiting` when a parent in `after` has not
--     succeeded, else in _initial_state(run_at); a parent already failed,
--     cancelled or expired (_unsuccessful_states) cancels its new child at
--     once, through an UPDATE so the key ledger and grandchildren follow, with
--     the reason in its errors. An awaiting child records what it waits on
--     in job_dependencies.
--   * Outcomes other than created are counted per task for stats().
--   * NOTIFY idemq_jobs (payload: queue) once per queue with a job runnable
--     now, when a session waits for it (_notify_waiting).
--   * No key logic: _resolve_keys decided the outcomes; parents are locked
--     by _lock_parents, so the states read here hold until commit.
-- Concurrency: plain inserts; see _notify_waiting for its advisory locks.
-- Errors: none of its own.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/continuations.test.ts, test/sql/wake-up.test.ts
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

-- ---- sql/functions/_parse_jobs.sql ----
-- idemq._parse_jobs(jobs jsonb, OUT planned idemq._planned_job[], OUT keyed boolean, OUT parents boolean)
--
-- Parse and check, the first part of enqueue_many: decodes a JSON array of
-- jobs into planned jobs (in element order, each with a new job id and
-- outcome `created` unless it has a key), or raises for the first element
-- that is wrong. `keyed` / `parents`: some element has a key / parents, so
-- _enqueue_planned skips the steps with nothing to do.
-- Longer than the usual 150 lines: it is the JSON decoder, one statement with
-- each field's decoding rule; split, the rules would be read in several
-- passes over the array (each pass over 20,000 elements costs 10-20 ms).
--
-- Guarantees:
--   * Decoding rules (what the JSON form needs): each element an object whose
--     fields are _enqueue_fields() (enqueue()'s parameters); each field of its JSON type (or null, or
--     absent: _job_defaults, run_at now); priority and max_attempts whole
--     numbers that fit an int; duplicate_policy a policy's name; after an
--     array of whole numbers; timestamps and key_retention (an interval) that
--     parse; traceparent a string.
--   * At most jobs_per_call elements (idemq.settings), checked before any
--     is decoded.
--   * Then the value rules every enqueue shares: _job_problem for each
--     element, with the limits read once (_enqueue_limits), _backoff_problem
--     once per distinct backoff (a batch usually shares one).
--   * The error names the first element (by position) that breaks a rule,
--     backoffs last; nothing is written and no row returned then.
--   * One statement decodes and checks the whole array (jsonb_array_elements,
--     the rules inlined); the others run only when it found a problem.
-- Concurrency: none (reads only its argument; takes job ids from the sequence).
-- Errors: 22004 jobs is NULL; 22023 jobs is not an array, has more than
--   jobs_per_call elements, or an element is wrong (_raise_bad_job:
--   "jobs[N] ..." with a HINT naming element N); messages quote excerpts
--   of the input only (_excerpt).
-- Tests: test/sql/enqueue-many.test.ts, test/sql/bad-input.test.ts, test/sql/limits.test.ts
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
  WHERE p.ordinal < coalesce(v_bad, 2147483647) AND idemq._job_problem(p, v_limits) IS NOT NULL
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

-- ---- sql/functions/_enqueue_planned.sql ----
-- idemq._enqueue_planned(jobs idemq._planned_job[], keyed boolean, parents boolean)
--   RETURNS idemq._planned_job[]
--
-- The pipeline shared by enqueue and enqueue_many, after parse and check:
-- resolve keys (_resolve_keys), lock parents (_lock_parents), insert
-- (_insert_jobs). Returns the plan with every element decided. `keyed`:
-- some element has an idempotency key; `parents`: some element names
-- parents in `after` (from _parse_jobs, or enqueue's arguments); without
-- them the steps that would find nothing to do are skipped.
--
-- Guarantees: those of its parts. The input is checked (_job_problem and
--   _backoff_problem passed), in ordinal order, with planned ids; the output
--   has one element per input element, in the same order, outcome one of created,
--   deduplicated, rejected, conflict. Rejections and conflicts do not raise
--   here (enqueue raises them).
-- Concurrency: see _resolve_keys (key rows in key order) and _lock_parents
--   (parents in id order).
-- Errors: IQ404 a parent in `after` does not exist; 40001 keys kept
--   changing under the call.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/enqueue-policies.test.ts, test/sql/enqueue-concurrency.test.ts,
--   test/sql/continuations.test.ts
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

-- ---- sql/functions/enqueue_many.sql ----
-- idemq.enqueue_many(jobs jsonb) RETURNS TABLE(ordinal int, job_id bigint, outcome text)
--
-- Adds many jobs in one statement: the fast path. `jobs` is a JSON array of
-- objects with enqueue()'s fields (task required; payload, queue, run_at,
-- priority, max_attempts, idempotency_key, duplicate_policy, backoff,
-- expires_at, after, key_retention, traceparent optional, with enqueue()'s
-- defaults).
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
--   * The pipeline: parse and check (_parse_jobs), then resolve keys, lock
--     parents and insert (_enqueue_planned), as enqueue() does.
--   * traceparent (per element): stored on a created job, as enqueue() does;
--     the result does not return the existing jobs' trace contexts.
-- Concurrency: as enqueue(); keys are taken in key order.
-- Errors: 22004 jobs is NULL; 22023 jobs is not an array, or an element is malformed (the message
--   names the element as jobs[N]); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue-many.test.ts, test/sql/bad-input.test.ts
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

-- Down Migration

-- sql/functions/_insert_jobs.sql as of 0018_traces
-- idemq._insert_jobs(jobs idemq._planned_job[], keyed boolean, parents boolean) RETURNS void
--
-- Insert, the last part of an enqueue: writes the plan's `created` jobs,
-- wires their continuations, counts the other outcomes, and wakes waiting
-- consumers. `keyed` / `parents` (see _enqueue_planned): some element has a
-- key (so outcomes other than created may need counting) / parents.
--
-- Guarantees:
--   * Each created job starts `awaiting` when a parent in `after` has not
--     succeeded, else in _initial_state(run_at); a parent already failed,
--     cancelled or expired (_unsuccessful_states) cancels its new child at
--     once, through an UPDATE so the key ledger and grandchildren follow, with
--     the reason in its errors. An awaiting child records what it waits on
--     in job_dependencies.
--   * Outcomes other than created are counted per task for stats().
--   * NOTIFY idemq_jobs (payload: queue) once per queue with a job runnable
--     now, when a session waits for it (_notify_waiting).
--   * No key logic: _resolve_keys decided the outcomes; parents are locked
--     by _lock_parents, so the states read here hold until commit.
-- Concurrency: plain inserts; see _notify_waiting for its advisory locks.
-- Errors: none of its own.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/continuations.test.ts, test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._insert_jobs(jobs idemq._planned_job[], keyed boolean, parents boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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

-- sql/functions/_parse_jobs.sql as of 0018_traces
-- idemq._parse_jobs(jobs jsonb, OUT planned idemq._planned_job[], OUT keyed boolean, OUT parents boolean)
--
-- Parse and check, the first part of enqueue_many: decodes a JSON array of
-- jobs into planned jobs (in element order, each with a new job id and
-- outcome `created` unless it has a key), or raises for the first element
-- that is wrong. `keyed` / `parents`: some element has a key / parents, so
-- _enqueue_planned skips the steps with nothing to do.
-- Longer than the usual 150 lines: it is the JSON decoder, one statement with
-- each field's decoding rule; split, the rules would be read in several
-- passes over the array (each pass over 20,000 elements costs 10-20 ms).
--
-- Guarantees:
--   * Decoding rules (what the JSON form needs): each element an object whose
--     fields are _enqueue_fields() (enqueue()'s parameters); each field of its JSON type (or null, or
--     absent: _job_defaults, run_at now); priority and max_attempts whole
--     numbers that fit an int; duplicate_policy a policy's name; after an
--     array of whole numbers; timestamps and key_retention (an interval) that
--     parse; traceparent a string.
--   * At most jobs_per_call elements (idemq.settings), checked before any
--     is decoded.
--   * Then the value rules every enqueue shares: _job_problem for each
--     element, with the limits read once (_enqueue_limits), _backoff_problem
--     once per distinct backoff (a batch usually shares one).
--   * The error names the first element (by position) that breaks a rule,
--     backoffs last; nothing is written and no row returned then.
--   * One statement decodes and checks the whole array (jsonb_array_elements,
--     the rules inlined); the others run only when it found a problem.
-- Concurrency: none (reads only its argument; takes job ids from the sequence).
-- Errors: 22004 jobs is NULL; 22023 jobs is not an array, has more than
--   jobs_per_call elements, or an element is wrong (_raise_bad_job:
--   "jobs[N] ..." with a HINT naming element N); messages quote excerpts
--   of the input only (_excerpt).
-- Tests: test/sql/enqueue-many.test.ts, test/sql/bad-input.test.ts, test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._parse_jobs(jobs jsonb, OUT planned idemq._planned_job[], OUT keyed boolean,
                                             OUT parents boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
  WHERE p.ordinal < coalesce(v_bad, 2147483647) AND idemq._job_problem(p, v_limits) IS NOT NULL
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

-- sql/functions/_enqueue_planned.sql as of 0009_enqueue_pipeline
-- idemq._enqueue_planned(jobs idemq._planned_job[], keyed boolean, parents boolean)
--   RETURNS idemq._planned_job[]
--
-- The pipeline shared by enqueue and enqueue_many, after parse and check:
-- resolve keys (_resolve_keys), lock parents (_lock_parents), insert
-- (_insert_jobs). Returns the plan with every element decided. `keyed`:
-- some element has an idempotency key; `parents`: some element names
-- parents in `after` (from _parse_jobs, or enqueue's arguments); without
-- them the steps that would find nothing to do are skipped.
--
-- Guarantees: those of its parts. The input is checked (_job_problem and
--   _backoff_problem passed), in ordinal order, with planned ids; the output
--   has one element per input element, in the same order, outcome one of created,
--   deduplicated, rejected, conflict. Rejections and conflicts do not raise
--   here (enqueue raises them).
-- Concurrency: see _resolve_keys (key rows in key order) and _lock_parents
--   (parents in id order).
-- Errors: IQ404 a parent in `after` does not exist; 40001 keys kept
--   changing under the call.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/enqueue-policies.test.ts, test/sql/enqueue-concurrency.test.ts,
--   test/sql/continuations.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_planned(jobs idemq._planned_job[], keyed boolean, parents boolean)
RETURNS idemq._planned_job[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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

-- sql/functions/enqueue_many.sql as of 0018_traces
-- idemq.enqueue_many(jobs jsonb) RETURNS TABLE(ordinal int, job_id bigint, outcome text)
--
-- Adds many jobs in one statement: the fast path. `jobs` is a JSON array of
-- objects with enqueue()'s fields (task required; payload, queue, run_at,
-- priority, max_attempts, idempotency_key, duplicate_policy, backoff,
-- expires_at, after, key_retention, traceparent optional, with enqueue()'s
-- defaults).
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
--   * The pipeline: parse and check (_parse_jobs), then resolve keys, lock
--     parents and insert (_enqueue_planned), as enqueue() does.
--   * traceparent (per element): stored on a created job, as enqueue() does;
--     the result does not return the existing jobs' trace contexts.
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

-- Hand-written reversal of the schema changes above goes here, after the functions.
