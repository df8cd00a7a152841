-- Migration 0026_cheaper_key_check: guard and the effect functions read key_bytes from the kept row idemq.enqueue_limits (0023) and word an error through _check_size only for a key or owner over it, instead of three nested calls that read idemq.settings on every call.
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

-- ---- sql/functions/_check_key_bytes.sql ----
-- idemq._check_key_bytes(operation text, key text, owner text) RETURNS void
--
-- Refuses a guard or effect key, or an effect owner, longer than key_bytes
-- bytes: the one place their HINTs are written. The limit is read from
-- idemq.enqueue_limits, the row kept from idemq.settings (0023), and
-- _check_size, which reads it again through _limit and words the error, is
-- called only for a value over it: the three nested calls on every guard
-- cost about 110,000 instructions, more than guard's own work (callgrind,
-- PostgreSQL 15).
--
-- Guarantees: returns only when key and owner are each NULL (not checked:
--   the caller's NULL check words that error) or at most key_bytes bytes;
--   the key is checked first. Messages name `operation`, the function the
--   user called (_check_size).
-- Concurrency: none.
-- Errors: 22023 key or owner over key_bytes bytes.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_key_bytes(operation text, key text, owner text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_limit bigint;
BEGIN
  SELECT l.key_bytes INTO v_limit FROM idemq.enqueue_limits l;
  IF octet_length(_check_key_bytes.key) > v_limit OR octet_length(_check_key_bytes.owner) > v_limit THEN
    PERFORM idemq._check_size(operation, 'key', _check_key_bytes.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
    PERFORM idemq._check_size(operation, 'owner', _check_key_bytes.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_key_bytes(text, text, text) IS
  'Raise 22023 when a guard or effect key, or an effect owner, is over key_bytes bytes.';

-- Down Migration

-- sql/functions/_check_key_bytes.sql as of 0020_dedupe_checks
-- idemq._check_key_bytes(operation text, key text, owner text) RETURNS void
--
-- Refuses a guard or effect key, or an effect owner, longer than key_bytes
-- bytes (idemq._limit): the one place their HINTs are written.
--
-- Guarantees: returns only when key and owner are each NULL (not checked:
--   the caller's NULL check words that error) or at most key_bytes bytes;
--   the key is checked first. Messages name `operation`, the function the
--   user called (_check_size).
-- Concurrency: none.
-- Errors: 22023 key or owner over key_bytes bytes.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_key_bytes(operation text, key text, owner text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM idemq._check_size(operation, 'key', _check_key_bytes.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  -- guard has no owner: skip the call rather than let _check_size return.
  IF _check_key_bytes.owner IS NOT NULL THEN
    PERFORM idemq._check_size(operation, 'owner', _check_key_bytes.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_key_bytes(text, text, text) IS
  'Raise 22023 when a guard or effect key, or an effect owner, is over key_bytes bytes.';

-- Hand-written reversal of the schema changes above goes here, after the functions.
