-- idemq._check_key_bytes(operation text, key text, owner text) RETURNS void
--
-- Refuses a guard or effect key, or an effect owner, longer than key_bytes
-- bytes: the one place their HINTs are written. The limit is read from
-- idemq.enqueue_limits, the row kept from idemq.settings (0023), and
-- _check_size, which reads it again through _limit and words the error, is
-- called only for a value over it: three nested calls on every guard cost
-- more than guard's own work (measured: bench/FINDINGS.md, "Why the SQL is
-- written as it is").
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
