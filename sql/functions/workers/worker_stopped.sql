-- idemq.worker_stopped(worker_id text) RETURNS boolean
--
-- Marks a worker's row in idemq.workers stopped when it stops cleanly
-- (stopped_at = now(); last_seen_at stays its last refresh); returns
-- whether it had a live row.
--
-- Guarantees: writes only the row of worker_id, and only while it is live
--   (stopped_at NULL): a second call returns false and changes nothing. The
--   row stays, stopped, so workers() and the dashboard list the worker as
--   recently stopped; apply_retention() deletes it stopped_worker_seconds
--   after (default an hour). A stopped row counts as no live worker:
--   unserved_jobs() skips it and workers() never calls it late. A worker
--   that crashed never calls this, and its row goes stale instead
--   (unserved_jobs() no longer counts it once it is older than the caller's
--   threshold; apply_retention() deletes it after worker_retention_seconds).
--   A later worker_seen() of the same id starts the row again, live.
-- Concurrency: an update of one row; a concurrent worker_seen() of the same
--   id waits for it and then makes the row live again.
-- Errors: 22004 NULL worker_id.
-- Tests: test/sql/workers.test.ts, test/worker/presence.test.ts, test/dashboard/workers.test.ts
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
  UPDATE idemq.workers w SET stopped_at = now()
  WHERE w.worker_id = worker_stopped.worker_id AND w.stopped_at IS NULL;
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.worker_stopped(text) IS
  'Mark a cleanly stopped worker''s presence row (idemq.workers) stopped, kept for stopped_worker_seconds; true when it had a live one.';
