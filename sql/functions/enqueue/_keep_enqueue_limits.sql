-- idemq._keep_enqueue_limits() RETURNS trigger
--
-- Trigger (AFTER INSERT OR UPDATE OR DELETE ON idemq.settings, FOR EACH
-- STATEMENT): rewrites idemq.enqueue_limits, the one row of limits every
-- enqueue reads (_enqueue_limits), from the settings rows of their names.
-- Reading those six rows from idemq.settings in each enqueue (an
-- aggregate's setup and a scan) cost a sixth of a single enqueue (measured:
-- bench/FINDINGS.md, "Why the SQL is written as it is").
--
-- Guarantees:
--   * After every statement that writes idemq.settings, idemq.enqueue_limits
--     holds exactly one row whose every field is the value of the settings
--     row of its name, as _limit() reads it; so a limit keeps one definition,
--     its settings row, and this is the only place its name maps to a field.
--   * The row changes in the writer's transaction: an enqueue sees the new
--     limit once the change commits, as it saw the settings row before.
--   * A limit row deleted raises 42704 through _limit(), so the DELETE fails
--     and the kept row stays whole.
--   * SECURITY DEFINER: idemq_admin may UPDATE settings.value but holds no
--     privilege on idemq.enqueue_limits.
-- Concurrency: the kept row is locked first, then the settings are read by
--   the next statement, whose snapshot (READ COMMITTED) includes any change
--   committed by a writer it waited for; so two admins changing two limits
--   at once leave both in the row. Enqueues read the row without a lock and
--   never wait for this.
-- Errors: 42704 a limit row is missing.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._keep_enqueue_limits()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM 1 FROM idemq.enqueue_limits FOR UPDATE;
  DELETE FROM idemq.enqueue_limits;
  INSERT INTO idemq.enqueue_limits (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days)
  SELECT coalesce(max(s.value) FILTER (WHERE s.name = 'payload_bytes'), idemq._limit('payload_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'key_bytes'), idemq._limit('key_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'task_bytes'), idemq._limit('task_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'parents_per_job'), idemq._limit('parents_per_job')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'jobs_per_call'), idemq._limit('jobs_per_call')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'duration_days'), idemq._limit('duration_days'))
  FROM idemq.settings s;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._keep_enqueue_limits() IS
  'Trigger on idemq.settings: rewrites the one row of idemq.enqueue_limits from the settings rows of its fields.';
