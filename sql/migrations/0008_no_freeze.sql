-- Migration 0008_no_freeze (issue 11, item 4): no role can freeze a worker through the wake-up protocol's advisory keys (wait_for_jobs only tries them, never waits), and a session holds at most 17 markers whatever queue lists it passes.
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

-- ---- sql/functions/_wait_key.sql ----
-- idemq._wait_key(queue text) RETURNS bigint
--
-- The advisory-lock keys of the wake-up protocol (wait_for_jobs, _notify_waiting):
-- a queue's name keys the marker of sessions waiting for that queue, NULL the
-- marker of sessions waiting for every queue, and '' (no queue has that name:
-- CHECK jobs_queue_not_empty) the barrier that enqueues hold while they decide
-- not to notify.
--
-- Guarantees: the same key for the same argument in every session. Two names
--   hashing alike only cost a NOTIFY nobody needed or a barrier retry. The
--   keys are predictable and advisory locks have no privileges, so any session
--   may hold them: the protocol only ever tries them (wait_for_jobs,
--   _notify_waiting), and a foreign holder costs NOTIFYs or a later true,
--   never a blocked call or a lost wake-up.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_key(queue text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ('x' || left(md5(CASE WHEN queue IS NULL THEN 'idemq:all-queues' ELSE 'idemq:queue:' || queue END), 16))::bit(64)::bigint;

COMMENT ON FUNCTION idemq._wait_key(text) IS
  'Advisory-lock key of the wake-up protocol: a queue''s waiting marker, NULL for all queues, '''' for the barrier.';

-- ---- sql/functions/_wait_marker_limit.sql ----
-- idemq._wait_marker_limit() RETURNS int
--
-- The most queue markers a session holds (wait_for_jobs): past it, a session
-- waits for every queue instead.
--
-- Guarantees: 16. Markers are session advisory locks, and the lock table is
--   one for the whole server (max_locks_per_transaction x max_connections
--   slots, 6,400 by default): a session that took one lock per queue name of a
--   long list would fill it and break unrelated databases (53200). Waiting for
--   every queue instead costs only NOTIFYs for queues this session does not
--   claim from. A constant function inlines, so callers compare with a literal.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_marker_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 16;

COMMENT ON FUNCTION idemq._wait_marker_limit() IS
  'The most queue markers a session holds (16); past it, wait_for_jobs waits for every queue instead.';

-- ---- sql/functions/_notify_waiting.sql ----
-- idemq._notify_waiting(queue text) RETURNS void
--
-- Sends NOTIFY idemq_jobs (payload: the queue) for a job that became runnable
-- now, if a session may be waiting for it; otherwise sends nothing.
--
-- Why: PostgreSQL serialises the commits of transactions that NOTIFY (they
-- queue on one lock through their WAL flush): a NOTIFY in every enqueue halved
-- single-enqueue throughput on 10 connections. A worker with a backlog keeps
-- claiming without being told; only one that ran out of work needs the wake-up,
-- and it says so with wait_for_jobs().
--
-- Guarantees:
--   * Notifies when, at the call, a session holds the waiting marker of this
--     queue or of all queues, or is checking the barrier (wait_for_jobs).
--   * Otherwise holds the barrier (shared, until this transaction ends), so no
--     wait_for_jobs() returns true before this transaction has ended: its next
--     claim sees what this transaction committed. Nothing is lost, only the
--     NOTIFY nobody was waiting for.
-- Concurrency: advisory locks only, never waits: callers do not block each other
--   (the marker is tried exclusively and released at once; a collision of two
--   callers makes one of them notify, which is always safe). A key held by a
--   session outside idemq (advisory locks have no privileges) likewise only
--   makes it notify.
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._wait_markers;
-- ---- sql/functions/_wait_markers.sql ----
-- idemq._wait_markers(queues text[], operation text, taking boolean)
--   RETURNS TABLE(marker bigint, held boolean)
--
-- The waiting markers of `queues` (NULL: the all-queues marker), each once,
-- and whether this session holds it: what wait_for_jobs takes (`taking`) and
-- stop_waiting releases.
--
-- Guarantees:
--   * Validates `queues` first; `operation` names the caller in errors.
--   * Bounded: more than _wait_marker_limit() distinct queues stand for the
--     all-queues marker instead, and so, when `taking`, do queues whose new
--     markers would take this session past that many markers held. A session
--     therefore holds at most _wait_marker_limit() + 1 markers whatever lists
--     it passes. Waiting for every queue is always safe: it only costs NOTIFYs
--     for queues the session does not claim from.
-- Concurrency: reads this session's own locks in pg_locks, once.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
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
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: queues must be NULL (all queues) or a non-empty list of queue names, not %s', operation, queues),
      HINT = 'Pass the queues you claim from, or NULL for every queue.';
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

-- ---- sql/functions/stop_waiting.sql ----
-- idemq.stop_waiting(queues text[] DEFAULT NULL) RETURNS void
--
-- Ends wait_for_jobs(queues) for this session: jobs becoming runnable in those
-- queues no longer NOTIFY on its account. A worker calls it when a claim came
-- back full (a backlog: it will claim again without being told).
--
-- Guarantees: releases this session's markers for exactly these queues (NULL,
--   or more than _wait_marker_limit() queues: the all-queues marker, as
--   wait_for_jobs took; wait_for_jobs holds each once); markers it does not
--   hold are ignored.
-- Concurrency: advisory locks only; releasing never waits.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
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

-- ---- sql/functions/wait_for_jobs.sql ----
-- idemq.wait_for_jobs(queues text[] DEFAULT NULL) RETURNS boolean
--
-- Declares this session a listener waiting for jobs of `queues` (NULL: every
-- queue): from now on a job becoming runnable in them sends NOTIFY idemq_jobs.
-- Call it (in the session that LISTENs, or any session that lives as long)
-- when a claim came back with fewer jobs than asked for, then claim once more
-- after it returned true, then wait for a notification. Enqueues skip the
-- NOTIFY while nobody waits: that is what keeps their commits from queueing.
--
-- Guarantees:
--   * Returns true when this session holds the marker of every queue asked for
--     and every transaction that made a job runnable without notifying (nobody
--     was waiting then) has ended: a claim started after it sees all of their
--     jobs. From then on every such job notifies, so a waiting listener misses
--     none.
--   * Returns false, at once, while such a transaction is still open, or a
--     marker could not be taken or the barrier checked (another session holds
--     that key at that instant: an enqueue deciding, or any session at all,
--     since advisory locks have no privileges): call again shortly. The
--     markers it could take stay held. A key held by someone else makes
--     enqueues notify anyway (they only try the keys too), so it can delay the
--     true, never a wake-up.
--   * Never waits for a lock: no session can make it block.
--   * Idempotent: calling again with the same queues holds one marker per queue.
--     The marker lasts until stop_waiting() or the end of the session
--     (including a lost connection), not of the transaction.
--   * Bounded: a session holds at most _wait_marker_limit() + 1 markers (16
--     queues, then the all-queues marker instead), whatever lists it passes.
-- Concurrency: advisory locks, only tried: markers are shared (any number of
--   waiting sessions), the barrier is tried exclusively and released at once.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/worker/wake-up.test.ts, test/worker/no-freeze.test.ts, test/sql/bad-input.test.ts
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

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._wait_marker_limit FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._wait_markers FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- sql/functions/_wait_key.sql as of 0004_test_paths_in_headers
-- idemq._wait_key(queue text) RETURNS bigint
--
-- The advisory-lock keys of the wake-up protocol (wait_for_jobs, _notify_waiting):
-- a queue's name keys the marker of sessions waiting for that queue, NULL the
-- marker of sessions waiting for every queue, and '' (no queue has that name:
-- CHECK jobs_queue_not_empty) the barrier that enqueues hold while they decide
-- not to notify.
--
-- Guarantees: the same key for the same argument in every session. Two names
--   hashing alike only cost a NOTIFY nobody needed or a barrier retry.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_key(queue text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ('x' || left(md5(CASE WHEN queue IS NULL THEN 'idemq:all-queues' ELSE 'idemq:queue:' || queue END), 16))::bit(64)::bigint;

COMMENT ON FUNCTION idemq._wait_key(text) IS
  'Advisory-lock key of the wake-up protocol: a queue''s waiting marker, NULL for all queues, '''' for the barrier.';

-- sql/functions/_notify_waiting.sql as of 0005_least_privilege
-- idemq._notify_waiting(queue text) RETURNS void
--
-- Sends NOTIFY idemq_jobs (payload: the queue) for a job that became runnable
-- now, if a session may be waiting for it; otherwise sends nothing.
--
-- Why: PostgreSQL serialises the commits of transactions that NOTIFY (they
-- queue on one lock through their WAL flush): a NOTIFY in every enqueue halved
-- single-enqueue throughput on 10 connections. A worker with a backlog keeps
-- claiming without being told; only one that ran out of work needs the wake-up,
-- and it says so with wait_for_jobs().
--
-- Guarantees:
--   * Notifies when, at the call, a session holds the waiting marker of this
--     queue or of all queues, or is checking the barrier (wait_for_jobs).
--   * Otherwise holds the barrier (shared, until this transaction ends), so no
--     wait_for_jobs() returns true before this transaction has ended: its next
--     claim sees what this transaction committed. Nothing is lost, only the
--     NOTIFY nobody was waiting for.
-- Concurrency: advisory locks only, never waits: callers do not block each other
--   (the marker is tried exclusively and released at once; a collision of two
--   callers makes one of them notify, which is always safe).
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
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

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._wait_markers;
-- sql/functions/_wait_markers.sql as of 0005_least_privilege
-- idemq._wait_markers(queues text[], operation text)
--   RETURNS TABLE(marker bigint, held boolean)
--
-- The waiting markers of `queues` (NULL: the all-queues marker), each once,
-- and whether this session holds it: what wait_for_jobs takes and
-- stop_waiting releases.
--
-- Guarantees: validates `queues` first; `operation` names the caller in errors.
-- Concurrency: reads this session's own locks in pg_locks.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_markers(queues text[], operation text)
RETURNS TABLE(marker bigint, held boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF queues IS NOT NULL AND (cardinality(queues) = 0 OR EXISTS (
       SELECT 1 FROM unnest(queues) q WHERE q IS NULL OR q = '')) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: queues must be NULL (all queues) or a non-empty list of queue names, not %s', operation, queues),
      HINT = 'Pass the queues you claim from, or NULL for every queue.';
  END IF;
  RETURN QUERY
  SELECT k.key, EXISTS (
           SELECT 1 FROM pg_locks l
           WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock'
             AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = k.key)
  FROM (SELECT DISTINCT idemq._wait_key(q) AS key FROM unnest(coalesce(queues, ARRAY[NULL::text])) q) k;
END;
$$;

COMMENT ON FUNCTION idemq._wait_markers(text[], text) IS
  'The waiting markers of these queues (wait_for_jobs), and whether this session holds each.';

-- sql/functions/stop_waiting.sql as of 0005_least_privilege
-- idemq.stop_waiting(queues text[] DEFAULT NULL) RETURNS void
--
-- Ends wait_for_jobs(queues) for this session: jobs becoming runnable in those
-- queues no longer NOTIFY on its account. A worker calls it when a claim came
-- back full (a backlog: it will claim again without being told).
--
-- Guarantees: releases this session's markers for exactly these queues (NULL:
--   the all-queues marker; wait_for_jobs holds each once); markers it does not
--   hold are ignored.
-- Concurrency: advisory locks only.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/sql/bad-input.test.ts
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
  FOR v_marker IN SELECT m.marker FROM idemq._wait_markers(queues, 'stop_waiting') m WHERE m.held LOOP
    PERFORM pg_advisory_unlock_shared(v_marker);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.stop_waiting(text[]) IS
  'Stop waiting for jobs of these queues (see wait_for_jobs): enqueues into them no longer notify on this session''s account.';

-- sql/functions/wait_for_jobs.sql as of 0005_least_privilege
-- idemq.wait_for_jobs(queues text[] DEFAULT NULL) RETURNS boolean
--
-- Declares this session a listener waiting for jobs of `queues` (NULL: every
-- queue): from now on a job becoming runnable in them sends NOTIFY idemq_jobs.
-- Call it (in the session that LISTENs, or any session that lives as long)
-- when a claim came back with fewer jobs than asked for, then claim once more
-- after it returned true, then wait for a notification. Enqueues skip the
-- NOTIFY while nobody waits: that is what keeps their commits from queueing.
--
-- Guarantees:
--   * Returns true when every transaction that made a job runnable without
--     notifying (nobody was waiting then) has ended: a claim started after it
--     sees all of their jobs. From then on every such job notifies, so a
--     waiting listener misses none.
--   * Returns false while such a transaction is still open (or another session
--     is checking at that instant): call again shortly. The marker is held
--     either way, so notifications already flow.
--   * Idempotent: calling again with the same queues holds one marker per queue.
--     The marker lasts until stop_waiting() or the end of the session
--     (including a lost connection), not of the transaction.
-- Concurrency: advisory locks: markers are shared (any number of waiting
--   sessions), the barrier is only tried, never waited on.
-- Errors: 22023 queues empty or holding NULL or ''.
-- Tests: test/sql/wake-up.test.ts, test/worker/wake-up.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.wait_for_jobs(queues text[] DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_marker bigint;
BEGIN
  FOR v_marker IN SELECT m.marker FROM idemq._wait_markers(queues, 'wait_for_jobs') m WHERE NOT m.held LOOP
    PERFORM pg_advisory_lock_shared(v_marker);
  END LOOP;
  IF pg_try_advisory_lock(idemq._wait_key('')) THEN
    PERFORM pg_advisory_unlock(idemq._wait_key(''));
    RETURN true;
  END IF;
  RETURN false;
END;
$$;

COMMENT ON FUNCTION idemq.wait_for_jobs(text[]) IS
  'Wait for jobs of these queues: enqueues NOTIFY while this session waits; true once a claim would see every job that did not notify.';

DROP FUNCTION idemq._wait_marker_limit;
REVOKE EXECUTE ON FUNCTION idemq._wait_markers FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Hand-written reversal of the schema changes above goes here, after the functions.
