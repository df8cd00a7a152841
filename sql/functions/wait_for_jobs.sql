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
