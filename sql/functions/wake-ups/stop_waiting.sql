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
