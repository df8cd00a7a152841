-- Migration 0025_success_retention_kept: which succeeded jobs have retention 0 kept in one row (idemq.success_retention), rewritten by triggers on idemq.settings and idemq.retention, so a complete() or complete_many() call reads one row instead of running a plpgsql function over an aggregate and a join (about 158,000 instructions a call, a fifth of a transactional task's complete(), to about 10,000).
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ (npm run migration:check compares them). Once released (listed
-- in sql/released.sha256) this file never changes again.
-- Up Migration

-- Hand-written schema changes (tables, columns, indexes) go here, before the
-- functions that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes
-- in a migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration commits
-- on its own, so the next migration can use it.

-- The row _success_retention reads; _keep_success_retention, the triggers'
-- function below, is its only writer and leaves exactly one (unique on a
-- constant: one row at most).
CREATE TABLE idemq.success_retention (
  default_zero  boolean NOT NULL,
  zero_tasks    text[] NOT NULL,
  kept_tasks    text[] NOT NULL,
  zero_queues   text[] NOT NULL,
  kept_queues   text[] NOT NULL
);
CREATE UNIQUE INDEX success_retention_one_row ON idemq.success_retention ((true));
COMMENT ON TABLE idemq.success_retention IS
  'Which succeeded jobs have retention 0, one row kept from idemq.settings and idemq.retention by triggers; change those, not this.';

-- ---- sql/functions/_keep_success_retention.sql ----
-- idemq._keep_success_retention() RETURNS trigger
--
-- Trigger (AFTER INSERT OR UPDATE OR DELETE ON idemq.settings, and AFTER
-- INSERT OR UPDATE OR DELETE OR TRUNCATE ON idemq.retention, FOR EACH
-- STATEMENT): rewrites idemq.success_retention, the one row that says which
-- succeeded jobs have retention 0 (_success_retention reads it in every
-- complete() and complete_many() call), from the settings row
-- retention_succeeded_seconds and the overrides of succeeded. Computing it
-- in each completion cost about 158,000 instructions a call (a plpgsql
-- function, an aggregate over a join; callgrind, PostgreSQL 15), a fifth of
-- a transactional task's complete(); reading the kept row about 10,000.
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

-- ---- sql/functions/_success_retention.sql ----
-- idemq._success_retention() RETURNS TABLE(any_zero boolean, default_zero boolean,
--   zero_tasks text[], kept_tasks text[], zero_queues text[], kept_queues text[])
--
-- Which succeeded jobs have retention 0 (deleted by the completing
-- statement itself), read once per complete()/complete_many() call: the
-- default (setting retention_succeeded_seconds = 0) and the tasks and queues
-- whose override of succeeded is 0 (zero_*) or more (kept_*). Read from
-- idemq.success_retention, the one row the trigger _keep_success_retention
-- rewrites whenever idemq.settings or idemq.retention change (computing it
-- here cost about 158,000 instructions a completion call; the kept row about
-- 10,000).
--
-- Guarantees: exactly one row. any_zero is false when no succeeded job can
--   have retention 0: the completion then takes its usual path, at the cost
--   of this one read. _gone_on_success() applies the precedence (task >
--   queue > default) to a row with these arrays, so a completion looks
--   nothing up per job.
--   * A SQL-standard body, SETOF, called in FROM: the planner inlines it
--     into the caller's query.
-- Concurrency: a plain read; a changed retention applies to statements that
--   start after it commits.
-- Errors: none of its own.
-- Tests: test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq._success_retention()
RETURNS TABLE(any_zero boolean, default_zero boolean, zero_tasks text[], kept_tasks text[],
              zero_queues text[], kept_queues text[])
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT r.default_zero OR cardinality(r.zero_tasks) > 0 OR cardinality(r.zero_queues) > 0,
         r.default_zero, r.zero_tasks, r.kept_tasks, r.zero_queues, r.kept_queues
  FROM idemq.success_retention r;
END;

COMMENT ON FUNCTION idemq._success_retention() IS
  'Which succeeded jobs have retention 0 (default, tasks, queues), read once per completion call from idemq.success_retention.';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._keep_success_retention FROM PUBLIC;

CREATE TRIGGER settings_keep_success_retention
  AFTER INSERT OR UPDATE OR DELETE ON idemq.settings
  FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_success_retention();
CREATE TRIGGER retention_keep_success_retention
  AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idemq.retention
  FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_success_retention();
-- The first row: a statement trigger fires for a statement that writes no row.
UPDATE idemq.retention SET keep = keep WHERE false;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- Before their function is dropped below.
DROP TRIGGER settings_keep_success_retention ON idemq.settings;
DROP TRIGGER retention_keep_success_retention ON idemq.retention;

-- sql/functions/_success_retention.sql as of 0012_retention
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

DROP FUNCTION idemq._keep_success_retention;

-- Hand-written reversal of the schema changes above goes here, after the functions.
-- After _success_retention, restored above, stopped reading it.
DROP TABLE idemq.success_retention;
