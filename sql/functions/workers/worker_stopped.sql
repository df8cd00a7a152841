-- idemq.worker_stopped(worker_id text) RETURNS boolean
--
-- Removes a worker's row from idemq.workers when it stops cleanly; returns
-- whether there was one.
--
-- Guarantees: deletes only the row of worker_id; a worker that crashed
--   never calls it, and its row goes stale instead (unserved_jobs() no
--   longer counts it once it is older than the caller's threshold;
--   apply_retention() deletes it after worker_retention_seconds).
-- Concurrency: a delete of one row; a concurrent worker_seen() of the same
--   id waits for it and then registers the worker again.
-- Errors: 22004 NULL worker_id.
-- Tests: test/sql/workers.test.ts, test/worker/presence.test.ts
CREATE OR REPLACE FUNCTION idemq.worker_stopped(worker_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF worker_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'worker_stopped: worker_id must not be NULL',
      HINT = 'Pass the worker id the worker registered with worker_seen().';
  END IF;
  DELETE FROM idemq.workers w WHERE w.worker_id = worker_stopped.worker_id;
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.worker_stopped(text) IS
  'Remove a cleanly stopped worker''s presence row (idemq.workers); true when it had one.';
