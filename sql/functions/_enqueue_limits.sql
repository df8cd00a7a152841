-- idemq._enqueue_limits() RETURNS SETOF idemq._enqueue_limits
--
-- The limits an enqueue checks, read from idemq.settings in one query, once
-- per enqueue or enqueue_many call: payload_bytes, key_bytes (the
-- idempotency key), task_bytes, parents_per_job (after), jobs_per_call and
-- duration_days (key_retention).
--
-- Guarantees: exactly one row; every field is the value of the settings row
--   of its name, as _limit() reads it (so a limit still has one definition:
--   its row); a row missing raises through _limit(). _job_problem takes the
--   row as an argument, so a batch reads each limit once, not once per
--   element.
--   * Called in FROM (SELECT * INTO v_limits FROM idemq._enqueue_limits()):
--     a SQL-standard body, SETOF so that the planner inlines it into the
--     caller's query. As a plpgsql function it cost 10 us per call (5,000
--     calls, backend CPU), as much as a quarter of a single enqueue; inlined,
--     5 us.
-- Concurrency: a plain read of idemq.settings; a changed value applies to
--   statements that start after it commits.
-- Errors: 42704 a limit row is missing (a schema older than its caller: run
--   idemq migrate).
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_limits()
RETURNS SETOF idemq._enqueue_limits
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT coalesce(max(s.value) FILTER (WHERE s.name = 'payload_bytes'), idemq._limit('payload_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'key_bytes'), idemq._limit('key_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'task_bytes'), idemq._limit('task_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'parents_per_job'), idemq._limit('parents_per_job')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'jobs_per_call'), idemq._limit('jobs_per_call')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'duration_days'), idemq._limit('duration_days'))
  FROM idemq.settings s;
END;

COMMENT ON FUNCTION idemq._enqueue_limits() IS
  'The limits an enqueue checks (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days), read once per call.';
