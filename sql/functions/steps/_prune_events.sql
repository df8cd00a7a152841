-- idemq._prune_events(batch_size int) RETURNS int
--
-- Deletes at most batch_size events older than event_retention_seconds
-- (idemq.settings); returns how many. Called by apply_retention.
--
-- Guarantees: an event is kept at least event_retention_seconds after its
--   emit, so a wait reached within that time finds it; oldest first.
-- Concurrency: FOR UPDATE SKIP LOCKED: concurrent callers never wait.
-- Errors: none of its own.
-- Tests: test/sql/steps.test.ts
CREATE OR REPLACE FUNCTION idemq._prune_events(batch_size int)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  WITH gone AS (
    DELETE FROM idemq.events e
    WHERE e.id IN (
      SELECT o.id FROM idemq.events o
      WHERE o.emitted_at < now() - make_interval(secs => idemq._limit('event_retention_seconds'))
      ORDER BY o.emitted_at
      LIMIT _prune_events.batch_size
      FOR UPDATE SKIP LOCKED)
    RETURNING e.id
  )
  SELECT count(*) INTO v_count FROM gone;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq._prune_events(int) IS
  'Delete at most batch_size events past event_retention_seconds (apply_retention).';
