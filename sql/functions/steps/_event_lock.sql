-- idemq._event_lock(event text, key text) RETURNS void
--
-- Serialises emit() and await_event() on one (event, key) until the
-- caller's transaction ends.
--
-- Guarantees: with both taking it before they read, a wait that parks is
--   either seen by the emit that follows it (and woken) or sees the event
--   that emit stored (never neither, at READ COMMITTED).
-- Concurrency: pg_advisory_xact_lock in the two-key space
--   (hashtext('idemq.event'), hash of event and key); a collision only
--   serialises two unrelated pairs briefly.
-- Errors: none.
-- Tests: test/sql/steps.test.ts
CREATE OR REPLACE FUNCTION idemq._event_lock(event text, key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('idemq.event'), hashtext(_event_lock.event || chr(1) || coalesce(_event_lock.key, '')));
END;
$$;

COMMENT ON FUNCTION idemq._event_lock(text, text) IS
  'Transaction advisory lock on one (event, key): emit and await_event never miss each other.';
