-- idemq._stripe_of(named int, first_slot int) RETURNS int
--
-- The stripe of a concurrency limit in which a processing job is counted:
-- the one it names (jobs.queue_slot or task_slot, written by claim()) when
-- that is one of the limit's, else the limit's first (first_slot): a job
-- naming an older stripe, or none, was processing when set_limit made the
-- limit, which counted it there. Stripe numbers only grow
-- (idemq.limit_slot_numbers, no cache), so "one of the limit's" is
-- "at least first_slot". The one rule the jobs trigger's releases and
-- _repair_slots' count share.
--
-- Guarantees: named when named >= first_slot, else first_slot (NULL named
--   included). Inlined into the caller's statement (a SQL function with
--   no SET clause): no call per row.
-- Concurrency: none (a pure expression).
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts, test/sql/flow-control-repair.test.ts
CREATE OR REPLACE FUNCTION idemq._stripe_of(named int, first_slot int)
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN named >= first_slot THEN named ELSE first_slot END;

COMMENT ON FUNCTION idemq._stripe_of(int, int) IS
  'The stripe a processing job is counted in: the one it names if its limit''s (>= first_slot), else first_slot.';
