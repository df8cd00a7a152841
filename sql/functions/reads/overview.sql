-- idemq.overview(recent interval DEFAULT '15 minutes', exact_up_to bigint DEFAULT 10000) RETURNS TABLE(queue text, task text, metric text, value bigint, exact boolean)
--
-- The dashboard's overview in one call that costs the same with millions of
-- finished jobs retained: the counts are stats()'s (idemq.job_counts, never a
-- count of the jobs table).
--
-- Guarantees: one row per (queue, task, metric), only non-zero values:
--   * metric = an active state (scheduled, enqueued, processing, awaiting),
--     'lease_expired', 'oldest_runnable_seconds': exact, as stats() returns
--     them, per queue and task (_job_counts(), jobs_leases,
--     _oldest_runnable()).
--   * metric = '<terminal state>_recent' (succeeded_recent, failed_recent,
--     expired_recent, cancelled_recent): jobs that reached that state within
--     `recent` of now(), exact, per queue and task (jobs_by_finish: the jobs
--     finished in the window are read, none before it).
--   * metric = a terminal state, queue and task NULL: all jobs in that state,
--     summed from _job_counts(). Exact (exact true) when at most exact_up_to;
--     otherwise exact false and value an estimate, at least exact_up_to + 1:
--     the table's row estimate (pg_class.reltuples) times the state's
--     frequency in pg_stats, or exact_up_to + 1 itself when the table has not
--     been analysed. The exact count costs the same whatever the cap (the
--     dashboard passes the largest, 10,000,000).
--   * metric = 'deduplicated' | 'rejected' | 'conflict' | 'guard_duplicate'
--     (queue NULL): events per task since install, as stats() returns them.
--   Every row but the estimated totals has exact true.
-- Concurrency: plain reads (one snapshot per statement); no locks.
-- Errors: 22004 a NULL argument; 22023 recent not positive or over
--   duration_days, exact_up_to not from 0 to 10,000,000.
-- Tests: test/sql/overview.test.ts, test/dashboard/dashboard.test.ts
CREATE OR REPLACE FUNCTION idemq.overview(recent interval DEFAULT '15 minutes', exact_up_to bigint DEFAULT 10000)
RETURNS TABLE(queue text, task text, metric text, value bigint, exact boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_state idemq.job_state;
  v_count bigint;
  v_estimate numeric;
BEGIN
  IF recent IS NULL OR exact_up_to IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'overview: recent and exact_up_to must not be NULL',
      HINT = 'Leave an argument out to take its default.';
  END IF;
  IF recent <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: recent must be positive, not %s', recent),
      HINT = 'Give the window of recent finishes, e.g. recent => ''15 minutes''.';
  END IF;
  PERFORM idemq._check_duration('overview', 'recent', recent);
  IF exact_up_to NOT BETWEEN 0 AND 10000000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: exact_up_to must be from 0 to 10000000, not %s', exact_up_to),
      HINT = 'Totals over it are estimated; counting up to any cap costs the same (kept counts).';
  END IF;

  RETURN QUERY
  SELECT c.queue, c.task, c.state::text, c.jobs, true
  FROM idemq._job_counts() c
  WHERE c.state = ANY (idemq.active_states())
  UNION ALL
  -- "state = 'processing'" is jobs_leases' predicate: the expired leases alone are read.
  SELECT j.queue, j.task, 'lease_expired', count(*), true
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT r.queue, r.task, 'oldest_runnable_seconds', r.oldest_seconds, true
  FROM idemq._oldest_runnable() r
  UNION ALL
  -- The terminal states as constants and finished_at bounded: jobs_by_finish
  -- (state, finished_at) over finished rows, read for the window only.
  SELECT j.queue, j.task, j.state::text || '_recent', count(*), true
  FROM idemq.jobs j
  WHERE j.state IN ('succeeded', 'failed', 'expired', 'cancelled')
    AND j.finished_at IS NOT NULL AND j.finished_at >= now() - recent
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint, true
  FROM idemq.counters c
  GROUP BY c.task, c.event;

  -- Totals per terminal state: exact from the kept counts; over the cap,
  -- the estimate the contract promises (as before the counts were kept).
  FOR v_state, v_count IN
    SELECT t.state, coalesce(sum(c.jobs), 0)::bigint
    FROM unnest(idemq.terminal_states()) WITH ORDINALITY AS t(state, ord)
    LEFT JOIN idemq._job_counts() c ON c.state = t.state
    GROUP BY t.state, t.ord
    ORDER BY t.ord
  LOOP
    CONTINUE WHEN v_count = 0;
    queue := NULL;
    task := NULL;
    metric := v_state::text;
    IF v_count <= exact_up_to THEN
      value := v_count;
      exact := true;
    ELSE
      SELECT c.reltuples * s.most_common_freqs[array_position(s.most_common_vals::text::text[], v_state::text)]
      INTO v_estimate
      FROM pg_class c
      LEFT JOIN pg_stats s
        ON s.schemaname = 'idemq' AND s.tablename = 'jobs' AND s.attname = 'state'
      WHERE c.oid = 'idemq.jobs'::regclass AND c.reltuples > 0;
      value := greatest(exact_up_to + 1, coalesce(round(v_estimate), 0))::bigint;
      exact := false;
    END IF;
    RETURN NEXT;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.overview(interval, bigint) IS
  'Dashboard overview: exact active counts and recent finishes per queue and task, terminal totals exact up to a cap and estimated beyond it.';
