-- Migration 0018_traces: (issue 14 item 3) OpenTelemetry traces: a job stores its producer's W3C traceparent (enqueue(traceparent), enqueue_many's field), claim hands it to the worker, and enqueue returns a duplicate's existing context, so the attempt span continues the enqueue's trace.
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

-- The trace context of the enqueue that created the job (W3C traceparent,
-- version 00; NULL without tracing). Its CHECK comes after the functions:
-- it calls idemq._is_traceparent, created below.
ALTER TABLE idemq.jobs ADD COLUMN traceparent text;
ALTER TYPE idemq._planned_job ADD ATTRIBUTE traceparent text;
ALTER TYPE idemq.claimed_job ADD ATTRIBUTE traceparent text;

-- Unchanged text, created again: a SQL-standard body stores the attribute
-- list of the idemq._planned_job rows it unnests as of its CREATE, so without
-- this the installed function would not match sql/functions/ (the drift test).
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
-- idemq._is_traceparent(value text) RETURNS boolean
--
-- Whether `value` is a W3C Trace Context traceparent of version 00, the
-- shape idemq stores in idemq.jobs.traceparent: the one definition that the
-- table's CHECK (jobs_traceparent_w3c) and enqueue's value rules
-- (_job_problem) share.
--
-- Guarantees:
--   * true for `00-<trace-id>-<parent-id>-<flags>`: 32, 16 and 2 lower-case
--     hex digits (55 characters in all), trace-id and parent-id not all zeros
--     (W3C Trace Context, "traceparent Header": such ids are invalid).
--   * Other versions are refused: version 00 is the only one defined, and the
--     one every OpenTelemetry SDK writes; a stored value must parse in any
--     worker.
--   * NULL for NULL (a job without a trace context), so the CHECK accepts it
--     and _job_problem finds no problem.
--   * A SQL-standard body of one expression, IMMUTABLE: the planner inlines
--     it into _job_problem and so into _parse_jobs' statement.
-- Concurrency: none (reads only its argument).
-- Errors: none.
-- Tests: test/sql/traceparent.test.ts
CREATE OR REPLACE FUNCTION idemq._is_traceparent(value text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN value ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
   AND substr(value, 4, 32) <> '00000000000000000000000000000000'
   AND substr(value, 37, 16) <> '0000000000000000';

COMMENT ON FUNCTION idemq._is_traceparent(text) IS
  'Whether a value is a W3C traceparent of version 00 (the shape of idemq.jobs.traceparent); NULL for NULL.';

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
--     the key's job; traceparent likewise: its own when `created`, else the
--     trace context stored on the active job holding the key (NULL when it
--     has none, or for a rejection), so a duplicate's enqueue span can link
--     to the trace that created the job.
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
--     id; key_retention not negative and at most limits.duration_days days;
--     traceparent a W3C traceparent of version 00 (_is_traceparent). The
--     backoff is _backoff_problem's (a batch checks each distinct backoff
--     once instead of once per job, so it is not repeated here);
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
--   test/sql/limits.test.ts, test/sql/traceparent.test.ts
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
  WHEN NOT idemq._is_traceparent(job.traceparent) THEN
    ARRAY[format('traceparent must be a W3C traceparent (00-<32 hex digits>-<16 hex digits>-<2 hex digits>, '
                 'lower case, ids not all zeros), not %s', idemq._excerpt(job.traceparent)),
          'Pass the traceparent of the producer''s span as OpenTelemetry formats it, '
          'e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01, or leave traceparent out.']
END;

COMMENT ON FUNCTION idemq._job_problem(idemq._planned_job, idemq._enqueue_limits) IS
  'What is wrong with one job to enqueue, and the fix (NULL: nothing): the value rules of enqueue and enqueue_many, once.';

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
--   * traceparent: the trace context enqueue stored (NULL without one), so
--     the worker's attempt span continues the producer's trace.
--   * Never takes a job in processing: a lease that ran out is taken away
--     only by rescue().
-- Concurrency: FOR UPDATE SKIP LOCKED over the jobs_runnable partial index:
--   concurrent claimers never block each other and never get the same job.
--   Jobs locked by another transaction (being claimed, cancelled...) are
--   skipped, not waited for.
-- Errors: 22004 worker_id/batch_size NULL; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes (idemq._limit), batch_size outside 1..1000, empty
--   queue or task name, bad lease.
-- Tests: test/sql/claim.test.ts, test/sql/claim-concurrency.test.ts, test/sql/fencing.test.ts,
--   test/sql/traceparent.test.ts
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.enqueue;
-- ---- sql/functions/enqueue.sql ----
-- idemq.enqueue(task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
--   run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, max_attempts int DEFAULT 10,
--   idempotency_key text DEFAULT NULL,
--   duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
--   backoff jsonb DEFAULT NULL, expires_at timestamptz DEFAULT NULL, after bigint[] DEFAULT NULL,
--   key_retention interval DEFAULT '14 days', traceparent text DEFAULT NULL)
--   RETURNS TABLE(job_id bigint, deduplicated boolean, job_traceparent text)
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
--   * traceparent: the W3C trace context of the producer's span (version 00,
--     _is_traceparent), stored on a new job and handed to its worker by
--     claim(), which continues the trace. A duplicate stores nothing: the job
--     keeps the context of the enqueue that created it.
--   * job_traceparent: the trace context stored on the job returned: the
--     caller's own for a new job; for a duplicate (deduplicated = true) the
--     existing job's (NULL when it has none), so the duplicate's enqueue span
--     can link to the trace that created the job.
-- Concurrency: N concurrent calls with one key create exactly one job and all
--   get its id; if the first inserter rolls back, a waiter creates it (the key
--   row's primary key serialises them; see _resolve_keys).
-- Errors: 22004 a required argument is NULL; 22023 bad argument (empty task,
--   payload not an object, max_attempts < 1, malformed backoff, a queue name
--   over 1000 characters, run_at infinite, traceparent not a W3C
--   traceparent...) or over a limit of
--   idemq.settings (task_bytes, payload_bytes, key_bytes, parents_per_job:
--   _enqueue_limits, read once per call);
--   IQ409 the policy rejects (DETAIL {"key","existing_job_id","existing_state","policy"});
--   IQ422 the key is held by an active job for a different task or payload
--   (DETAIL {"key","existing_job_id"}); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts, test/sql/continuations.test.ts,
--   test/sql/bad-input.test.ts, test/sql/limits.test.ts, test/sql/traceparent.test.ts
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
  v_job.traceparent := enqueue.traceparent;
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

-- The stored shape, the one enqueue's value rules check (_is_traceparent).
-- NOT VALID: the column was added above, so every existing row holds NULL,
-- which passes; validating would only scan idemq.jobs while ADD COLUMN's
-- exclusive lock blocks every enqueue and claim. New and updated rows are checked.
ALTER TABLE idemq.jobs ADD CONSTRAINT jobs_traceparent_w3c CHECK (idemq._is_traceparent(traceparent)) NOT VALID;

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._is_traceparent FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- Before _is_traceparent is dropped below.
ALTER TABLE idemq.jobs DROP CONSTRAINT jobs_traceparent_w3c;

-- sql/functions/_insert_jobs.sql as of 0009_enqueue_pipeline
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

-- sql/functions/_job_problem.sql as of 0011_enqueue_limits
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

-- sql/functions/_resolve_keys.sql as of 0011_enqueue_limits
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

-- sql/functions/_parse_jobs.sql as of 0011_enqueue_limits
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

-- sql/functions/claim.sql as of 0007_limits
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.enqueue;
-- sql/functions/enqueue.sql as of 0011_enqueue_limits
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

-- sql/functions/enqueue_many.sql as of 0009_enqueue_pipeline
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

DROP FUNCTION idemq._is_traceparent;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Hand-written reversal of the schema changes above goes here, after the functions.
ALTER TYPE idemq.claimed_job DROP ATTRIBUTE traceparent;
-- _key_leaders' stored body names the attribute: dropped around it, then as before.
DROP FUNCTION idemq._key_leaders;
ALTER TYPE idemq._planned_job DROP ATTRIBUTE traceparent;
-- sql/functions/_key_leaders.sql as of 0011_enqueue_limits
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
REVOKE EXECUTE ON FUNCTION idemq._key_leaders FROM PUBLIC;
ALTER TABLE idemq.jobs DROP COLUMN traceparent;
