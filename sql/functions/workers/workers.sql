-- idemq.workers() RETURNS TABLE(worker_id text, queues text[], tasks text[],
--   started_at timestamptz, last_seen_at timestamptz, host text, pid int,
--   concurrency int, refresh_every interval, late boolean, outages int,
--   outage_ms bigint, last_outage_at timestamptz)
--
-- Lists the workers that said they are there (worker_seen), most recently
-- seen first.
--
-- Guarantees: every row of idemq.workers, stale ones included (a worker
--   that crashed stays until apply_retention() deletes it after
--   worker_retention_seconds); queues NULL means every queue, tasks NULL
--   any task. A worker refreshes its row on a timer (presenceInterval,
--   15 seconds by default), so a last_seen_at minutes old means it is gone
--   or cut off. host, pid, concurrency, refresh_every and the outages are
--   what the worker last said (worker_seen), NULL where it did not say.
--   late: last_seen_at is more than twice refresh_every ago (two refreshes
--   missed: a worker's timer is jittered by a quarter at most), by the
--   database's clock; NULL when refresh_every is not known.
-- Concurrency: a plain read.
-- Errors: none.
-- Tests: test/sql/workers.test.ts, test/dashboard/workers.test.ts
CREATE OR REPLACE FUNCTION idemq.workers()
RETURNS TABLE(worker_id text, queues text[], tasks text[], started_at timestamptz, last_seen_at timestamptz,
              host text, pid int, concurrency int, refresh_every interval, late boolean,
              outages int, outage_ms bigint, last_outage_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT w.worker_id, w.queues, w.tasks, w.started_at, w.last_seen_at,
         w.host, w.pid, w.concurrency, w.refresh_every, w.last_seen_at < now() - 2 * w.refresh_every,
         w.outages, w.outage_ms, w.last_outage_at
  FROM idemq.workers w
  ORDER BY w.last_seen_at DESC, w.worker_id;
END;
$$;

COMMENT ON FUNCTION idemq.workers() IS
  'The workers registered with worker_seen(): queues, tasks, started_at, last_seen_at, host, pid, concurrency, whether late, outages lived through (stale rows included).';
