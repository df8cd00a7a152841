-- Migration 0009_enqueue_pipeline (issue 10): enqueue as a short pipeline over one planned-job type
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

-- One element of an enqueue call as it moves through the pipeline (parse and
-- check, resolve keys, insert): its position, the job id planned for it, its
-- outcome, for a rejection the state the key's latest job ended in, then the
-- job's fields, which are enqueue()'s parameters (the one list of them:
-- idemq._enqueue_fields()).
CREATE TYPE idemq._planned_job AS (
  ordinal           int,
  job_id            bigint,
  outcome           text,
  existing_state    idemq.job_state,
  task              text,
  payload           jsonb,
  queue             text,
  run_at            timestamptz,
  priority          int,
  max_attempts      int,
  idempotency_key   text,
  duplicate_policy  idemq.duplicate_policy,
  backoff           jsonb,
  expires_at        timestamptz,
  after             bigint[]
);

-- Replaced by idemq._planned_job (only the removed _enqueue_rows used it).
DROP TYPE idemq._job_input;

-- ---- sql/functions/_enqueue_fields.sql ----
-- idemq._enqueue_fields() RETURNS text[]
--
-- The fields of a job an enqueue asks for, in order: enqueue()'s parameters,
-- and the fields an enqueue_many element may have.
--
-- Guarantees: the attributes of idemq._planned_job after its four plan
--   fields (ordinal, job_id, outcome, existing_state), so the type is the one
--   list of enqueue fields; test/contract/contract.test.ts checks that they
--   equal enqueue()'s parameter names, in order.
-- Concurrency: none (reads the catalog).
-- Errors: none.
-- Tests: test/contract/contract.test.ts, test/sql/enqueue-many.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_fields()
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
RETURN ARRAY(SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = 'idemq._planned_job'::regclass AND a.attnum > 4 AND NOT a.attisdropped
             ORDER BY a.attnum);

COMMENT ON FUNCTION idemq._enqueue_fields() IS
  'The fields of a job to enqueue (enqueue()''s parameters, enqueue_many''s element fields): idemq._planned_job''s after its plan fields.';

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
AS $$
#variable_conflict error
DECLARE
  v_notified bigint;
BEGIN
  WITH ins AS (
    INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                 idempotency_key, backoff, expires_at)
    SELECT p.job_id, p.task, p.queue, p.payload,
           CASE WHEN parents AND p.after IS NOT NULL AND EXISTS (
                  SELECT 1 FROM idemq.jobs pj WHERE pj.id = ANY (p.after) AND pj.state <> 'succeeded')
                THEN 'awaiting'::idemq.job_state
                ELSE idemq._initial_state(p.run_at) END,
           p.priority, p.run_at, p.max_attempts, p.idempotency_key, p.backoff, p.expires_at
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

-- ---- sql/functions/_job_problem.sql ----
-- idemq._job_problem(job idemq._planned_job) RETURNS text
--
-- Says what is wrong with one job an enqueue asks for, or NULL when nothing
-- is: the value rules of enqueue and enqueue_many, written once.
--
-- Guarantees:
--   * The one definition of a valid job, applied to typed values: enqueue()
--     checks its arguments with it, _parse_jobs every decoded element of
--     enqueue_many, so a job is refused for the same reason whichever
--     function, or whichever path inside them, it takes.
--   * Rules: task non-empty; payload a JSON object; queue non-empty and at
--     most _queue_name_limit() characters; max_attempts >= 1;
--     idempotency_key non-empty when given; parents in `after` positive ids.
--     The backoff is _backoff_problem's (a batch checks each distinct
--     backoff once instead of once per job, so it is not repeated here);
--     NULL arguments are the callers' (enqueue raises 22004, enqueue_many
--     fills defaults), except a NULL task, refused here.
--   * A SQL function of one expression, neither STRICT nor plpgsql, without
--     a sub-SELECT and STABLE like format(), so the planner inlines it into
--     _parse_jobs' statement: called per element instead, it cost 15 us each,
--     more than decoding (EXPLAIN VERBOSE shows the call when it is not inlined).
-- Concurrency: none (reads only its argument).
-- Errors: none (callers raise through _raise_bad_job).
-- Tests: test/sql/bad-input.test.ts, test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts
CREATE OR REPLACE FUNCTION idemq._job_problem(job idemq._planned_job)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
  WHEN job.task IS NULL OR job.task = '' THEN
    'task must be a non-empty string: the name of a task your workers handle'
  WHEN jsonb_typeof(job.payload) IS DISTINCT FROM 'object' THEN
    format('payload must be a JSON object, not %s', coalesce(job.payload::text, 'NULL'))
  WHEN job.queue = '' THEN
    'queue must be a non-empty string'
  WHEN length(job.queue) > idemq._queue_name_limit() THEN
    format('queue must be at most %s characters, not %s', idemq._queue_name_limit(), length(job.queue))
  WHEN job.max_attempts < 1 THEN
    format('max_attempts must be at least 1, not %s', job.max_attempts)
  WHEN job.idempotency_key = '' THEN
    'idempotency_key must be a non-empty string or null'
  WHEN array_position(job.after, NULL) IS NOT NULL OR 0 >= ANY (job.after) THEN
    format('after must be an array of job ids, not %s', job.after)
END;

COMMENT ON FUNCTION idemq._job_problem(idemq._planned_job) IS
  'What is wrong with one job to enqueue (NULL: nothing): the value rules of enqueue and enqueue_many, once.';

-- ---- sql/functions/_key_leaders.sql ----
-- idemq._key_leaders(jobs idemq._planned_job[], first_round boolean)
--   RETURNS TABLE(key text, job_id bigint, task text, payload jsonb, payload_md5 text,
--                 duplicate_policy idemq.duplicate_policy, elements bigint)
--
-- The leader of each idempotency key still undecided in a plan: its first
-- element (by ordinal) with that key, among those `undecided` (all keyed
-- elements in the first round, then those whose outcome is NULL). Within one
-- call the leader decides for the key; later elements with it follow
-- (_resolve_keys).
--
-- Guarantees: one row per undecided key, in key order (the order key rows
--   are written in, so overlapping batches lock them alike); job_id is the
--   id the plan gave the leader, which its key row names when it wins;
--   elements: how many undecided elements have the key (the leader included).
-- Concurrency: none (reads only its argument). Inlined into the statements
--   of _resolve_keys that insert and take over key rows.
-- Errors: none.
-- Tests: test/sql/enqueue-many.test.ts, test/sql/enqueue-policies.test.ts
CREATE OR REPLACE FUNCTION idemq._key_leaders(jobs idemq._planned_job[], first_round boolean)
RETURNS TABLE(key text, job_id bigint, task text, payload jsonb, payload_md5 text,
              duplicate_policy idemq.duplicate_policy, elements bigint)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT l.idempotency_key, l.job_id, l.task, l.payload, md5(l.payload::text), l.duplicate_policy, l.elements
  FROM (SELECT DISTINCT ON (p.idempotency_key) p.*, count(*) OVER (PARTITION BY p.idempotency_key) AS elements
        FROM unnest(jobs) p
        WHERE p.idempotency_key IS NOT NULL AND (first_round OR p.outcome IS NULL)
        ORDER BY p.idempotency_key, p.ordinal) l
  ORDER BY l.idempotency_key
$$;

COMMENT ON FUNCTION idemq._key_leaders(idemq._planned_job[], boolean) IS
  'The first undecided element of each idempotency key in a plan, in key order: the one that decides for the key.';

-- ---- sql/functions/_lock_parents.sql ----
-- idemq._lock_parents(jobs idemq._planned_job[]) RETURNS void
--
-- The parents named in `after` by a plan's elements: locks them, checks that
-- they exist, and marks them as having children.
--
-- Guarantees: every parent exists, or IQ404 names one that does not (nothing
--   written, as the caller's statement fails). After it, each parent's state
--   cannot change until the caller's transaction ends, so _insert_jobs reads
--   the state a child starts from, and a parent finishing later sees
--   has_children and releases (or cancels) the child. Each parent is looked
--   up by primary key: linear in the number of parents named.
-- Concurrency: parents are row-locked FOR NO KEY UPDATE, in id order (fewer
--   deadlocks between overlapping calls); a parent being finished
--   concurrently makes this wait for that transaction.
-- Errors: IQ404 a parent job that does not exist.
-- Tests: test/sql/continuations.test.ts, test/sql/enqueue-many.test.ts
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

-- ---- sql/functions/_raise_bad_job.sql ----
-- idemq._raise_bad_job(problem text, ordinal int) RETURNS void
--
-- Raises 22023 for a job an enqueue refuses: `problem` (from _job_problem,
-- _backoff_problem or _parse_jobs' decoding) names what is wrong; `ordinal`
-- names the element of enqueue_many's array (NULL: enqueue's arguments).
--
-- Guarantees: the one wording of a refused job: "jobs[N] <problem>" with a
--   HINT naming element N, or the bare problem for enqueue; always says that
--   nothing was enqueued (the caller raises before it writes).
-- Concurrency: none.
-- Errors: always 22023.
-- Tests: test/sql/bad-input.test.ts, test/sql/enqueue-many.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_bad_job(problem text, ordinal int)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22023',
    MESSAGE = CASE WHEN ordinal IS NULL THEN problem ELSE format('jobs[%s] %s', ordinal, problem) END,
    HINT = CASE WHEN ordinal IS NULL THEN 'Fix the argument; nothing was enqueued.'
                ELSE format('Fix element %s (1-based) of the jobs array; nothing was enqueued.', ordinal) END;
END;
$$;

COMMENT ON FUNCTION idemq._raise_bad_job(text, int) IS
  'Raise 22023 for a refused job, naming jobs[N] for an enqueue_many element; nothing was enqueued.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._parse_jobs;
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
--     array of whole numbers; timestamps that parse.
--   * Then the value rules every enqueue shares: _job_problem for each
--     element, _backoff_problem once per distinct backoff (a batch usually
--     shares one).
--   * The error names the first element (by position) that breaks a rule,
--     backoffs last; nothing is written and no row returned then.
--   * One statement decodes and checks the whole array (jsonb_array_elements,
--     the rules inlined); the others run only when it found a problem.
-- Concurrency: none (reads only its argument; takes job ids from the sequence).
-- Errors: 22004 jobs is NULL; 22023 jobs is not an array, or an element is
--   wrong (_raise_bad_job: "jobs[N] ..." with a HINT naming element N).
-- Tests: test/sql/enqueue-many.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._parse_jobs(jobs jsonb, OUT planned idemq._planned_job[], OUT keyed boolean,
                                             OUT parents boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_fields text[] := idemq._enqueue_fields();
  v_defaults jsonb := idemq._job_defaults();
  v_policies text[] := enum_range(NULL::idemq.duplicate_policy)::text[];
  v_now timestamptz := now();
  v_bad int;
  v_problem text;
  v_ord int;
  v_value_problem text;
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

  BEGIN
    -- One pass in C (jsonb_to_recordset, every field as text or jsonb, which
    -- any JSON value converts to) and cheap checks that skip absent fields.
    -- MATERIALIZED: pulled up, the checks would run once per use of `shape`.
    WITH decoded AS MATERIALIZED (
      SELECT r.*, CASE
          WHEN r.v - v_fields <> '{}' THEN
            format('has an unknown field "%s" (fields: %s)',
                   (SELECT min(f) FROM jsonb_object_keys(r.v - v_fields) f), array_to_string(v_fields, ', '))
          WHEN r.task IS NOT NULL AND jsonb_typeof(r.v->'task') <> 'string' THEN
            format('task must be a string, not %s', r.v->'task')
          WHEN r.queue IS NOT NULL AND jsonb_typeof(r.v->'queue') <> 'string' THEN
            format('queue must be a string, not %s', r.v->'queue')
          WHEN r.run_at IS NOT NULL AND jsonb_typeof(r.v->'run_at') <> 'string' THEN
            format('run_at must be a timestamp string, not %s', r.v->'run_at')
          WHEN r.expires_at IS NOT NULL AND jsonb_typeof(r.v->'expires_at') <> 'string' THEN
            format('expires_at must be a timestamp string, not %s', r.v->'expires_at')
          WHEN r.priority IS NOT NULL AND (jsonb_typeof(r.v->'priority') <> 'number'
               OR r.priority::numeric NOT BETWEEN -2147483648 AND 2147483647
               OR r.priority::numeric <> trunc(r.priority::numeric)) THEN
            format('priority must be a whole number (higher runs first), not %s', r.v->'priority')
          WHEN r.max_attempts IS NOT NULL AND (jsonb_typeof(r.v->'max_attempts') <> 'number'
               OR r.max_attempts::numeric NOT BETWEEN -2147483648 AND 2147483647
               OR r.max_attempts::numeric <> trunc(r.max_attempts::numeric)) THEN
            format('max_attempts must be a whole number >= 1, not %s', r.v->'max_attempts')
          WHEN r.idempotency_key IS NOT NULL AND jsonb_typeof(r.v->'idempotency_key') <> 'string' THEN
            format('idempotency_key must be a string or null, not %s', r.v->'idempotency_key')
          WHEN r.duplicate_policy IS NOT NULL AND (jsonb_typeof(r.v->'duplicate_policy') <> 'string'
               OR r.duplicate_policy <> ALL (v_policies)) THEN
            format('duplicate_policy must be one of %s, not %s', array_to_string(v_policies, ', '), r.v->'duplicate_policy')
          WHEN r.after IS NOT NULL AND jsonb_typeof(r.after) <> 'null' AND (jsonb_typeof(r.after) <> 'array'
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(r.after) a
                          WHERE jsonb_typeof(a) NOT IN ('number', 'null')
                             OR (jsonb_typeof(a) = 'number' AND (a::numeric NOT BETWEEN 1 AND 9223372036854775807
                                                                 OR a::numeric <> trunc(a::numeric))))) THEN
            format('after must be an array of job ids, not %s', r.after)
        END AS shape
      FROM ROWS FROM (jsonb_array_elements(jobs),
                      jsonb_to_recordset(jobs) AS (task text, payload jsonb, queue text, run_at text, priority text,
                        max_attempts text, idempotency_key text, duplicate_policy text, backoff jsonb,
                        expires_at text, after jsonb)) WITH ORDINALITY
           AS r(v, task, payload, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy,
                backoff, expires_at, after, ord)
    )
    -- In element order (the CTE scan keeps its input's order): ids are taken
    -- in that order, and the array needs no sort.
    SELECT array_agg(CASE WHEN d.shape IS NULL THEN ROW(
               d.ord, nextval('idemq.jobs_id_seq'), 'created', NULL,
               d.task,
               coalesce(nullif(d.payload, 'null'), v_defaults->'payload'),
               coalesce(d.queue, v_defaults->>'queue'),
               coalesce(d.run_at::timestamptz, v_now),
               coalesce(d.priority, v_defaults->>'priority')::numeric::int,
               coalesce(d.max_attempts, v_defaults->>'max_attempts')::numeric::int,
               d.idempotency_key,
               coalesce(d.duplicate_policy, v_defaults->>'duplicate_policy')::idemq.duplicate_policy,
               nullif(d.backoff, 'null'),
               d.expires_at::timestamptz,
               CASE WHEN jsonb_typeof(d.after) = 'array' AND jsonb_array_length(d.after) > 0
                    THEN ARRAY(SELECT a::numeric::bigint FROM jsonb_array_elements_text(d.after) a) END
             )::idemq._planned_job END),
           coalesce(bool_or(d.idempotency_key IS NOT NULL), false),
           coalesce(bool_or(jsonb_typeof(d.after) = 'array' AND jsonb_array_length(d.after) > 0), false),
           min(d.ord) FILTER (WHERE d.shape IS NOT NULL),
           (array_agg(d.shape ORDER BY d.ord) FILTER (WHERE d.shape IS NOT NULL))[1]
    FROM decoded d
    INTO planned, keyed, parents, v_bad, v_problem;
  EXCEPTION WHEN data_exception THEN
    -- An element that is not an object, or a timestamp that does not parse,
    -- fails the statement: find the first such element; an earlier
    -- element's problem comes first.
    FOR v_bad, v_elem IN SELECT e.ord, e.v FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(v, ord) LOOP
      v_problem := CASE WHEN jsonb_typeof(v_elem) <> 'object' THEN format('must be a JSON object, not %s', v_elem) END;
      IF v_problem IS NULL THEN
        BEGIN
          PERFORM (v_elem->>'run_at')::timestamptz, (v_elem->>'expires_at')::timestamptz;
        EXCEPTION WHEN data_exception THEN
          v_problem := format('run_at/expires_at is not a timestamp: %s', SQLERRM);
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
  SELECT p.ordinal, idemq._job_problem(p) INTO v_ord, v_value_problem
  FROM unnest(planned) p
  WHERE p.ordinal < coalesce(v_bad, 2147483647) AND idemq._job_problem(p) IS NOT NULL
  ORDER BY p.ordinal LIMIT 1;
  IF FOUND THEN
    v_bad := v_ord;
    v_problem := v_value_problem;
  END IF;
  IF v_bad IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem, v_bad);
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

-- ---- sql/functions/_resolve_keys.sql ----
-- idemq._resolve_keys(jobs idemq._planned_job[]) RETURNS idemq._planned_job[]
--
-- Resolve keys, the second part of an enqueue: decides the outcome of every
-- element with an idempotency key against the key ledger, writing the key
-- rows this call wins.
--
-- Guarantees:
--   * Per key, its leader (_key_leaders) decides: a new key is inserted
--     (`created`, with the leader's planned id); a key whose latest job is
--     terminal is taken over when _policy_rejects allows (`created`), else
--     `rejected` (existing_state: how that job ended); a key held by an
--     active job yields that job: `deduplicated`, or `conflict` when the task
--     or payload differ (jsonb equality: the md5 of the jsonb text is only a
--     fast path, since numbers equal as jsonb can print differently, 1 and
--     1.0).
--   * Later elements with the key follow: `deduplicated` against the job the
--     key then holds (or `conflict`), or the leader's rejection.
--   * Usually one round; another only when a key row changed between two
--     statements (pruned, or finished, concurrently). All keys new and none
--     repeated, the common bulk case, is one statement.
--   * job_id of a decided element: its own planned id when `created`, else
--     the key's job.
-- Concurrency: key rows are inserted in key order; N concurrent callers with
--   one new key create exactly one job: the key row's primary key serialises
--   them (ON CONFLICT waits for the inserter's transaction); if the inserter
--   rolls back, a waiter inserts. A takeover locks the key row, so a
--   concurrent taker waits, then sees the key active. Under REPEATABLE READ a
--   concurrent committed duplicate raises 40001: retry.
-- Errors: 40001 if keys keep changing under the call (pruned and re-created repeatedly).
-- Tests: test/sql/enqueue-many.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts
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
  LOOP
    -- The plan's outcomes start as `created`: in the first round every keyed
    -- element is undecided, later only those left NULL by the round before.
    WITH leader AS MATERIALIZED (
      SELECT * FROM idemq._key_leaders(jobs, v_round = 0)
    ), ins AS (
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
      SELECT l.key, l.job_id, l.task, l.payload_md5 FROM leader l ORDER BY l.key
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING 1
    )
    SELECT (SELECT coalesce(sum(l.elements), 0) FROM leader l), (SELECT count(*) FROM leader),
           (SELECT count(*) FROM ins)
    INTO v_undecided, v_leaders, v_inserted;
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
      SET job_id = l.job_id, task = l.task, payload_md5 = l.payload_md5,
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
                         'existing_state', CASE WHEN d.outcome = 'rejected' THEN w.holder_finished END))
                  ELSE w.p END
      FROM (SELECT p, p.idempotency_key IS NOT NULL AND (v_round = 1 OR p.outcome IS NULL) AS undecided,
                   h.job_id AS holder_id, h.task AS holder_task, h.payload_md5 AS holder_md5,
                   h.finished_state AS holder_finished, h.payload AS holder_payload,
                   first_value(p.ordinal) OVER k AS lead_ordinal, first_value(p.job_id) OVER k AS lead_job_id,
                   first_value(p.payload) OVER k AS lead_payload,
                   first_value(p.duplicate_policy) OVER k AS lead_policy
            FROM unnest(jobs) p
            LEFT JOIN LATERAL (
              SELECT hk.job_id, hk.task, hk.payload_md5, hk.finished_state, hj.payload
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
--   row's primary key serialises them; see _resolve_keys).
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
  v_job idemq._planned_job;
  v_problem text;
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
  END;
  IF v_null IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('enqueue: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
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
  v_problem := coalesce(idemq._job_problem(v_job),
                        CASE WHEN v_job.backoff IS NOT NULL THEN idemq._backoff_problem(v_job.backoff) END);
  IF v_problem IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem, NULL);
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
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
      VALUES (v_job.idempotency_key, v_job.job_id, v_job.task, md5(v_job.payload::text))
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.job_id INTO v_key_job;
    END IF;
    IF v_job.idempotency_key IS NULL OR v_key_job IS NOT NULL THEN
      v_state := idemq._initial_state(v_job.run_at);
      INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                   idempotency_key, backoff, expires_at)
      VALUES (v_job.job_id, v_job.task, v_job.queue, v_job.payload, v_state, v_job.priority, v_job.run_at,
              v_job.max_attempts, v_job.idempotency_key, v_job.backoff, v_job.expires_at);
      IF v_state = 'enqueued' THEN
        PERFORM idemq._notify_waiting(v_job.queue);
      END IF;
      job_id := v_job.job_id;
      deduplicated := false;
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
--   * The pipeline: parse and check (_parse_jobs), then resolve keys, lock
--     parents and insert (_enqueue_planned), as enqueue() does.
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

-- ---- sql/functions/_enqueue_rows.sql (removed) ----
DROP FUNCTION idemq._enqueue_rows;

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._enqueue_fields FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._enqueue_planned FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._insert_jobs FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._job_problem FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._key_leaders FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._lock_parents FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._raise_bad_job FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._resolve_keys FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._parse_jobs FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- Before the functions: the restored _enqueue_rows declares a variable of it,
-- which CREATE FUNCTION checks.
CREATE TYPE idemq._job_input AS (
  ordinal           int,
  task              text,
  payload           jsonb,
  payload_md5       text,
  queue             text,
  run_at            timestamptz,
  priority          int,
  max_attempts      int,
  idempotency_key   text,
  duplicate_policy  idemq.duplicate_policy,
  backoff           jsonb,
  expires_at        timestamptz,
  after             bigint[]
);

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._parse_jobs;
-- sql/functions/_parse_jobs.sql as of 0005_least_privilege
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

-- sql/functions/_enqueue_rows.sql as of 0005_least_privilege
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

-- sql/functions/enqueue.sql as of 0005_least_privilege
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

-- sql/functions/enqueue_many.sql as of 0005_least_privilege
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

DROP FUNCTION idemq._enqueue_planned;
DROP FUNCTION idemq._resolve_keys;
DROP FUNCTION idemq._raise_bad_job;
DROP FUNCTION idemq._lock_parents;
DROP FUNCTION idemq._key_leaders;
DROP FUNCTION idemq._job_problem;
DROP FUNCTION idemq._insert_jobs;
DROP FUNCTION idemq._enqueue_fields;
REVOKE EXECUTE ON FUNCTION idemq._enqueue_rows FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._parse_jobs FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Hand-written reversal of the schema changes above goes here, after the functions.

DROP TYPE idemq._planned_job;
