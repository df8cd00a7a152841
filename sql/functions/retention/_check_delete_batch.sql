-- idemq._check_delete_batch(operation text, batch_size int) RETURNS void
--
-- Refuses a batch size of purge or apply_retention outside 1..10000: one
-- batch is one short transaction, and its row locks and WAL grow with it.
--
-- Guarantees: returns only for 1 <= batch_size <= 10000.
-- Concurrency: none.
-- Errors: 22004 NULL; 22023 out of range.
-- Tests: test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq._check_delete_batch(operation text, batch_size int)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN batch_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('%s: batch_size must be between 1 and 10000, not %s', operation, coalesce(batch_size::text, 'NULL')),
      HINT = 'Delete in batches of a few thousand at most and call again while a batch comes back full.';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_delete_batch(text, int) IS
  'Raise 22023 (22004 for NULL) when a delete batch size is outside 1..10000.';
