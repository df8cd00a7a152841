-- idemq._stripe_counts(limit_id bigint) RETURNS TABLE(slot int, n int)
--
-- The jobs processing in a concurrency limit's scope, per stripe they are
-- counted in (_stripe_of): what each stripe's held less its unfolded
-- releases must equal (docs/design.md, "Flow control"). Read by
-- _repair_slots, to find a limit that disagrees and to recount it.
--
-- Guarantees: one row per stripe with at least one job; none for a limit
--   without concurrency or that does not exist. Read in the calling
--   statement's snapshot (a STABLE function takes none of its own).
-- Concurrency: a plain read.
-- Cost: one walk of the processing jobs (jobs_leases), filtered by the
--   scope's name.
-- Errors: none.
-- Tests: test/sql/flow-control-repair.test.ts
CREATE OR REPLACE FUNCTION idemq._stripe_counts(limit_id bigint)
RETURNS TABLE(slot int, n int)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT idemq._stripe_of(CASE WHEN l.kind = 'queue' THEN j.queue_slot ELSE j.task_slot END, l.first_slot),
         count(*)::int
  FROM idemq.limits l
  JOIN idemq.jobs j ON j.state = 'processing' AND CASE WHEN l.kind = 'queue' THEN j.queue ELSE j.task END = l.name
  WHERE l.id = _stripe_counts.limit_id AND l.concurrency IS NOT NULL
  GROUP BY 1;
END;
$$;

COMMENT ON FUNCTION idemq._stripe_counts(bigint) IS
  'The jobs processing in a concurrency limit''s scope, per stripe they are counted in: what held less unfolded releases must equal.';
