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
