-- Migration 0020_dedupe_checks: (issue 10): each argument rule written once: _pairs_by_id checks the (job_ids, attempts) pairs of complete_many and heartbeat (NULL, equal lengths, at most 10000), in the call that already sorts them; messages, SQLSTATEs and HINTs unchanged.
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
DROP FUNCTION idemq._pairs_by_id;
-- ---- sql/functions/_pairs_by_id.sql ----
-- idemq._pairs_by_id(job_ids bigint[], attempts int[], operation text, null_hint text,
--   OUT ids bigint[], OUT attempts_by_id int[])
--
-- Checks the (job_ids[i], attempts[i]) pairs of complete_many and heartbeat,
-- and returns them sorted by id for width_bucket():
-- attempts_by_id[width_bucket(id, ids)] is the attempt given for id, found by
-- binary search.
--
-- Guarantees: the one definition of a valid pair list (both arrays given, of
--   equal length, at most 10000 ids), checked in the call that sorts it, so
--   the callers pay no second function call. Each id once, with its highest
--   attempt (attempts only grow: only the latest can hold the job); NULL ids
--   dropped; empty arrays for no pairs. Messages name `operation`, the
--   function the user called; `null_hint` is the HINT of the NULL case.
-- Concurrency: none (reads only its arguments).
-- Errors: 22004 job_ids or attempts NULL; 22023 arrays of different lengths
--   or more than 10000 ids.
-- Tests: test/sql/complete.test.ts, test/sql/heartbeat.test.ts, test/sql/bad-input.test.ts
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
--   * Keys, continuations and retention 0 as complete(): with retention 0
--     the completed rows are deleted (jobs with children are updated and
--     left to apply_retention); retention is read once per call.
--   * An id given more than once counts once, with its highest attempt
--     (attempts only grow: only the latest can hold the job).
--   * Reads jobs by primary key only: the cost follows the batch, not the
--     rows the table keeps.
-- Concurrency: updates the rows in id order (no deadlock between two batches).
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths or more than 10,000 ids
--   (both checked by _pairs_by_id).
-- Tests: test/sql/complete.test.ts, test/sql/claim.test.ts (no sequential scan),
--   test/sql/retention-zero.test.ts
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
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths or more than 10,000
--   ids (both checked by _pairs_by_id); bad lease.
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

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._pairs_by_id FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._pairs_by_id;
-- sql/functions/_pairs_by_id.sql as of 0015_pairs_plpgsql
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
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
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

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[]) IS
  '(job_id, attempt) pairs sorted by id, each id once with its highest attempt, for width_bucket() lookups.';

-- sql/functions/complete_many.sql as of 0012_retention
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
--   * Keys, continuations and retention 0 as complete(): with retention 0
--     the completed rows are deleted (jobs with children are updated and
--     left to apply_retention); retention is read once per call.
--   * An id given more than once counts once, with its highest attempt
--     (attempts only grow: only the latest can hold the job).
--   * Reads jobs by primary key only: the cost follows the batch, not the
--     rows the table keeps.
-- Concurrency: updates the rows in id order (no deadlock between two batches).
-- Errors: 22004 NULL arrays; 22023 arrays of different lengths or more than 10,000 ids.
-- Tests: test/sql/complete.test.ts, test/sql/claim.test.ts (no sequential scan),
--   test/sql/retention-zero.test.ts
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

-- sql/functions/heartbeat.sql as of 0005_least_privilege
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

REVOKE EXECUTE ON FUNCTION idemq._pairs_by_id FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Hand-written reversal of the schema changes above goes here, after the functions.
