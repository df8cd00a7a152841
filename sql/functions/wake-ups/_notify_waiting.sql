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
