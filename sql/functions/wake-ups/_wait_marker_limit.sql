-- idemq._wait_marker_limit() RETURNS int
--
-- The most queue markers a session holds (wait_for_jobs): past it, a session
-- waits for every queue instead.
--
-- Guarantees: 16. Markers are session advisory locks, and the lock table is
--   one for the whole server (max_locks_per_transaction x max_connections
--   slots, 6,400 by default): a session that took one lock per queue name of a
--   long list would fill it and break unrelated databases (53200). Waiting for
--   every queue instead costs only NOTIFYs for queues this session does not
--   claim from. A constant function inlines, so callers compare with a literal.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_marker_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 16;

COMMENT ON FUNCTION idemq._wait_marker_limit() IS
  'The most queue markers a session holds (16); past it, wait_for_jobs waits for every queue instead.';
