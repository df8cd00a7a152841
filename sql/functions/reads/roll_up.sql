-- idemq.roll_up() RETURNS int
--
-- Writes the dashboard's history, idemq.job_minutes (read by history()):
-- per minute, queue and task, recomputed from the jobs for the minutes since
-- its last call (less two minutes), plus the waiting jobs sampled now; and
-- deletes the minutes older than a day. Returns the rows written or deleted.
-- The workers call it on their maintenance timer (once a minute); without
-- workers, schedule it (pg_cron), or the history stops.
--
-- Guarantees:
--   * A minute's counts are recomputed, never added to: calling it twice,
--     or after a crash, writes the same rows. They are, for the jobs in the
--     queue and task, from the finished jobs (jobs_by_finish: a range of
--     each terminal state from the window's start, none before it) and the
--     processing ones (jobs_leases):
--     started   attempts claimed in the minute (a job's locked_at, and the
--               started_at of its earlier attempts' error entries);
--     retried   attempts that failed in the minute and were claimed again
--               (error entries of an attempt before the job's current one);
--     succeeded, failed   jobs finished in the minute in that state;
--     run_buckets   finished_at - locked_at of those jobs, counted per
--               _duration_buckets() bucket, in their finish minute;
--     wait_buckets  locked_at - run_at of each job's current attempt (due
--               to claimed), in the minute it was claimed.
--     A failed attempt whose job still waits for its retry is counted
--     (started, retried) once the job is claimed again or finishes, if that
--     minute is still in the window: within about two minutes of the
--     failure (a longer backoff leaves it out). A job deleted before the
--     roll-up saw it (success retention 0, purge) is not counted.
--   * waiting and oldest_waiting_seconds, on the current minute's rows, are
--     the enqueued plus scheduled jobs (_job_counts()) and the oldest
--     runnable job's age (_oldest_runnable()) when it ran: a sample, the
--     last of the minute; a minute without a call has none (NULL).
--   * Bounded: the table keeps the minutes of the last day (older rows are
--     deleted by each call); each call reads the jobs finished since the
--     last call plus two minutes, and the processing ones. The first call
--     (no mark) reads a day.
--   * The two minutes' overlap takes in a finish committed up to two
--     minutes after its finished_at (a transaction's now()).
--   * At most one roll-up in 50 seconds, whoever calls: a call sooner after
--     the last returns 0 and reads nothing, so each finished job is read
--     about three times whatever the number of workers.
-- Concurrency: the one row of idemq.job_minutes_mark, locked FOR UPDATE
--   SKIP LOCKED, lets one caller at a time roll up; a concurrent caller
--   finds it locked and returns 0 at once (the other is writing the same
--   rows); only the first call of an installation, which inserts that row,
--   makes a concurrent first caller wait for its commit. Reads of the jobs take no locks; writers of jobs never wait for it.
-- Errors: none.
-- Tests: test/sql/history.test.ts, test/dashboard/charts.test.ts
CREATE OR REPLACE FUNCTION idemq.roll_up()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_now constant timestamptz := now();
  v_origin constant timestamptz := '2000-01-01 00:00:00+00';
  v_minute constant timestamptz := date_bin('1 minute', now(), '2000-01-01 00:00:00+00');
  v_keep constant interval := '1 day';
  v_overlap constant interval := '2 minutes';
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
  v_from := date_bin('1 minute', greatest(v_mark - v_overlap, v_now - v_keep), v_origin);

  WITH seen AS MATERIALIZED (
    -- A range of jobs_by_finish per terminal state, then the processing jobs.
    SELECT j.queue, j.task, j.state, j.attempt, j.locked_at, j.run_at, j.finished_at, j.errors
    FROM idemq.jobs j
    WHERE j.state = ANY (idemq.terminal_states()) AND j.finished_at >= v_from
    UNION ALL
    SELECT j.queue, j.task, j.state, j.attempt, j.locked_at, j.run_at, j.finished_at, j.errors
    FROM idemq.jobs j
    WHERE j.state = 'processing'
  ), events AS (
    SELECT s.queue, s.task, s.locked_at AS at, 'started' AS kind,
           greatest(extract(epoch FROM s.locked_at - s.run_at) * 1000, 0) AS ms
    FROM seen s WHERE s.locked_at IS NOT NULL
    UNION ALL
    SELECT s.queue, s.task, s.finished_at, s.state::text,
           greatest(extract(epoch FROM s.finished_at - s.locked_at) * 1000, 0)
    FROM seen s WHERE s.state IN ('succeeded', 'failed')
    UNION ALL
    SELECT s.queue, s.task, a.at, a.kind, NULL
    FROM seen s
    CROSS JOIN LATERAL jsonb_array_elements(s.errors) e
    CROSS JOIN LATERAL (VALUES ((e->>'started_at')::timestamptz, 'started'),
                               ((e->>'failed_at')::timestamptz, 'retried')) a(at, kind)
    WHERE s.errors <> '[]' AND (e->>'attempt')::int < s.attempt
  ), minutes AS (
    SELECT date_bin('1 minute', e.at, v_origin) AS minute, e.queue, e.task, e.kind,
           width_bucket(e.ms, idemq._duration_buckets()) AS bucket, e.ms
    FROM events e
    WHERE e.at >= v_from
  ), buckets AS (
    -- A start's ms is its wait, a finish's its run time.
    SELECT m.minute, m.queue, m.task, m.measure, jsonb_object_agg(m.bucket, m.n) AS counts
    FROM (SELECT m.minute, m.queue, m.task, CASE m.kind WHEN 'started' THEN 'wait' ELSE 'run' END AS measure,
                 m.bucket, count(*) AS n
          FROM minutes m WHERE m.ms IS NOT NULL
          GROUP BY 1, 2, 3, 4, 5) m
    GROUP BY m.minute, m.queue, m.task, m.measure
  ), fresh AS MATERIALIZED (
    SELECT m.minute, m.queue, m.task,
           count(*) FILTER (WHERE m.kind = 'started') AS started,
           count(*) FILTER (WHERE m.kind = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE m.kind = 'failed') AS failed,
           count(*) FILTER (WHERE m.kind = 'retried') AS retried
    FROM minutes m
    WHERE m.kind IN ('started', 'succeeded', 'failed', 'retried')
    GROUP BY m.minute, m.queue, m.task
  ), rows AS (
    SELECT f.minute, f.queue, f.task, f.started, f.succeeded, f.failed, f.retried,
           coalesce((SELECT b.counts FROM buckets b
                     WHERE (b.minute, b.queue, b.task, b.measure) = (f.minute, f.queue, f.task, 'run')), '{}') AS run_buckets,
           coalesce((SELECT b.counts FROM buckets b
                     WHERE (b.minute, b.queue, b.task, b.measure) = (f.minute, f.queue, f.task, 'wait')), '{}') AS wait_buckets
    FROM fresh f
    UNION ALL
    -- A minute in the window whose jobs are gone (purged) counts nothing now.
    SELECT m.minute, m.queue, m.task, 0, 0, 0, 0, '{}'::jsonb, '{}'::jsonb
    FROM idemq.job_minutes m
    WHERE m.minute >= v_from
      AND NOT EXISTS (SELECT FROM fresh f WHERE (f.minute, f.queue, f.task) = (m.minute, m.queue, m.task))
  )
  INSERT INTO idemq.job_minutes AS m (minute, queue, task, started, succeeded, failed, retried, run_buckets, wait_buckets)
  SELECT r.minute, r.queue, r.task, r.started, r.succeeded, r.failed, r.retried, r.run_buckets, r.wait_buckets
  FROM rows r
  ON CONFLICT (minute, queue, task) DO UPDATE
  SET started = excluded.started, succeeded = excluded.succeeded, failed = excluded.failed,
      retried = excluded.retried, run_buckets = excluded.run_buckets, wait_buckets = excluded.wait_buckets
  WHERE (m.started, m.succeeded, m.failed, m.retried, m.run_buckets, m.wait_buckets)
        IS DISTINCT FROM (excluded.started, excluded.succeeded, excluded.failed, excluded.retried,
                          excluded.run_buckets, excluded.wait_buckets);
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
  ON CONFLICT (minute, queue, task) DO UPDATE
  SET waiting = excluded.waiting, oldest_waiting_seconds = excluded.oldest_waiting_seconds;
  GET DIAGNOSTICS v_sampled = ROW_COUNT;

  DELETE FROM idemq.job_minutes m WHERE m.minute < v_now - v_keep;
  GET DIAGNOSTICS v_deleted = ROW_COUNT;

  UPDATE idemq.job_minutes_mark SET rolled_at = v_now;
  RETURN v_written + v_sampled + v_deleted;
END;
$$;

COMMENT ON FUNCTION idemq.roll_up() IS
  'Recompute the dashboard history (idemq.job_minutes) for the minutes since the last call, sample waiting jobs, delete minutes older than a day.';
