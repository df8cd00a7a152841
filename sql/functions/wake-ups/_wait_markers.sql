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
  IF NOT idemq._names_valid(queues) THEN
    PERFORM idemq._raise_bad_names(operation, 'queues', queues, 'all queues',
      'Pass the queues you claim from, or NULL for every queue.');
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
