-- idemq._raise_not_owner(operation text, key text, owner text, hint text) RETURNS void
--
-- Raises IQ410 after effect_done or effect_release (`operation`) found no
-- claim on effect `key` held by `owner`.
--
-- Guarantees: always raises; the one wording of the error and of its DETAIL
--   ({"key","owner"}, in full; the message quotes excerpts). `hint` says
--   what the caller should do, which differs between the two.
-- Concurrency: none (reads nothing).
-- Errors: IQ410 with DETAIL {"key","owner"}.
-- Tests: test/sql/effects.test.ts
CREATE OR REPLACE FUNCTION idemq._raise_not_owner(operation text, key text, owner text, hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('%s: the claim on effect "%s" is not held by %s',
                     operation, idemq._excerpt(_raise_not_owner.key), idemq._excerpt(_raise_not_owner.owner)),
    DETAIL = jsonb_build_object('key', _raise_not_owner.key, 'owner', _raise_not_owner.owner)::text,
    HINT = hint;
END;
$$;

COMMENT ON FUNCTION idemq._raise_not_owner(text, text, text, text) IS
  'Raise IQ410 (DETAIL {"key","owner"}) for an effect claim that this owner does not hold.';
