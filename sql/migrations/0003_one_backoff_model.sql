-- Migration 0003_one_backoff_model (issue 10): one backoff model, decided in SQL: fail() returns the run_at it chose (a row: state, run_at), retry_horizon() sums the worst-case delays for doctor, _backoff_delay takes a draw; the repeated predicates become named helpers (_held, _initial_state, _unsuccessful_states, _queue_name_limit).
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._backoff_delay;
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
-- Tests: test/backoff.test.ts, test/worker-backoff.test.ts
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

-- ---- sql/functions/_held.sql ----
-- idemq._held(lease_expires_at timestamptz, locked_by text) RETURNS boolean
--
-- Is the job held by an attempt (processing, under a lease)? Fenced calls
-- test it with the job's id and attempt: idemq._held(j.lease_expires_at, j.locked_by).
--
-- Guarantees: the one definition of "held". Written as the lease columns,
--   which constraint jobs_lease_iff_processing ties to state = 'processing':
--   "state = 'processing'" lets the planner probe the jobs_leases partial
--   index (every job in flight) instead of the primary key, a cost that grows
--   with the jobs in flight (seen in EXPLAIN). A SQL function of one
--   expression, neither STRICT nor plpgsql, so the planner inlines it and
--   plans the column tests themselves: complete, complete_many, heartbeat,
--   fail and snooze still probe jobs_pkey (EXPLAIN through auto_explain,
--   before and after the helper).
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/fencing.test.ts, test/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._held(lease_expires_at timestamptz, locked_by text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN lease_expires_at IS NOT NULL AND locked_by IS NOT NULL;

COMMENT ON FUNCTION idemq._held(timestamptz, text) IS
  'Held by an attempt (processing, under a lease), from the lease columns: the fencing predicate, index-friendly once inlined.';

-- ---- sql/functions/_initial_state.sql ----
-- idemq._initial_state(run_at timestamptz) RETURNS idemq.job_state
--
-- The state of a job that becomes runnable at `run_at`: a new job, a child
-- whose parents all succeeded, a rescheduled job.
--
-- Guarantees: scheduled when run_at is after now() (the transaction's
--   clock), else enqueued: a job due exactly now, or with a NULL run_at
--   (the default: now), is enqueued.
-- Concurrency: none (stable: reads now()).
-- Errors: none.
-- Tests: test/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._initial_state(run_at timestamptz)
RETURNS idemq.job_state
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN run_at > now() THEN 'scheduled' ELSE 'enqueued' END::idemq.job_state;

COMMENT ON FUNCTION idemq._initial_state(timestamptz) IS
  'scheduled when run_at is after now(), else enqueued: the state of a job that becomes runnable at run_at.';

-- ---- sql/functions/_policy_rejects.sql ----
-- idemq._policy_rejects(policy idemq.duplicate_policy, finished_state idemq.job_state) RETURNS boolean
--
-- The duplicate-policy matrix: does `policy` refuse a new job for a key whose
-- latest job ended in `finished_state`?
--
-- Guarantees: the one definition of the matrix in docs/design.md, by the
--   state the key's latest job ended in:
--
--   | policy | succeeded | failed | expired / cancelled |
--   |---|---|---|---|
--   | `allow_after_failed` (default) | new job | new job | new job |
--   | `reject_if_failed` | new job | reject | new job |
--   | `reject_always` | reject | reject | reject |
--   | `reject_if_succeeded` | reject | new job | new job |
--
--   reject_if_succeeded retries after a failure, never after a success.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/enqueue-policies.test.ts
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

-- ---- sql/functions/_queue_name_limit.sql ----
-- idemq._queue_name_limit() RETURNS int
--
-- The longest queue name enqueue accepts, in characters.
--
-- Guarantees: 1000. The queue name is the NOTIFY payload (limit 8000 bytes,
--   and 1000 characters are at most 4000 bytes of UTF-8): a longer one would
--   make every later notify for the job fail (rescue included). A constant
--   function inlines, so callers compare with a literal.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/enqueue.test.ts, test/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._queue_name_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1000;

COMMENT ON FUNCTION idemq._queue_name_limit() IS
  'The longest queue name enqueue accepts (1000 characters): it travels as the NOTIFY payload.';

-- ---- sql/functions/_unsuccessful_states.sql ----
-- idemq._unsuccessful_states() RETURNS idemq.job_state[]
--
-- The terminal states other than succeeded: failed, cancelled, expired.
--
-- Guarantees: terminal_states() minus succeeded (checked by
--   test/predicates.test.ts). A job in one can be retried; a parent in one
--   cancels its children.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._unsuccessful_states()
RETURNS idemq.job_state[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY['failed', 'cancelled', 'expired']::idemq.job_state[];

COMMENT ON FUNCTION idemq._unsuccessful_states() IS
  'The terminal states other than succeeded (failed, cancelled, expired): retry() takes them, and a parent in one cancels its children.';

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
-- Tests: test/continuations.test.ts, test/enqueue-policies.test.ts
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
-- Tests: test/enqueue-many.test.ts (both paths agree)
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
-- Tests: test/enqueue.test.ts, test/enqueue-many.test.ts, test/enqueue-policies.test.ts,
--   test/enqueue-concurrency.test.ts, test/continuations.test.ts, test/bad-input.test.ts
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
--   "current_attempt","current_state"}); 22004 NULL job_id/attempt.
-- Tests: test/complete.test.ts, test/fencing.test.ts
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
-- Tests: test/complete.test.ts, test/claim.test.ts (no sequential scan)
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
-- Tests: test/enqueue.test.ts, test/enqueue-policies.test.ts,
--   test/enqueue-concurrency.test.ts, test/continuations.test.ts, test/bad-input.test.ts
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.fail;
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
-- Tests: test/fail.test.ts, test/backoff.test.ts
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
-- Tests: test/heartbeat.test.ts, test/fencing.test.ts, test/claim.test.ts (no sequential scan)
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
-- Tests: test/admin.test.ts, test/state-machine.test.ts, test/bad-input.test.ts
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
-- Tests: test/admin.test.ts, test/state-machine.test.ts, test/bad-input.test.ts
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
-- Tests: test/retry-horizon.test.ts, test/cli-doctor.test.ts
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
-- Tests: test/snooze.test.ts
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

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._held FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._initial_state FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._queue_name_limit FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._unsuccessful_states FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._backoff_delay FROM PUBLIC;

-- Down Migration

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._backoff_delay;
-- sql/functions/_backoff_delay.sql as of 0001_init
-- idemq._backoff_delay(backoff jsonb, failed_attempt int) RETURNS interval
--
-- How long a job waits before its next attempt, after attempt `failed_attempt`
-- (1 for the first failure) failed.
--
-- Guarantees (backoff already accepted by _backoff_problem()):
--   NULL or polynomial: (a-1)^4 + 15 + random(0..29)*a seconds (Hangfire/Sidekiq);
--   exponential: initial * factor^(a-1), capped at max, then scaled by a
--     uniform factor in [1 - jitter, 1 + jitter];
--   fixed: delays[a], the last delay repeating.
--   Whatever the kind, the delay is at most 10^9 seconds (about 31.7 years),
--   so no attempt number (up to max_attempts = 2^31-1) and no accepted
--   specification overflows a float8, an interval or now() + the delay.
-- Concurrency: none (volatile only because of random()).
-- Errors: none for a valid backoff.
-- Tests: test/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq._backoff_delay(backoff jsonb, failed_attempt int)
RETURNS interval
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
DECLARE
  v_kind text := coalesce(backoff->>'kind', 'polynomial');
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
    v_secs := power((failed_attempt - 1)::numeric, 4) + 15 + floor(random() * 30)::numeric * failed_attempt;
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
      v_secs := v_secs * (1 + (backoff->>'jitter')::numeric * (2 * random()::numeric - 1));
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

COMMENT ON FUNCTION idemq._backoff_delay(jsonb, int) IS
  'Delay before the next attempt after attempt failed_attempt failed, by the job''s backoff (NULL = polynomial).';

-- sql/functions/_on_job_finished.sql as of 0001_init
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
-- Tests: test/continuations.test.ts, test/enqueue-policies.test.ts
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
        SET state = CASE WHEN j.run_at > now() THEN 'scheduled' ELSE 'enqueued' END::idemq.job_state
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

-- sql/functions/_parse_jobs.sql as of 0001_init
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
-- Tests: test/enqueue-many.test.ts (both paths agree)
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
                                    AND r.queue <> '' AND length(r.queue) <= 1000))
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

-- sql/functions/_policy_rejects.sql as of 0002_package
-- idemq._policy_rejects(policy idemq.duplicate_policy, finished_state idemq.job_state) RETURNS boolean
--
-- The duplicate-policy matrix: does `policy` refuse a new job for a key whose
-- latest job ended in `finished_state`?
--
-- Guarantees: the one definition of the matrix in docs/design.md:
--   allow_after_failed  -> never rejects
--   reject_if_failed    -> rejects after failed
--   reject_always       -> rejects after any terminal state
--   reject_if_succeeded -> rejects after succeeded (retry after a failure, never after a success)
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/enqueue-policies.test.ts
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

-- sql/functions/_enqueue_rows.sql as of 0001_init
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
-- Tests: test/enqueue.test.ts, test/enqueue-many.test.ts, test/enqueue-policies.test.ts,
--   test/enqueue-concurrency.test.ts, test/continuations.test.ts, test/bad-input.test.ts
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
                 CASE WHEN s.run_at > v_now THEN 'scheduled' ELSE 'enqueued' END::idemq.job_state,
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
                 CASE WHEN d.run_at > v_now THEN 'scheduled' ELSE 'enqueued' END::idemq.job_state,
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
      -- The queue name is the NOTIFY payload (limit 8000 bytes): a longer one
      -- would make every later notify for the job fail (rescue included).
      WHEN length(e.val->>'queue') > 1000 THEN
        format('queue must be at most 1000 characters, not %s', length(e.val->>'queue'))
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
                     WHEN d.run_at > v_now THEN 'scheduled'
                     ELSE 'enqueued'
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
                      WHERE v_parents->>b::text IN ('failed', 'cancelled', 'expired'));

    UPDATE idemq.jobs AS j
    SET state = 'cancelled', finished_at = now(),
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
          'message', format('parent job %s ended %s before this job could run', f.parent_id, f.parent_state)))
    FROM (SELECT DISTINCT ON (p.job_id) p.job_id, a AS parent_id, v_parents->>a::text AS parent_state
          FROM unnest(v_rows, e_job, e_outcome, e_state) AS p(ordinal, task, payload, payload_md5, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy, backoff, expires_at, after,
                 job_id, outcome, state),
               unnest(p.after) a
          WHERE p.outcome = 'created' AND v_parents->>a::text IN ('failed', 'cancelled', 'expired')
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

-- sql/functions/complete.sql as of 0001_init
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
-- Tests: test/complete.test.ts, test/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict error
BEGIN
  UPDATE idemq.jobs AS j
  SET state = 'succeeded', result = complete.result, finished_at = now(),
      lease_expires_at = NULL
  -- Held = processing, written as the lease columns that constraint
  -- jobs_lease_iff_processing ties to it: "state = 'processing'" lets the planner
  -- probe the jobs_leases partial index (every job in flight) instead of the
  -- primary key, a cost that grows with the jobs in flight (seen in EXPLAIN).
  WHERE j.id = complete.job_id AND j.attempt = complete.attempt AND j.lease_expires_at IS NOT NULL AND j.locked_by IS NOT NULL;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(complete.job_id, complete.attempt, 'complete');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.complete(bigint, int, jsonb) IS
  'Mark a job succeeded if attempt still holds it; IQ410 (lease lost) otherwise, so the caller''s transaction rolls back.';

-- sql/functions/complete_many.sql as of 0001_init
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
-- Tests: test/complete.test.ts, test/claim.test.ts (no sequential scan)
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
  -- that wrote a WAL record per job for nothing. "Held" is written as the lease
  -- columns, not "state = 'processing'", which matches the jobs_leases partial
  -- index: the planner then scanned every job in flight once per pair.
  SELECT p.ids, p.attempts_by_id INTO v_ids, v_attempts FROM idemq._pairs_by_id(job_ids, attempts) p;

  RETURN QUERY
  UPDATE idemq.jobs AS j
  SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
  WHERE j.id = ANY (v_ids)
    AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
    AND j.lease_expires_at IS NOT NULL AND j.locked_by IS NOT NULL
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.complete_many(bigint[], int[]) IS
  'Mark many (job_id, attempt) pairs succeeded; returns the ids completed, skipping lost leases.';

-- sql/functions/enqueue.sql as of 0001_init
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
-- Tests: test/enqueue.test.ts, test/enqueue-policies.test.ts,
--   test/enqueue-concurrency.test.ts, test/continuations.test.ts, test/bad-input.test.ts
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
     AND enqueue.task <> '' AND enqueue.queue <> '' AND length(enqueue.queue) <= 1000
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
      v_state := CASE WHEN enqueue.run_at > now() THEN 'scheduled' ELSE 'enqueued' END;
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.fail;
-- sql/functions/fail.sql as of 0001_init
-- idemq.fail(job_id bigint, attempt int, error jsonb, retryable boolean DEFAULT true,
--   retry_at timestamptz DEFAULT NULL, backoff jsonb DEFAULT NULL,
--   max_attempts int DEFAULT NULL) RETURNS idemq.job_state
--
-- Records a failed attempt; schedules a retry or fails the job for good.
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
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id/attempt/error/retryable;
--   22023 error is not a JSON object or string, a malformed backoff,
--   max_attempts < 1.
-- Tests: test/fail.test.ts, test/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq.fail(
  job_id bigint,
  attempt int,
  error jsonb,
  retryable boolean DEFAULT true,
  retry_at timestamptz DEFAULT NULL,
  backoff jsonb DEFAULT NULL,
  max_attempts int DEFAULT NULL)
RETURNS idemq.job_state
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
  -- Held = processing, written as the lease columns that constraint
  -- jobs_lease_iff_processing ties to it: "state = 'processing'" lets the planner
  -- probe the jobs_leases partial index (every job in flight) instead of the
  -- primary key, a cost that grows with the jobs in flight (seen in EXPLAIN).
  WHERE j.id = fail.job_id AND j.attempt = fail.attempt AND j.lease_expires_at IS NOT NULL AND j.locked_by IS NOT NULL
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
  RETURN v_state;
END;
$$;

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int) IS
  'Record a failed attempt; scheduled for a retry by backoff (or retry_at), or failed when not retryable or out of attempts.';

-- sql/functions/heartbeat.sql as of 0001_init
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
-- Tests: test/heartbeat.test.ts, test/fencing.test.ts, test/claim.test.ts (no sequential scan)
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
    AND j.lease_expires_at IS NOT NULL AND j.locked_by IS NOT NULL
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.heartbeat(bigint[], int[], interval) IS
  'Extend the leases of (job_id, attempt) pairs still held; ids missing from the answer were lost.';

-- sql/functions/reschedule.sql as of 0001_init
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
-- Tests: test/admin.test.ts, test/state-machine.test.ts, test/bad-input.test.ts
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
                  WHEN reschedule.run_at > now() THEN 'scheduled'
                  ELSE 'enqueued' END;
  UPDATE idemq.jobs AS j SET run_at = reschedule.run_at, state = v_state WHERE j.id = v_job.id;
  IF v_state = 'enqueued' THEN
    PERFORM idemq._notify_waiting(v_job.queue);
  END IF;
  RETURN v_state;
END;
$$;

COMMENT ON FUNCTION idemq.reschedule(bigint, timestamptz) IS
  'Move a waiting job to another run_at; IQ412 if it is processing or finished.';

-- sql/functions/retry.sql as of 0001_init
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
-- Tests: test/admin.test.ts, test/state-machine.test.ts, test/bad-input.test.ts
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
  IF v_job.state NOT IN ('failed', 'cancelled', 'expired') THEN
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

-- sql/functions/snooze.sql as of 0001_init
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
-- Tests: test/snooze.test.ts
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
  -- Held = processing, written as the lease columns that constraint
  -- jobs_lease_iff_processing ties to it: "state = 'processing'" lets the planner
  -- probe the jobs_leases partial index (every job in flight) instead of the
  -- primary key, a cost that grows with the jobs in flight (seen in EXPLAIN).
  WHERE j.id = snooze.job_id AND j.attempt = snooze.attempt AND j.lease_expires_at IS NOT NULL AND j.locked_by IS NOT NULL
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

DROP FUNCTION idemq.retry_horizon;
DROP FUNCTION idemq._unsuccessful_states;
DROP FUNCTION idemq._queue_name_limit;
DROP FUNCTION idemq._initial_state;
DROP FUNCTION idemq._held;
REVOKE EXECUTE ON FUNCTION idemq._backoff_delay FROM PUBLIC;

-- Hand-written reversal of the schema changes above goes here, after the functions.
