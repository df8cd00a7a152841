-- idemq.schedules()
--   RETURNS TABLE(name text, cron text, timezone text, task text, queue text, payload jsonb,
--   priority int, max_attempts int, overlap idemq.schedule_overlap, misfire idemq.schedule_misfire,
--   misfire_grace interval, next_at timestamptz, last_slot_at timestamptz, last_job_id bigint,
--   last_job_state idemq.job_state, skipped bigint, created_at timestamptz, updated_at timestamptz,
--   last_error text, last_error_at timestamptz)
--
-- Lists the schedules, by name, with the state of each one's latest job
-- (filter with WHERE name = ...).
--
-- Guarantees: one row per schedule; last_job_state is NULL when the schedule
--   has run no job yet or its job was purged; skipped counts the slots the
--   overlap policy dropped; last_error is why the latest tick() could not
--   enqueue the schedule's job ("<message> (SQLSTATE <code>)", e.g. a
--   payload over a lowered payload_bytes) and last_error_at when, both NULL
--   once a tick enqueued it (the schedule stays due until then); payload is
--   NULL unless the session's login may read idemq.schedules itself (the
--   admin role, the owner, a superuser; not the viewer), as job() shows a
--   job's.
-- Concurrency: a plain read (no locks).
-- Errors: none.
-- Tests: test/sql/schedules.test.ts, test/sql/schedules-tick.test.ts, test/cli/schedules.test.ts
CREATE OR REPLACE FUNCTION idemq.schedules()
RETURNS TABLE(name text, cron text, timezone text, task text, queue text, payload jsonb,
              priority int, max_attempts int, overlap idemq.schedule_overlap, misfire idemq.schedule_misfire,
              misfire_grace interval, next_at timestamptz, last_slot_at timestamptz, last_job_id bigint,
              last_job_state idemq.job_state, skipped bigint, created_at timestamptz, updated_at timestamptz,
              last_error text, last_error_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  -- session_user, as job() (inside SECURITY DEFINER current_user is the owner).
  SELECT s.name, s.cron, s.timezone, s.task, s.queue,
         CASE WHEN has_table_privilege(session_user, 'idemq.schedules', 'SELECT') THEN s.payload END, s.priority, s.max_attempts, s.overlap,
         s.misfire, s.misfire_grace, s.next_at, s.last_slot_at, s.last_job_id, j.state, s.skipped,
         s.created_at, s.updated_at, s.last_error, s.last_error_at
  FROM idemq.schedules s
  LEFT JOIN idemq.jobs j ON j.id = s.last_job_id
  ORDER BY s.name;
$$;

COMMENT ON FUNCTION idemq.schedules() IS
  'List the recurring schedules, with the state of each one''s latest job.';
