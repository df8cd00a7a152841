-- idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states())
--   RETURNS int
--
-- Deletes finished jobs that finished more than older_than ago. Returns how many.
--
-- Guarantees:
--   * Only terminal jobs are ever deleted (states must be terminal).
--   * Never releases an idempotency key: the ledger (idemq.keys) keeps it
--     until prune_keys() passes the key retention, so a purged job's key
--     still deduplicates or rejects.
--   * Dependency rows of purged parents are removed with them.
-- Concurrency: SKIP LOCKED: rows a concurrent transaction holds are left for the next call.
-- Errors: 22004 NULL argument; 22023 negative older_than or over duration_days
--   (idemq._limit), an active state in states.
-- Tests: test/sql/retention.test.ts
CREATE OR REPLACE FUNCTION idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states())
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  IF older_than IS NULL OR states IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'purge: older_than and states must not be NULL',
      HINT = 'e.g. purge(older_than => ''7 days'') purges every terminal state.';
  END IF;
  IF older_than < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: older_than must not be negative, not %s', older_than),
      HINT = 'older_than is how long a finished job is kept, e.g. ''7 days''.';
  END IF;
  PERFORM idemq._check_duration('purge', 'older_than', older_than);
  IF NOT states <@ idemq.terminal_states() OR array_position(states, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: states must be terminal (%s), not %s', idemq.terminal_states(), idemq._excerpt(states::text)),
      HINT = 'Active jobs are never purged; cancel them first.';
  END IF;

  WITH doomed AS MATERIALIZED (
    SELECT j.id FROM idemq.jobs j
    WHERE j.state = ANY (states) AND j.finished_at < now() - older_than
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM idemq.jobs AS j USING doomed d WHERE j.id = d.id RETURNING j.id
  ), deps AS (
    DELETE FROM idemq.job_dependencies AS dep USING gone g WHERE dep.parent_id = g.id
  )
  SELECT count(*) INTO v_count FROM gone;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq.purge(interval, idemq.job_state[]) IS
  'Delete terminal jobs finished more than older_than ago; keys stay until prune_keys.';
