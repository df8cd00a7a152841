-- idemq.guard(key text, task text DEFAULT NULL) RETURNS boolean
--
-- The guard row for a database effect: call it in the same transaction as the
-- effect. true: go ahead (this transaction now owns the key); false: another
-- delivery already committed this effect, so skip it.
--
-- Guarantees:
--   * Inserts key into idemq.processed (ON CONFLICT DO NOTHING). The row
--     commits or rolls back with the caller's effect, so there is no window
--     in which one exists without the other: N deliveries, one effect.
--   * Usable by any at-least-once consumer (Kafka, SQS, RabbitMQ, Celery...),
--     not only idemq jobs.
--   * task (optional) names the work, so stats() can count guard duplicates per task.
--   * Guard rows live until prune_keys() passes their retention.
-- Concurrency: a concurrent second caller with the same key waits for the
--   first transaction: if it commits, the second gets false; if it rolls back,
--   the second gets true. Under REPEATABLE READ the second raises 40001 instead.
-- Errors: 22004 NULL key; 22023 empty key or empty task (NULL task is fine), a key
--   over key_bytes bytes (idemq._limit; a btree entry cannot hold much more).
-- Tests: test/sql/guard.test.ts, test/sql/stats.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.guard(key text, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF guard.key IS NULL OR guard.key = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN guard.key IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'guard: key must be a non-empty string',
      HINT = 'Use a key that names the effect, e.g. ''credit:order-42''.';
  END IF;
  IF guard.task = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'guard: task must be NULL or a non-empty string',
      HINT = 'Pass the task name (counted per task in stats()), or leave task out.';
  END IF;
  -- _check_key_bytes decides and words the 22023; it is called only for a
  -- key over key_bytes, because the call itself (a PL/pgSQL function pinning
  -- search_path, and its read of the limit) is a tenth of a guard's cost
  -- (measured: bench/FINDINGS.md, "Why the SQL is written as it is").
  -- limits.test.ts holds this test and _check_key_bytes equal at the
  -- boundary.
  IF octet_length(guard.key) > (SELECT l.key_bytes FROM idemq.enqueue_limits l) THEN
    PERFORM idemq._check_key_bytes('guard', guard.key, NULL);
  END IF;
  INSERT INTO idemq.processed AS p (key) VALUES (guard.key)
  ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING;
  IF FOUND THEN
    RETURN true;
  END IF;
  IF guard.task IS NOT NULL THEN
    -- Append-only (see idemq.counters): no row lock held until commit.
    INSERT INTO idemq.counters (task, event, n) VALUES (guard.task, 'guard_duplicate', 1);
  END IF;
  RETURN false;
END;
$$;

COMMENT ON FUNCTION idemq.guard(text, text) IS
  'Insert a guard row in the caller''s transaction: true = do the effect, false = already done by another delivery.';
