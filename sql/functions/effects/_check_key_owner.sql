-- idemq._check_key_owner(operation text, key text, owner text) RETURNS void
--
-- Refuses the key and owner of effect_done or effect_release unless both are
-- non-empty strings of at most key_bytes bytes: the claim they name is
-- effect_claim's, made with the same key and owner.
--
-- Guarantees: returns only for a key and an owner that effect_claim accepts
--   (sizes: _check_key_bytes). Messages name `operation`, the function the
--   user called.
-- Concurrency: none.
-- Errors: 22004 key or owner NULL; 22023 key or owner empty, or over
--   key_bytes bytes.
-- Tests: test/sql/bad-input.test.ts, test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_key_owner(operation text, key text, owner text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_key_owner.key IS NULL OR _check_key_owner.owner IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: key and owner must not be NULL', operation),
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  IF _check_key_owner.key = '' OR _check_key_owner.owner = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: key and owner must be non-empty', operation),
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  PERFORM idemq._check_key_bytes(operation, _check_key_owner.key, _check_key_owner.owner);
END;
$$;

COMMENT ON FUNCTION idemq._check_key_owner(text, text, text) IS
  'Raise 22004/22023 unless the key and owner of effect_done or effect_release are non-empty and within key_bytes.';
