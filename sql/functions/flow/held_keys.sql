-- idemq.held_keys() RETURNS TABLE(concurrency_key text, held_until timestamptz)
--
-- The concurrency keys held back now (hold(..., scope => 'key'): a 429 for
-- one key), and until when.
--
-- Guarantees:
--   * One row per key whose hold is still to come (held_until after now()),
--     ordered by held_until, then key; a hold that has passed is left out
--     (its row waits for the next hold to delete it).
--   * Until held_until, no job of the key starts (hold()); the jobs the hold
--     moved show their run_at in job().
-- Concurrency: a plain read.
-- Errors: none.
-- Tests: test/sql/hold-key.test.ts
CREATE OR REPLACE FUNCTION idemq.held_keys()
RETURNS TABLE(concurrency_key text, held_until timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT h.concurrency_key, h.held_until
  FROM idemq.key_holds h
  WHERE h.held_until > now()
  ORDER BY h.held_until, h.concurrency_key;
$$;

COMMENT ON FUNCTION idemq.held_keys() IS
  'The concurrency keys held back now (hold with scope key: a 429 for one key), and until when.';
