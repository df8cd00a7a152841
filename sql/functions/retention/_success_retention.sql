-- idemq._success_retention() RETURNS TABLE(any_zero boolean, default_zero boolean,
--   zero_tasks text[], kept_tasks text[], zero_queues text[], kept_queues text[])
--
-- Which succeeded jobs have retention 0 (deleted by the completing
-- statement itself), read once per complete()/complete_many() call: the
-- default (setting retention_succeeded_seconds = 0) and the tasks and queues
-- whose override of succeeded is 0 (zero_*) or more (kept_*). Read from
-- idemq.success_retention, the one row the trigger _keep_success_retention
-- rewrites whenever idemq.settings or idemq.retention change: computing it
-- here cost each completion call a fifth of a transactional complete(),
-- reading the kept row a sixteenth of that (measured: bench/FINDINGS.md,
-- "Why the SQL is written as it is").
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
