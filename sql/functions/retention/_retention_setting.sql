-- idemq._retention_setting(state idemq.job_state) RETURNS text
--
-- The name of the idemq.settings row holding the default retention of a
-- terminal state: retention_<state>_seconds.
--
-- Guarantees: the one spelling of those names (_default_retention reads the
--   row, set_retention writes it).
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq._retention_setting(state idemq.job_state)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'retention_' || state::text || '_seconds';

COMMENT ON FUNCTION idemq._retention_setting(idemq.job_state) IS
  'The settings row of a terminal state''s default retention: retention_<state>_seconds.';
