-- idemq.history(since interval DEFAULT '1 hour', queue text DEFAULT NULL, task text DEFAULT NULL)
--   RETURNS TABLE(minute timestamptz, started bigint, succeeded bigint, failed bigint, retried bigint,
--     waiting bigint, oldest_waiting_seconds bigint, run_p50_ms bigint, run_p95_ms bigint,
--     wait_p50_ms bigint, wait_p95_ms bigint)
--
-- The dashboard's charts: one row per minute of the last `since` that
-- roll_up() wrote, for one queue, one task, both or all (NULL: every one),
-- oldest first.
--
-- Guarantees:
--   * started, succeeded, failed, retried: sums over the queues and tasks
--     chosen, as apply_retention()'s fold of idemq.job_counts adds them
--     (its header says what each counts: exact, per statement's start).
--   * waiting: the sum of the sampled waiting jobs, NULL in a minute no
--     roll-up sampled; oldest_waiting_seconds: the largest sampled age.
--   * run_p50_ms … wait_p95_ms: percentiles of the minute's run and wait
--     times over the queues and tasks chosen (roll_up()'s sample: up to
--     100 succeeded and 100 failed jobs a minute), each the upper bound of
--     a _duration_buckets() bucket (at most 2.5 times the true value); NULL
--     when the minute has none.
--   * Reads idemq.job_minutes only (its primary key, by minute): at most
--     1,440 minutes times the queues and tasks, never idemq.jobs.
-- Concurrency: plain reads; one snapshot.
-- Errors: 22004 NULL since; 22023 since not positive or over a day (the
--   history kept), HINT says so.
-- Tests: test/sql/history.test.ts, test/dashboard/charts.test.ts
CREATE OR REPLACE FUNCTION idemq.history(since interval DEFAULT '1 hour', queue text DEFAULT NULL, task text DEFAULT NULL)
RETURNS TABLE(minute timestamptz, started bigint, succeeded bigint, failed bigint, retried bigint,
              waiting bigint, oldest_waiting_seconds bigint, run_p50_ms bigint, run_p95_ms bigint,
              wait_p50_ms bigint, wait_p95_ms bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF since IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'history: since must not be NULL',
      HINT = 'Leave it out for the last hour, or give e.g. since => ''1 day''.';
  END IF;
  IF since <= interval '0' OR since > idemq._history_kept() THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('history: since must be positive and at most %s, not %s', idemq._history_kept(), since),
      HINT = format('roll_up() keeps a day of minutes: give since => ''1 hour'' up to ''%s''.', idemq._history_kept());
  END IF;

  RETURN QUERY
  WITH chosen AS MATERIALIZED (
    SELECT m.* FROM idemq.job_minutes m
    WHERE m.minute >= idemq._minute_of(now() - since)
      AND (history.queue IS NULL OR m.queue = history.queue)
      AND (history.task IS NULL OR m.task = history.task)
  ), merged AS (
    SELECT c.minute, b.measure, b.key, sum(b.n) AS n
    FROM chosen c
    CROSS JOIN LATERAL (
      SELECT 'run' AS measure, r.key, r.value::bigint AS n FROM jsonb_each_text(c.run_buckets) r
      UNION ALL
      SELECT 'wait', w.key, w.value::bigint FROM jsonb_each_text(c.wait_buckets) w
    ) b
    GROUP BY c.minute, b.measure, b.key
  ), summed AS (
    SELECT s.minute, s.measure, jsonb_object_agg(s.key, s.n) AS counts
    FROM merged s
    GROUP BY s.minute, s.measure
  )
  SELECT c.minute, sum(c.started)::bigint, sum(c.succeeded)::bigint, sum(c.failed)::bigint, sum(c.retried)::bigint,
         sum(c.waiting)::bigint, max(c.oldest_waiting_seconds),
         idemq._duration_percentile((SELECT s.counts FROM summed s WHERE s.minute = c.minute AND s.measure = 'run'), 0.5),
         idemq._duration_percentile((SELECT s.counts FROM summed s WHERE s.minute = c.minute AND s.measure = 'run'), 0.95),
         idemq._duration_percentile((SELECT s.counts FROM summed s WHERE s.minute = c.minute AND s.measure = 'wait'), 0.5),
         idemq._duration_percentile((SELECT s.counts FROM summed s WHERE s.minute = c.minute AND s.measure = 'wait'), 0.95)
  FROM chosen c
  GROUP BY c.minute
  ORDER BY c.minute;
END;
$$;

COMMENT ON FUNCTION idemq.history(interval, text, text) IS
  'Per minute of the last since (at most a day), for a queue, a task or all: attempts started and retried, jobs succeeded and failed, waiting jobs, oldest waiting age, run and wait p50/p95.';
