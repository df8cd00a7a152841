-- idemq._wait_key(queue text) RETURNS bigint
--
-- The advisory-lock keys of the wake-up protocol (wait_for_jobs, _notify_waiting):
-- a queue's name keys the marker of sessions waiting for that queue, NULL the
-- marker of sessions waiting for every queue, and '' (no queue has that name:
-- CHECK jobs_queue_not_empty) the barrier that enqueues hold while they decide
-- not to notify.
--
-- Guarantees: the same key for the same argument in every session. Two names
--   hashing alike only cost a NOTIFY nobody needed or a barrier retry. The
--   keys are predictable and advisory locks have no privileges, so any session
--   may hold them: the protocol only ever tries them (wait_for_jobs,
--   _notify_waiting), and a foreign holder costs NOTIFYs or a later true,
--   never a blocked call or a lost wake-up.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/wake-up.test.ts
CREATE OR REPLACE FUNCTION idemq._wait_key(queue text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ('x' || left(md5(CASE WHEN queue IS NULL THEN 'idemq:all-queues' ELSE 'idemq:queue:' || queue END), 16))::bit(64)::bigint;

COMMENT ON FUNCTION idemq._wait_key(text) IS
  'Advisory-lock key of the wake-up protocol: a queue''s waiting marker, NULL for all queues, '''' for the barrier.';
