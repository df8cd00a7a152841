-- idemq._held(lease_expires_at timestamptz, locked_by text) RETURNS boolean
--
-- Is the job held by an attempt (processing, under a lease)? Fenced calls
-- test it with the job's id, attempt and lease token:
-- idemq._held(j.lease_expires_at, j.locked_by).
--
-- Guarantees: the one definition of "held". Written as the lease columns,
--   which constraint jobs_lease_iff_processing ties to state = 'processing':
--   "state = 'processing'" lets the planner probe the jobs_leases partial
--   index (every job in flight) instead of the primary key, a cost that grows
--   with the jobs in flight (seen in EXPLAIN). A SQL function of one
--   expression, neither STRICT nor plpgsql, so the planner inlines it and
--   plans the column tests themselves: complete, complete_many, heartbeat,
--   fail and snooze still probe jobs_pkey (EXPLAIN through auto_explain,
--   before and after the helper).
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/fencing.test.ts, test/sql/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._held(lease_expires_at timestamptz, locked_by text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN lease_expires_at IS NOT NULL AND locked_by IS NOT NULL;

COMMENT ON FUNCTION idemq._held(timestamptz, text) IS
  'Held by an attempt (processing, under a lease), from the lease columns: the fencing predicate, index-friendly once inlined.';
