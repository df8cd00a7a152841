-- idemq._enqueue_limits() RETURNS SETOF idemq._enqueue_limits
--
-- The limits an enqueue checks, once per enqueue or enqueue_many call:
-- payload_bytes, key_bytes (the idempotency key), task_bytes,
-- parents_per_job (after), jobs_per_call and duration_days (key_retention).
-- Read from idemq.enqueue_limits, the one row that the trigger
-- _keep_enqueue_limits rewrites from idemq.settings whenever settings change
-- (reading the six settings rows here cost a sixth of a single enqueue;
-- measured: bench/FINDINGS.md, "Why the SQL is written as it is").
--
-- Guarantees: exactly one row, whose every field is the value of the
--   settings row of its name (_keep_enqueue_limits keeps it so; a test
--   compares them after each kind of change). _job_problem takes the row as
--   an argument, so a batch reads each limit once, not once per element.
--   * Called in FROM (SELECT * INTO v_limits FROM idemq._enqueue_limits()):
--     a SQL-standard body, SETOF so that the planner inlines it into the
--     caller's query.
-- Concurrency: a plain read; a changed limit applies to statements that
--   start after its settings change commits.
-- Errors: none (a missing settings row is refused when it is deleted).
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_limits()
RETURNS SETOF idemq._enqueue_limits
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT l.payload_bytes, l.key_bytes, l.task_bytes, l.parents_per_job, l.jobs_per_call, l.duration_days
  FROM idemq.enqueue_limits l;
END;

COMMENT ON FUNCTION idemq._enqueue_limits() IS
  'The limits an enqueue checks (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days): the row idemq.enqueue_limits keeps.';
