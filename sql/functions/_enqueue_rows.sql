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
