-- Migration 0011_enqueue_limits: (issues 10, 11, 12): bulk enqueue back to its old speed (defaults typed once, _key_leaders inlined, new keys by plain INSERT), enqueue-side limits, per-key retention.
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

-- Enqueue-side limits (issue 11 item 5): rows of idemq.settings, like those of
-- 0007_limits. key_bytes and payload_bytes exist; they now bound enqueue too.
INSERT INTO idemq.settings (name, value, min_value, max_value, description) VALUES
  ('task_bytes', 256, 1, 2000,
   'longest task name enqueue accepts, in bytes of UTF-8'),
  ('jobs_per_call', 50000, 1, 1000000,
   'most jobs one enqueue_many call accepts'),
  ('parents_per_job', 1000, 1, 100000,
   'most parents one job may wait for (enqueue''s after)');
UPDATE idemq.settings SET description = 'longest idempotency key, guard key, effect key and effect owner, in bytes of UTF-8'
WHERE name = 'key_bytes';
UPDATE idemq.settings SET description = 'largest job payload, in bytes of its JSON text'
WHERE name = 'payload_bytes';

-- The limits an enqueue checks, read once per call (_enqueue_limits) and
-- passed to _job_problem. Its fields are names of idemq.settings rows.
CREATE TYPE idemq._enqueue_limits AS (
  payload_bytes    bigint,
  key_bytes        bigint,
  task_bytes       bigint,
  parents_per_job  bigint,
  jobs_per_call    bigint,
  duration_days    bigint
);

-- Per-key retention (issue 12 item 4): enqueue(key_retention) is stored on the
-- key row, and prune_keys releases a key only after it. Keys written before
-- this migration get the retention prune_keys' default gave them.
ALTER TYPE idemq._planned_job ADD ATTRIBUTE key_retention interval;
ALTER TABLE idemq.keys ADD COLUMN retention interval;
UPDATE idemq.keys SET retention = interval '14 days';
ALTER TABLE idemq.keys ALTER COLUMN retention SET NOT NULL;
ALTER TABLE idemq.keys ADD CONSTRAINT keys_retention_not_negative CHECK (retention >= interval '0');

-- ---- sql/functions/_enqueue_limits.sql ----
-- idemq._enqueue_limits() RETURNS SETOF idemq._enqueue_limits
--
-- The limits an enqueue checks, read from idemq.settings in one query, once
-- per enqueue or enqueue_many call: payload_bytes, key_bytes (the
-- idempotency key), task_bytes, parents_per_job (after), jobs_per_call and
-- duration_days (key_retention).
--
-- Guarantees: exactly one row; every field is the value of the settings row
--   of its name, as _limit() reads it (so a limit still has one definition:
--   its row); a row missing raises through _limit(). _job_problem takes the
--   row as an argument, so a batch reads each limit once, not once per
--   element.
--   * Called in FROM (SELECT * INTO v_limits FROM idemq._enqueue_limits()):
--     a SQL-standard body, SETOF so that the planner inlines it into the
--     caller's query. As a plpgsql function it cost 10 us per call (5,000
--     calls, backend CPU), as much as a quarter of a single enqueue; inlined,
--     5 us.
-- Concurrency: a plain read of idemq.settings; a changed value applies to
--   statements that start after it commits.
-- Errors: 42704 a limit row is missing (a schema older than its caller: run
--   idemq migrate).
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_limits()
RETURNS SETOF idemq._enqueue_limits
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT coalesce(max(s.value) FILTER (WHERE s.name = 'payload_bytes'), idemq._limit('payload_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'key_bytes'), idemq._limit('key_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'task_bytes'), idemq._limit('task_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'parents_per_job'), idemq._limit('parents_per_job')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'jobs_per_call'), idemq._limit('jobs_per_call')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'duration_days'), idemq._limit('duration_days'))
  FROM idemq.settings s;
END;

COMMENT ON FUNCTION idemq._enqueue_limits() IS
  'The limits an enqueue checks (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days), read once per call.';

-- ---- sql/functions/_job_defaults.sql ----
-- idemq._job_defaults() RETURNS jsonb
--
-- The defaults of a job's optional fields in an enqueue_many element.
--
-- Guarantees: the same values as the DEFAULTs in enqueue()'s signature
--   (test/contract/contract.test.ts compares them), so a job means the same thing
--   whichever function enqueued it.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq._job_defaults()
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{"payload": {}, "queue": "default", "priority": 0, "max_attempts": 10,
         "duplicate_policy": "allow_after_failed", "key_retention": "14 days"}'::jsonb;

COMMENT ON FUNCTION idemq._job_defaults() IS
  'Defaults of optional job fields for enqueue_many; equal to enqueue()''s DEFAULTs.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._job_problem;
-- ---- sql/functions/_job_problem.sql ----
-- idemq._job_problem(job idemq._planned_job, limits idemq._enqueue_limits) RETURNS text[]
--
-- Says what is wrong with one job an enqueue asks for, and how to fix it, or
-- NULL when nothing is: the value rules of enqueue and enqueue_many, written
-- once.
--
-- Guarantees:
--   * The one definition of a valid job, applied to typed values: enqueue()
--     checks its arguments with it, _parse_jobs every decoded element of
--     enqueue_many, so a job is refused for the same reason whichever
--     function, or whichever path inside them, it takes.
--   * Returns ARRAY[problem, hint] (hint NULL where the problem says it all):
--     _raise_bad_job words the 22023 from them.
--   * Rules: task non-empty and at most limits.task_bytes bytes (UTF-8);
--     payload a JSON object of at most limits.payload_bytes bytes of JSON
--     text; queue non-empty and at most _queue_name_limit() characters;
--     run_at finite (not infinity or -infinity); max_attempts >= 1;
--     idempotency_key non-empty when given and at most limits.key_bytes
--     bytes; after at most limits.parents_per_job parents, each a positive
--     id; key_retention not negative and at most limits.duration_days days. The backoff is _backoff_problem's (a batch checks each distinct
--     backoff once instead of once per job, so it is not repeated here);
--     NULL arguments are the callers' (enqueue raises 22004, enqueue_many
--     fills defaults), except a NULL task, refused here.
--   * Problems quote at most an excerpt of the input (_excerpt).
--   * `limits` comes from _enqueue_limits(), read once per call by the
--     caller: a limit read here would be a query per element.
--   * A SQL function of one expression, neither STRICT nor plpgsql, without
--     a sub-SELECT and STABLE like format(), so the planner inlines it into
--     _parse_jobs' statement: called per element instead, it cost 15 us each,
--     more than decoding (EXPLAIN VERBOSE shows the call when it is not inlined).
--     The payload's JSON text is made only for an object (the cost of the
--     payload_bytes rule: about 2 ms per 20,000 small payloads).
-- Concurrency: none (reads only its arguments).
-- Errors: none (callers raise through _raise_bad_job).
-- Tests: test/sql/bad-input.test.ts, test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._job_problem(job idemq._planned_job, limits idemq._enqueue_limits)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
  WHEN job.task IS NULL OR job.task = '' THEN
    ARRAY['task must be a non-empty string: the name of a task your workers handle', NULL]
  WHEN octet_length(job.task) > limits.task_bytes THEN
    ARRAY[format('task is %s bytes, over the limit of %s bytes (task_bytes): %s',
                 octet_length(job.task), limits.task_bytes, idemq._excerpt(job.task)),
          'Name tasks briefly, e.g. ''send_email''; an admin can raise task_bytes in idemq.settings.']
  WHEN jsonb_typeof(job.payload) IS DISTINCT FROM 'object' THEN
    ARRAY[format('payload must be a JSON object, not %s', idemq._excerpt(coalesce(job.payload::text, 'NULL'))),
          'Wrap the value in an object, e.g. {"value": ...}.']
  WHEN octet_length(job.payload::text) > limits.payload_bytes THEN
    ARRAY[format('payload is %s bytes of JSON text, over the limit of %s bytes (payload_bytes): %s',
                 octet_length(job.payload::text), limits.payload_bytes, idemq._excerpt(job.payload::text)),
          'Store large data elsewhere (a table, object storage) and put its id in the payload; '
          'an admin can raise payload_bytes in idemq.settings.']
  WHEN job.queue = '' THEN
    ARRAY['queue must be a non-empty string', 'Leave queue out for the default queue.']
  WHEN length(job.queue) > idemq._queue_name_limit() THEN
    ARRAY[format('queue must be at most %s characters, not %s: %s', idemq._queue_name_limit(), length(job.queue),
                 idemq._excerpt(job.queue)),
          'Use a short queue name: it travels as the NOTIFY payload.']
  WHEN NOT isfinite(job.run_at) THEN
    ARRAY[format('run_at must be a finite time, not %s', job.run_at),
          'Pass a real time, e.g. now() + interval ''1 hour'', or leave run_at out to run at once.']
  WHEN job.max_attempts < 1 THEN
    ARRAY[format('max_attempts must be at least 1, not %s', job.max_attempts), NULL]
  WHEN job.idempotency_key = '' THEN
    ARRAY['idempotency_key must be a non-empty string or null', NULL]
  WHEN octet_length(job.idempotency_key) > limits.key_bytes THEN
    ARRAY[format('idempotency_key is %s bytes, over the limit of %s bytes (key_bytes): %s',
                 octet_length(job.idempotency_key), limits.key_bytes, idemq._excerpt(job.idempotency_key)),
          'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''order:'' || md5(...).']
  WHEN cardinality(job.after) > limits.parents_per_job THEN
    ARRAY[format('after names %s parents, over the limit of %s (parents_per_job)', cardinality(job.after),
                 limits.parents_per_job),
          'Wait for fewer jobs: chain through an intermediate job that waits for a part of them; '
          'an admin can raise parents_per_job in idemq.settings.']
  WHEN array_position(job.after, NULL) IS NOT NULL OR 0 >= ANY (job.after) THEN
    ARRAY[format('after must be an array of job ids, not %s', idemq._excerpt(job.after::text)), NULL]
  WHEN job.key_retention < interval '0' THEN
    ARRAY[format('key_retention must not be negative, not %s', job.key_retention),
          'key_retention is how long a finished job''s key stays held, e.g. ''14 days''.']
  WHEN job.key_retention > make_interval(days => limits.duration_days::int) THEN
    ARRAY[format('key_retention must be at most %s days (duration_days), not %s', limits.duration_days, job.key_retention),
          format('Use a retention of at most %s days (duration_days in idemq.settings).', limits.duration_days)]
END;

COMMENT ON FUNCTION idemq._job_problem(idemq._planned_job, idemq._enqueue_limits) IS
  'What is wrong with one job to enqueue, and the fix (NULL: nothing): the value rules of enqueue and enqueue_many, once.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._key_leaders;
-- ---- sql/functions/_key_leaders.sql ----
-- idemq._key_leaders(jobs idemq._planned_job[], first_round boolean)
--   RETURNS TABLE(key text, job_id bigint, task text, payload jsonb, payload_md5 text,
--                 duplicate_policy idemq.duplicate_policy, elements bigint, retention interval)
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
--   elements: how many undecided elements have the key (the leader included);
--   retention: the leader's key_retention, which its key row keeps.
-- Concurrency: none (reads only its argument). Inlined into the statements
--   of _resolve_keys that insert and take over key rows: a SQL-standard body
--   (BEGIN ATOMIC) without SET, since the planner never inlines a function
--   with a SET clause. As `AS $$` with SET search_path it ran as a function
--   scan: its rows went through a tuplestore and were sorted again for the
--   insert's ORDER BY (EXPLAIN VERBOSE shows "Function Scan on _key_leaders"
--   then; inlined, one Sort on the key under the Insert), about 10 ms per
--   20,000 keys. It lists the columns it reads (not p.*): an inlined query
--   only computes those its caller uses.
-- Errors: none.
-- Tests: test/sql/enqueue-many.test.ts, test/sql/enqueue-policies.test.ts
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._raise_bad_job;
-- ---- sql/functions/_raise_bad_job.sql ----
-- idemq._raise_bad_job(problem text, ordinal int, hint text DEFAULT NULL) RETURNS void
--
-- Raises 22023 for a job an enqueue refuses: `problem` (from _job_problem,
-- _backoff_problem or _parse_jobs' decoding) names what is wrong; `ordinal`
-- names the element of enqueue_many's array (NULL: enqueue's arguments);
-- `hint` (from _job_problem) says how to fix it.
--
-- Guarantees: the one wording of a refused job: "jobs[N] <problem>" with a
--   HINT naming element N, or the bare problem for enqueue; the HINT starts
--   with `hint` when given and always says that nothing was enqueued (the
--   caller raises before it writes).
-- Concurrency: none.
-- Errors: always 22023.
-- Tests: test/sql/bad-input.test.ts, test/sql/enqueue-many.test.ts, test/sql/limits.test.ts
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
--     parse.
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
               coalesce(d.key_retention::interval, v_key_retention)
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
        END AS shape
      FROM ROWS FROM (jsonb_array_elements(jobs),
                      jsonb_to_recordset(jobs) AS (task text, payload jsonb, queue text, run_at text, priority text,
                        max_attempts text, idempotency_key text, duplicate_policy text, backoff jsonb,
                        expires_at text, after jsonb, key_retention text)) WITH ORDINALITY
           AS r(v, task, payload, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy,
                backoff, expires_at, after, key_retention, ord)
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

-- ---- sql/functions/_resolve_keys.sql ----
-- idemq._resolve_keys(jobs idemq._planned_job[]) RETURNS idemq._planned_job[]
--
-- Resolve keys, the second part of an enqueue: decides the outcome of every
-- element with an idempotency key against the key ledger, writing the key
-- rows this call wins.
--
-- Guarantees:
--   * Per key, its leader (_key_leaders) decides: a new key is inserted
--     (`created`, with the leader's planned id and key_retention); a key whose latest job is
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
--     repeated, the common bulk case, is one statement: for a batch of 64
--     elements or more a plain INSERT in a subtransaction (any key that
--     exists rolls it back, and the round with ON CONFLICT decides), else
--     INSERT ... ON CONFLICT DO NOTHING.
--   * job_id of a decided element: its own planned id when `created`, else
--     the key's job.
-- Concurrency: key rows are inserted in key order; N concurrent callers with
--   one new key create exactly one job: the key row's primary key serialises
--   them (ON CONFLICT waits for the inserter's transaction); if the inserter
--   rolls back, a waiter inserts (the plain INSERT of a batch waits alike,
--   then fails and leaves the key to ON CONFLICT). A batch's attempt holds
--   one subtransaction id until the caller's transaction ends. A takeover locks the key row, so a
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.enqueue;
-- ---- sql/functions/enqueue.sql ----
-- idemq.enqueue(task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
--   run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, max_attempts int DEFAULT 10,
--   idempotency_key text DEFAULT NULL,
--   duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
--   backoff jsonb DEFAULT NULL, expires_at timestamptz DEFAULT NULL, after bigint[] DEFAULT NULL,
--   key_retention interval DEFAULT '14 days')
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
--   * key_retention (with a key): how long the key ledger keeps the key after
--     its job finished; prune_keys() never releases it sooner, whatever its
--     own older_than (which can only make it longer). Stored on the key row,
--     so apps with different retentions share one database. A later job
--     that takes the key over sets its own.
--   * expires_at may already be past: the job is never claimed, and rescue()
--     marks it expired.
-- Concurrency: N concurrent calls with one key create exactly one job and all
--   get its id; if the first inserter rolls back, a waiter creates it (the key
--   row's primary key serialises them; see _resolve_keys).
-- Errors: 22004 a required argument is NULL; 22023 bad argument (empty task,
--   payload not an object, max_attempts < 1, malformed backoff, a queue name
--   over 1000 characters, run_at infinite...) or over a limit of
--   idemq.settings (task_bytes, payload_bytes, key_bytes, parents_per_job:
--   _enqueue_limits, read once per call);
--   IQ409 the policy rejects (DETAIL {"key","existing_job_id","existing_state","policy"});
--   IQ422 the key is held by an active job for a different task or payload
--   (DETAIL {"key","existing_job_id"}); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts, test/sql/continuations.test.ts,
--   test/sql/bad-input.test.ts, test/sql/limits.test.ts
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
  key_retention interval DEFAULT '14 days')
RETURNS TABLE(job_id bigint, deduplicated boolean)
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
  v_job.key_retention := enqueue.key_retention;
  -- The limits in a variable first (one query, _enqueue_limits inlined):
  -- passed as _job_problem(v_job, idemq._enqueue_limits()), a function call
  -- as an argument its body uses more than once, the planner would not
  -- inline _job_problem, and a SQL function called per enqueue costs about
  -- 20 us (5,000 calls: 55 against 35 us each, backend CPU).
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  v_problem := idemq._job_problem(v_job, v_limits);
  IF v_problem IS NULL AND v_job.backoff IS NOT NULL THEN
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

COMMENT ON FUNCTION idemq.enqueue(text, jsonb, text, timestamptz, int, int, text, idemq.duplicate_policy, jsonb, timestamptz, bigint[], interval) IS
  'Add a job, or return the active job holding its idempotency key; the duplicate policy decides after a terminal job.';

-- ---- sql/functions/prune_keys.sql ----
-- idemq.prune_keys(older_than interval DEFAULT '14 days') RETURNS int
--
-- Releases idempotency keys whose latest job finished longer ago than both
-- the key's own retention (enqueue's key_retention, stored on the key row)
-- and older_than, and guard rows (guard) and finished effect records
-- (effect_claim) older than older_than. Returns how many keys it released.
--
-- Guarantees:
--   * The only way a key is released: a key whose job is active is never
--     pruned, and purge() never releases keys. Keep key retentions longer
--     than any retry or replay horizon: a delivery after its key is pruned
--     runs again.
--   * A key is never released before its own retention has passed since its
--     job finished, whatever older_than says: for keys older_than can only
--     lengthen the retention (a floor an operator sets for every key), so
--     apps with different retentions can share one database and either's
--     prune_keys, with any argument, releases no key of the other early.
--     older_than 0 releases every key at its own retention.
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
--     IQ409. The key row keeps its retention (key_retention); one that
--     prune_keys released meanwhile comes back with the default retention
--     (_job_defaults: job rows do not store it). Waiting workers are
--     notified (_notify_waiting).
--   * An operator's override: a job cancelled because a parent (after) did
--     not succeed runs now, without waiting on that parent again.
-- Concurrency: row locks on the job and its key row.
-- Errors: IQ404; IQ412 the job is active or succeeded (DETAIL {"job_id","state"});
--   IQ409 its key is held by another active job (DETAIL {"key","existing_job_id",
--   "existing_state","policy"}, policy null).
-- Tests: test/sql/admin.test.ts, test/contract/state-machine.test.ts, test/sql/bad-input.test.ts,
--   test/sql/retention.test.ts
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
      expires_at = CASE WHEN j.state = 'expired' OR j.expires_at <= now() THEN NULL ELSE j.expires_at END
  WHERE j.id = v_job.id;
  PERFORM idemq._notify_waiting(v_job.queue);
  RETURN 'enqueued';
END;
$$;

COMMENT ON FUNCTION idemq.retry(bigint) IS
  'Run a failed, cancelled or expired job again with fresh attempts; IQ409 if its key is held by another active job.';

-- ---- sql/functions/schedule.sql ----
-- idemq.schedule(name text, cron text, task text, payload jsonb DEFAULT NULL, queue text DEFAULT NULL,
--   timezone text DEFAULT 'UTC', overlap idemq.schedule_overlap DEFAULT 'skip',
--   misfire idemq.schedule_misfire DEFAULT 'once', misfire_grace interval DEFAULT '1 minute',
--   priority int DEFAULT NULL, max_attempts int DEFAULT NULL)
--   RETURNS timestamptz
--
-- Creates or replaces the recurring schedule `name`: tick() enqueues a job of
-- `task` for each of its cron slots. Returns the schedule's next slot.
--
-- Guarantees:
--   * Upsert by name. A schedule whose cron and timezone are unchanged keeps
--     its next_at, so re-declaring it (a worker at every start) loses no due
--     slot; a changed cron or timezone starts from the first slot after now().
--     Counters and the last job are kept.
--   * payload, queue, priority and max_attempts left NULL take enqueue()'s
--     defaults (idemq._job_defaults()), stored with the schedule.
--   * cron: see _cron_parse (5 or 6 fields, names, steps, @macros, @every);
--     timezone: an IANA name; slots are local times there (see _cron_instant
--     for DST). overlap and misfire: see _tick.
--   * Every argument is checked before anything is written: an error leaves
--     the schedules table as it was. The job its slots enqueue is checked by
--     enqueue's own rules (_job_problem, the limits of idemq.settings: task,
--     payload, and the slot's idempotency key against key_bytes), so tick()
--     does not meet a job enqueue refuses (unless an admin lowers a limit
--     later).
-- Concurrency: the upsert locks the schedule row; it waits for a tick() that
--   holds it, and a tick after it sees the new definition.
-- Errors: 22004 a required argument is NULL; 22023 a bad cron (naming the
--   field, e.g. cron field 2 (hour) "25" is out of range 0-23), an unknown
--   time zone, an empty name or task, a name over 200 characters, a payload
--   that is not an object, a bad queue, max_attempts < 1, misfire_grace
--   outside 1 second..1 day, a job over a limit (task_bytes, payload_bytes,
--   key_bytes for the slot key); each with a HINT.
-- Tests: test/sql/schedules.test.ts, test/sql/schedules-tick.test.ts, test/sql/bad-input.test.ts
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
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('schedule: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
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
  RETURNING s.next_at INTO v_next;
  RETURN v_next;
END;
$$;

COMMENT ON FUNCTION idemq.schedule(text, text, text, jsonb, text, text, idemq.schedule_overlap, idemq.schedule_misfire, interval, int, int) IS
  'Create or replace a recurring schedule (cron, time zone, overlap and misfire policies); returns its next slot.';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._enqueue_limits FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._job_problem FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._key_leaders FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._raise_bad_job FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- sql/functions/_job_defaults.sql as of 0004_test_paths_in_headers
-- idemq._job_defaults() RETURNS jsonb
--
-- The defaults of a job's optional fields in an enqueue_many element.
--
-- Guarantees: the same values as the DEFAULTs in enqueue()'s signature
--   (test/contract/contract.test.ts compares them), so a job means the same thing
--   whichever function enqueued it.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq._job_defaults()
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{"payload": {}, "queue": "default", "priority": 0, "max_attempts": 10,
         "duplicate_policy": "allow_after_failed"}'::jsonb;

COMMENT ON FUNCTION idemq._job_defaults() IS
  'Defaults of optional job fields for enqueue_many; equal to enqueue()''s DEFAULTs.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._job_problem;
-- sql/functions/_job_problem.sql as of 0009_enqueue_pipeline
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._key_leaders;
-- sql/functions/_key_leaders.sql as of 0009_enqueue_pipeline
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._raise_bad_job;
-- sql/functions/_raise_bad_job.sql as of 0009_enqueue_pipeline
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

-- sql/functions/_parse_jobs.sql as of 0009_enqueue_pipeline
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

-- sql/functions/_resolve_keys.sql as of 0009_enqueue_pipeline
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.enqueue;
-- sql/functions/enqueue.sql as of 0009_enqueue_pipeline
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

-- sql/functions/prune_keys.sql as of 0007_limits
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

-- sql/functions/retry.sql as of 0005_least_privilege
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

-- sql/functions/schedule.sql as of 0010_schedules
-- idemq.schedule(name text, cron text, task text, payload jsonb DEFAULT NULL, queue text DEFAULT NULL,
--   timezone text DEFAULT 'UTC', overlap idemq.schedule_overlap DEFAULT 'skip',
--   misfire idemq.schedule_misfire DEFAULT 'once', misfire_grace interval DEFAULT '1 minute',
--   priority int DEFAULT NULL, max_attempts int DEFAULT NULL)
--   RETURNS timestamptz
--
-- Creates or replaces the recurring schedule `name`: tick() enqueues a job of
-- `task` for each of its cron slots. Returns the schedule's next slot.
--
-- Guarantees:
--   * Upsert by name. A schedule whose cron and timezone are unchanged keeps
--     its next_at, so re-declaring it (a worker at every start) loses no due
--     slot; a changed cron or timezone starts from the first slot after now().
--     Counters and the last job are kept.
--   * payload, queue, priority and max_attempts left NULL take enqueue()'s
--     defaults (idemq._job_defaults()), stored with the schedule.
--   * cron: see _cron_parse (5 or 6 fields, names, steps, @macros, @every);
--     timezone: an IANA name; slots are local times there (see _cron_instant
--     for DST). overlap and misfire: see _tick.
--   * Every argument is checked before anything is written: an error leaves
--     the schedules table as it was.
-- Concurrency: the upsert locks the schedule row; it waits for a tick() that
--   holds it, and a tick after it sees the new definition.
-- Errors: 22004 a required argument is NULL; 22023 a bad cron (naming the
--   field, e.g. cron field 2 (hour) "25" is out of range 0-23), an unknown
--   time zone, an empty name or task, a name over 200 characters, a payload
--   that is not an object, a bad queue, max_attempts < 1, misfire_grace
--   outside 1 second..1 day; each with a HINT.
-- Tests: test/sql/schedules.test.ts, test/sql/schedules-tick.test.ts, test/sql/bad-input.test.ts
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
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('schedule: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
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
  RETURNING s.next_at INTO v_next;
  RETURN v_next;
END;
$$;

COMMENT ON FUNCTION idemq.schedule(text, text, text, jsonb, text, text, idemq.schedule_overlap, idemq.schedule_misfire, interval, int, int) IS
  'Create or replace a recurring schedule (cron, time zone, overlap and misfire policies); returns its next slot.';

DROP FUNCTION idemq._enqueue_limits;
REVOKE EXECUTE ON FUNCTION idemq._job_problem FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._key_leaders FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._raise_bad_job FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Hand-written reversal of the schema changes above goes here, after the functions.
ALTER TABLE idemq.keys DROP COLUMN retention;
ALTER TYPE idemq._planned_job DROP ATTRIBUTE key_retention;
DROP TYPE idemq._enqueue_limits;
DELETE FROM idemq.settings WHERE name IN ('task_bytes', 'jobs_per_call', 'parents_per_job');
UPDATE idemq.settings SET description = 'longest guard key, effect key and effect owner, in bytes of UTF-8'
WHERE name = 'key_bytes';
UPDATE idemq.settings SET description = 'largest job payload, in bytes of its JSON text (enqueue does not check it yet)'
WHERE name = 'payload_bytes';
