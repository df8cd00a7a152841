-- idemq._key_lock(keys text[]) RETURNS void
--
-- Takes the transaction-level lock of each concurrency key in `keys` (NULLs
-- ignored): an advisory lock on (1801812339, hashtext(key)), taken in the
-- order of the hashes, held until the transaction ends.
--
-- Guarantees: when this returns, no other transaction admits a job of these
--   keys (enqueue, _key_promote) until this one ends, and a statement that
--   starts after it sees every admission and every release committed before.
--   Keys whose hashes collide share a lock (they wait for each other, never
--   more).
-- Concurrency: taken in hash order, so one call never deadlocks with another
--   call; a transaction that locks keys in two calls (two enqueues of
--   different keys) can deadlock with one that locks them the other way
--   round, as with any two rows. The first number ('keys' in ASCII) keeps the
--   locks apart from the wake-up markers (_wait_key, one bigint).
-- Errors: none.
-- Tests: test/sql/concurrency-keys.test.ts, test/sql/concurrency-keys-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._key_lock(keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  -- One statement: the locks are taken as the sorted rows come (OFFSET 0
  -- keeps the sort below the calls).
  PERFORM pg_advisory_xact_lock(1801812339, s.h)
  FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(keys) AS k WHERE k IS NOT NULL ORDER BY 1 OFFSET 0) AS s;
END;
$$;

COMMENT ON FUNCTION idemq._key_lock(text[]) IS
  'Lock concurrency keys for the rest of the transaction (advisory, in hash order): admissions of a key are serialised.';
