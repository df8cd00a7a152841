-- idemq.workers() RETURNS TABLE(worker_id text, queues text[], tasks text[],
--   started_at timestamptz, last_seen_at timestamptz, host text, pid int,
--   concurrency int, refresh_every interval, late boolean, outages int,
--   outage_ms bigint, last_outage_at timestamptz, stopped_at timestamptz)
--
-- Lists the workers that said they are there (worker_seen), live ones
-- first, each group most recently seen first.
--
-- Guarantees: every row of idemq.workers, stale ones included (a worker
--   that crashed stays until apply_retention() deletes it after
--   worker_retention_seconds), and the recently stopped: stopped_at is when
--   a worker said it stopped cleanly (worker_stopped; its row is kept
--   stopped_worker_seconds, an hour by default), NULL for a live or stale
--   one. queues NULL means every queue, tasks NULL
--   any task. A worker refreshes its row on a timer (presenceInterval,
--   15 seconds by default), so a last_seen_at minutes old means it is gone
--   or cut off. host, pid, concurrency, refresh_every and the outages are
--   what the worker last said (worker_seen), NULL where it did not say.
--   late: last_seen_at is more than twice refresh_every ago (two refreshes
--   missed: a worker's timer is jittered by a quarter at most), by the
--   database's clock; NULL when refresh_every is not known; false for a
--   stopped worker (it said it went).
-- Concurrency: a plain read.
-- Errors: none.
-- Tests: test/sql/workers.test.ts, test/dashboard/workers.test.ts
CREATE OR REPLACE FUNCTION idemq.workers()
RETURNS TABLE(worker_id text, queues text[], tasks text[], started_at timestamptz, last_seen_at timestamptz,
              host text, pid int, concurrency int, refresh_every interval, late boolean,
              outages int, outage_ms bigint, last_outage_at timestamptz, stopped_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT w.worker_id, w.queues, w.tasks, w.started_at, w.last_seen_at,
         w.host, w.pid, w.concurrency, w.refresh_every,
         CASE WHEN w.stopped_at IS NULL THEN w.last_seen_at < now() - 2 * w.refresh_every ELSE false END,
         w.outages, w.outage_ms, w.last_outage_at, w.stopped_at
  FROM idemq.workers w
  ORDER BY w.stopped_at IS NOT NULL, w.last_seen_at DESC, w.worker_id;
END;
$$;

COMMENT ON FUNCTION idemq.workers() IS
  'The workers registered with worker_seen(): queues, tasks, started_at, last_seen_at, host, pid, concurrency, whether late, outages lived through, when stopped (stale and recently stopped rows included).';
