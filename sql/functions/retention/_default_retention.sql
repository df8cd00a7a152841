-- idemq._default_retention(state idemq.job_state) RETURNS interval
--
-- How long a finished job of `state` is kept when no override of
-- idemq.retention names its task or queue: the setting
-- retention_<state>_seconds (idemq.settings, read by idemq._limit).
--
-- Guarantees: the one place the settings row of a state's retention is
--   named; a non-negative interval of whole seconds.
-- Concurrency: a plain read of idemq.settings.
-- Errors: 42704 (from _limit) for an active state: it has no retention.
-- Tests: test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq._default_retention(state idemq.job_state)
RETURNS interval
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN make_interval(secs => idemq._limit(idemq._retention_setting(_default_retention.state)));
END;
$$;

COMMENT ON FUNCTION idemq._default_retention(idemq.job_state) IS
  'The default retention of finished jobs in a state (settings row retention_<state>_seconds).';
