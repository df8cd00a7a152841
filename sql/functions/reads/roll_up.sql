-- idemq.roll_up() RETURNS int
--
-- Completes the dashboard's history, idemq.job_minutes (read by history()):
-- run and wait time buckets from a bounded sample of the jobs finished in
-- the minutes since its last call (less two minutes), and the waiting jobs
-- sampled now; deletes the minutes older than a day. Returns the rows
-- written or deleted. The counts of those rows (started, succeeded, failed,
-- retried) are apply_retention()'s: its fold of idemq.job_counts adds them.
-- The workers call both on their maintenance timer (once a minute); without
-- workers, schedule both (pg_cron), or the history stops.
--
-- Guarantees:
--   * run_buckets (finished_at - locked_at) and wait_buckets (locked_at -
--     run_at: due to claimed, of the attempt that finished), counted per
--     _duration_buckets() bucket in the job's finish minute, from the first
--     100 succeeded and the first 100 failed jobs of each minute (in finish
--     order: range scans of jobs_by_finish, never more): exact up to 100 a
--     minute, a sample beyond. Recomputed, not added to: a second call
--     writes the same buckets. A job deleted before it ran (success
--     retention 0, purge) is not in them.
--   * waiting and oldest_waiting_seconds, on the current minute's rows, are
--     the enqueued plus scheduled jobs (_job_counts()) and the oldest
--     runnable job's age (_oldest_runnable()) when it ran: a sample, the
--     last of the minute; a minute without a call has none (NULL).
--   * Bounded: the table keeps the minutes of the last day (older rows are
--     deleted by each call); a call reads at most 200 jobs per minute since
--     the last call plus two minutes (the first call: of the last hour).
--   * At most one roll-up in 50 seconds, whoever calls: a call sooner after
--     the last returns 0 and reads nothing.
-- Concurrency: the one row of idemq.job_minutes_mark, locked FOR UPDATE
--   SKIP LOCKED, lets one caller at a time roll up; a concurrent caller
--   finds it locked and returns 0 at once (the other is writing the same
--   rows); only the first call of an installation, which inserts that row,
--   makes a concurrent first caller wait for its commit. Reads of the jobs
--   take no locks; writers of jobs never wait for it. A fold
--   (apply_retention) adding to a minute row it writes waits for it, briefly.
-- Errors: none.
-- Tests: test/sql/history.test.ts, test/dashboard/charts.test.ts
CREATE OR REPLACE FUNCTION idemq.roll_up()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planner trap: the estimates of the sample (generate_series guessed at
-- 1,000 minutes, 100 rows each) and of _oldest_runnable()'s recursion pass
-- jit_above_cost, and compiling took 370 of a 420 ms call that ran 2 ms
-- of queries (auto_explain, 20 groups, PostgreSQL 15); without JIT: a few ms.
SET jit = off
AS $$
#variable_conflict error
DECLARE
  v_now constant timestamptz := now();
  v_minute constant timestamptz := idemq._minute_of(now());
  v_overlap constant interval := '2 minutes';
  v_first constant interval := '1 hour';
  v_sample constant int := 100;
  -- Every worker calls it each minute; one roll-up a minute is enough.
  v_every constant interval := '50 seconds';
  v_mark timestamptz;
  v_from timestamptz;
  v_written int;
  v_sampled int;
  v_deleted int;
BEGIN
  -- Inserted by the first call; only then, as an insert that meets the row
  -- would wait for a caller's update of it (SKIP LOCKED below must not wait).
  IF NOT EXISTS (SELECT FROM idemq.job_minutes_mark) THEN
    INSERT INTO idemq.job_minutes_mark (rolled_at) VALUES ('-infinity') ON CONFLICT (one_row) DO NOTHING;
  END IF;
  SELECT m.rolled_at INTO v_mark FROM idemq.job_minutes_mark m FOR UPDATE SKIP LOCKED;
  IF NOT FOUND OR v_mark > v_now - v_every THEN
    RETURN 0;
  END IF;
  v_from := idemq._minute_of(greatest(v_mark - v_overlap, v_now - v_first));

  WITH sample AS MATERIALIZED (
    SELECT g.minute, s.queue, s.task,
           greatest(extract(epoch FROM s.finished_at - s.locked_at) * 1000, 0) AS run_ms,
           greatest(extract(epoch FROM s.locked_at - s.run_at) * 1000, 0) AS wait_ms
    FROM generate_series(v_from, v_now, interval '1 minute') g(minute)
    CROSS JOIN unnest('{succeeded,failed}'::idemq.job_state[]) st(state)
    CROSS JOIN LATERAL (
      -- A range of jobs_by_finish (state, finished_at), its first rows only.
      SELECT j.queue, j.task, j.locked_at, j.run_at, j.finished_at
      FROM idemq.jobs j
      WHERE j.state = st.state AND j.finished_at >= g.minute AND j.finished_at < g.minute + interval '1 minute'
      ORDER BY j.finished_at
      LIMIT v_sample
    ) s
    WHERE s.locked_at IS NOT NULL
  ), buckets AS (
    SELECT b.minute, b.queue, b.task, b.measure, jsonb_object_agg(b.bucket, b.n) AS counts
    FROM (SELECT x.minute, x.queue, x.task, v.measure, width_bucket(v.ms, idemq._duration_buckets()) AS bucket, count(*) AS n
          FROM sample x CROSS JOIN LATERAL (VALUES ('run', x.run_ms), ('wait', x.wait_ms)) v(measure, ms)
          GROUP BY 1, 2, 3, 4, 5) b
    GROUP BY b.minute, b.queue, b.task, b.measure
  ), fresh AS MATERIALIZED (
    SELECT k.minute, k.queue, k.task,
           coalesce((SELECT b.counts FROM buckets b
                     WHERE (b.minute, b.queue, b.task, b.measure) = (k.minute, k.queue, k.task, 'run')), '{}') AS run_buckets,
           coalesce((SELECT b.counts FROM buckets b
                     WHERE (b.minute, b.queue, b.task, b.measure) = (k.minute, k.queue, k.task, 'wait')), '{}') AS wait_buckets
    FROM (SELECT DISTINCT b.minute, b.queue, b.task FROM buckets b) k
  ), rows AS (
    SELECT f.minute, f.queue, f.task, f.run_buckets, f.wait_buckets FROM fresh f
    UNION ALL
    -- A minute in the window whose jobs are gone (purged) has none now.
    SELECT m.minute, m.queue, m.task, '{}'::jsonb, '{}'::jsonb
    FROM idemq.job_minutes m
    WHERE m.minute >= v_from AND (m.run_buckets <> '{}' OR m.wait_buckets <> '{}')
      AND NOT EXISTS (SELECT FROM fresh f WHERE (f.minute, f.queue, f.task) = (m.minute, m.queue, m.task))
  )
  INSERT INTO idemq.job_minutes AS m (minute, queue, task, run_buckets, wait_buckets)
  SELECT r.minute, r.queue, r.task, r.run_buckets, r.wait_buckets
  FROM rows r
  ORDER BY r.minute, r.queue, r.task
  ON CONFLICT (minute, queue, task) DO UPDATE
  SET run_buckets = excluded.run_buckets, wait_buckets = excluded.wait_buckets
  WHERE (m.run_buckets, m.wait_buckets) IS DISTINCT FROM (excluded.run_buckets, excluded.wait_buckets);
  GET DIAGNOSTICS v_written = ROW_COUNT;

  -- The sample: this minute's waiting jobs, per queue and task.
  UPDATE idemq.job_minutes m SET waiting = 0, oldest_waiting_seconds = 0
  WHERE m.minute = v_minute AND m.waiting IS DISTINCT FROM 0;
  WITH waiting AS (
    SELECT c.queue, c.task, sum(c.jobs) AS jobs
    FROM idemq._job_counts() c
    WHERE c.state IN ('enqueued', 'scheduled')
    GROUP BY c.queue, c.task
  )
  INSERT INTO idemq.job_minutes AS m (minute, queue, task, waiting, oldest_waiting_seconds)
  SELECT v_minute, w.queue, w.task, w.jobs, coalesce(o.oldest_seconds, 0)
  FROM waiting w
  LEFT JOIN idemq._oldest_runnable() o ON (o.queue, o.task) = (w.queue, w.task)
  ORDER BY w.queue, w.task
  ON CONFLICT (minute, queue, task) DO UPDATE
  SET waiting = excluded.waiting, oldest_waiting_seconds = excluded.oldest_waiting_seconds;
  GET DIAGNOSTICS v_sampled = ROW_COUNT;

  DELETE FROM idemq.job_minutes m WHERE m.minute < v_now - idemq._history_kept();
  GET DIAGNOSTICS v_deleted = ROW_COUNT;

  UPDATE idemq.job_minutes_mark SET rolled_at = v_now;
  RETURN v_written + v_sampled + v_deleted;
END;
$$;

COMMENT ON FUNCTION idemq.roll_up() IS
  'Dashboard history (idemq.job_minutes): run and wait time buckets from a bounded sample of recent finishes, waiting jobs sampled, minutes older than a day deleted.';
