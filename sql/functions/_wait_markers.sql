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
