-- Migration 0030_cheaper_guard: guard() reads key_bytes itself and calls _check_key_bytes (which decides and words the 22023) only for a key over it: 226k -> 200k instructions a guard, each its own transaction (callgrind, PostgreSQL 15; d7f4125: 166k).
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ (npm run migration:check compares them). Once released (listed
-- in sql/released.sha256) this file never changes again.
-- Up Migration

-- Hand-written schema changes (tables, columns, indexes) go here, before the
-- functions that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes
-- in a migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration commits
-- on its own, so the next migration can use it.

-- ---- sql/functions/guard.sql ----
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
  -- _check_key_bytes decides and words the 22023; called only for a key
  -- over key_bytes, since the call itself (a PL/pgSQL function pinning
  -- search_path, and its read of the limit) cost a guard 26k of its 226k
  -- instructions (callgrind, PostgreSQL 15, each guard its own
  -- transaction). The call, not its body, is the cost: as a SQL-language
  -- function _check_key_bytes made a guard cost 404k. limits.test.ts holds
  -- this test and _check_key_bytes equal at the boundary.
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

-- Down Migration

-- sql/functions/guard.sql as of 0020_dedupe_checks
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
  PERFORM idemq._check_key_bytes('guard', guard.key, NULL);
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

-- Hand-written reversal of the schema changes above goes here, after the functions.
