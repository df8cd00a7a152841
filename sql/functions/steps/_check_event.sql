-- idemq._check_event(operation text, event text, key text) RETURNS void
--
-- Refuses a bad event name or key (emit, await_event).
--
-- Guarantees: returns only when event is non-empty and key is NULL or
--   non-empty, both at most key_bytes bytes (idemq._limit). An empty key is
--   refused rather than taken for "no key": NULL is no key.
-- Concurrency: none.
-- Errors: 22004 NULL event; 22023 empty event or key, either over key_bytes.
-- Tests: test/sql/steps.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._check_event(operation text, event text, key text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_event.event IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: event must not be NULL', operation),
      HINT = 'Name the event, e.g. ''order.paid''; the key (e.g. the order id) says which one.';
  END IF;
  IF _check_event.event = '' OR _check_event.key = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: event and key must not be empty strings', operation),
      HINT = 'Leave key out (NULL) for an event without a key.';
  END IF;
  PERFORM idemq._check_size(operation, 'event', _check_event.event, 'key_bytes', 'Use a shorter event name.');
  PERFORM idemq._check_size(operation, 'key', _check_event.key, 'key_bytes', 'Use a shorter key, e.g. an id.');
END;
$$;

COMMENT ON FUNCTION idemq._check_event(text, text, text) IS
  'Raise 22004/22023 for a bad event name or key (emit, await_event).';
