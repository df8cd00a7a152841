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
