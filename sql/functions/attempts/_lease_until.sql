-- idemq._lease_until(locked_at timestamptz, timeout interval, lease interval) RETURNS timestamptz
--
-- When a lease taken or renewed now runs out: `lease` from now, but never
-- past the job's time limit, locked_at + timeout (no limit when timeout is
-- NULL). claim, the hand-off of complete_and_take_next (_key_promote) and
-- heartbeat write lease_expires_at with it: idemq._lease_until(now(),
-- j.timeout, lease) where the attempt starts (locked_at is set to now() in
-- the same UPDATE), idemq._lease_until(j.locked_at, j.timeout, lease) where
-- it goes on.
--
-- Guarantees: the one definition of a lease's end, so a lease never outlives
--   the job's timeout whichever call wrote it (docs/design.md, "Time limit
--   per job"). Both ends are instants: a timeout of '1 month' and a lease of
--   '30 days' end at the earlier of the two dates, as the heartbeat's check
--   locked_at + timeout > now() reads them. A SQL function of one
--   expression, neither STRICT nor plpgsql, so the planner inlines it into
--   the UPDATE that calls it (as _held).
-- Concurrency: none (reads the transaction's now()).
-- Errors: none.
-- Tests: test/sql/timeout.test.ts, test/sql/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._lease_until(locked_at timestamptz, timeout interval, lease interval)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN least(now() + lease, locked_at + timeout);

COMMENT ON FUNCTION idemq._lease_until(timestamptz, interval, interval) IS
  'When a lease taken or renewed now runs out: lease from now, never past locked_at + timeout (the one definition claim, the hand-off and heartbeat use).';
