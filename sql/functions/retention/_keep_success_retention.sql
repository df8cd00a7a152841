-- idemq._keep_success_retention() RETURNS trigger
--
-- Trigger (AFTER INSERT OR UPDATE OR DELETE ON idemq.settings, and AFTER
-- INSERT OR UPDATE OR DELETE OR TRUNCATE ON idemq.retention, FOR EACH
-- STATEMENT): rewrites idemq.success_retention, the one row that says which
-- succeeded jobs have retention 0 (_success_retention reads it in every
-- complete() and complete_many() call), from the settings row
-- retention_succeeded_seconds and the overrides of succeeded. Computing it
-- in each completion (a plpgsql function, an aggregate over a join) cost a
-- fifth of a transactional task's complete() (measured: bench/FINDINGS.md,
-- "Why the SQL is written as it is").
--
-- Guarantees:
--   * After every statement that writes idemq.settings or idemq.retention,
--     idemq.success_retention holds exactly one row: default_zero (the
--     setting is 0), and the tasks and queues whose override of succeeded is
--     0 (zero_*) or more (kept_*), each sorted; _gone_on_success applies the
--     precedence (task > queue > default) to it.
--   * The row changes in the writer's transaction: a completion follows the
--     new retention once the change commits, as it followed the tables.
--   * SECURITY DEFINER: idemq_admin may UPDATE settings.value (and calls
--     set_retention) but holds no privilege on idemq.success_retention.
-- Concurrency: the kept row is locked first, then the tables are read by the
--   next statement, whose snapshot (READ COMMITTED) includes any change
--   committed by a writer it waited for, so concurrent changes all land.
--   Completions read the row without a lock and never wait for this.
-- Errors: none of its own.
-- Tests: test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq._keep_success_retention()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM 1 FROM idemq.success_retention FOR UPDATE;
  DELETE FROM idemq.success_retention;
  -- The settings row is read directly, its name from _retention_setting, as
  -- _default_retention reads it through _limit.
  INSERT INTO idemq.success_retention (default_zero, zero_tasks, kept_tasks, zero_queues, kept_queues)
  SELECT s.value = 0,
         coalesce(array_agg(r.task ORDER BY r.task) FILTER (WHERE r.task IS NOT NULL AND r.keep = interval '0'), '{}'),
         coalesce(array_agg(r.task ORDER BY r.task) FILTER (WHERE r.task IS NOT NULL AND r.keep > interval '0'), '{}'),
         coalesce(array_agg(r.queue ORDER BY r.queue) FILTER (WHERE r.queue IS NOT NULL AND r.keep = interval '0'), '{}'),
         coalesce(array_agg(r.queue ORDER BY r.queue) FILTER (WHERE r.queue IS NOT NULL AND r.keep > interval '0'), '{}')
  FROM idemq.settings s
  LEFT JOIN idemq.retention r ON r.state = 'succeeded'
  WHERE s.name = idemq._retention_setting('succeeded')
  GROUP BY s.value;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._keep_success_retention() IS
  'Trigger on idemq.settings and idemq.retention: rewrites the one row of idemq.success_retention (which succeeded jobs have retention 0).';
