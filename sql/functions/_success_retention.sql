-- idemq._success_retention() RETURNS TABLE(any_zero boolean, default_zero boolean,
--   zero_tasks text[], kept_tasks text[], zero_queues text[], kept_queues text[])
--
-- Which succeeded jobs have retention 0 (deleted by the completing
-- statement itself), read once per complete()/complete_many() call: the
-- default (setting retention_succeeded_seconds = 0) and the tasks and queues
-- whose override of succeeded is 0 (zero_*) or more (kept_*).
--
-- Guarantees: any_zero is false when no succeeded job can have retention 0:
--   the completion then takes its usual path, at the cost of this one read.
--   _gone_on_success() applies the precedence (task > queue > default) to a
--   row with these arrays, so a completion looks nothing up per job.
-- Concurrency: plain reads of idemq.settings and idemq.retention.
-- Errors: none of its own.
-- Tests: test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq._success_retention()
RETURNS TABLE(any_zero boolean, default_zero boolean, zero_tasks text[], kept_tasks text[],
              zero_queues text[], kept_queues text[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  -- One statement: this runs in every completion call. The settings row is
  -- read directly (its name from _retention_setting, as _default_retention
  -- reads it through _limit) to spare two nested function calls per call.
  SELECT s.value = 0,
         coalesce(array_agg(r.task) FILTER (WHERE r.task IS NOT NULL AND r.keep = interval '0'), '{}'),
         coalesce(array_agg(r.task) FILTER (WHERE r.task IS NOT NULL AND r.keep > interval '0'), '{}'),
         coalesce(array_agg(r.queue) FILTER (WHERE r.queue IS NOT NULL AND r.keep = interval '0'), '{}'),
         coalesce(array_agg(r.queue) FILTER (WHERE r.queue IS NOT NULL AND r.keep > interval '0'), '{}')
    INTO default_zero, zero_tasks, kept_tasks, zero_queues, kept_queues
  FROM idemq.settings s
  LEFT JOIN idemq.retention r ON r.state = 'succeeded'
  WHERE s.name = idemq._retention_setting('succeeded')
  GROUP BY s.value;
  default_zero := coalesce(default_zero, false);
  zero_tasks := coalesce(zero_tasks, '{}');
  kept_tasks := coalesce(kept_tasks, '{}');
  zero_queues := coalesce(zero_queues, '{}');
  kept_queues := coalesce(kept_queues, '{}');
  any_zero := default_zero OR cardinality(zero_tasks) > 0 OR cardinality(zero_queues) > 0;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq._success_retention() IS
  'Which succeeded jobs have retention 0 (default, tasks, queues), read once per completion call.';
