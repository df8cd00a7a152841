-- idemq.effect_release(key text, owner text) RETURNS void
--
-- Gives up a claim: the external call definitely did not happen, so a new
-- claim may make it.
--
-- Guarantees: deletes the claim record; the next effect_claim answers `claimed`.
-- Concurrency: row lock on the record.
-- Errors: IQ410 the claim is not this owner's (or does not exist; DETAIL
--   {"key","owner"}); IQ412 the effect is already done (it cannot be undone
--   by releasing; DETAIL {"key","status"}); 22004 NULL key/owner; 22023 empty key/owner,
--   key or owner over key_bytes bytes (idemq._limit).
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_release(key text, owner text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM idemq._check_key_owner('effect_release', effect_release.key, effect_release.owner);
  DELETE FROM idemq.effects AS e
  WHERE e.key = effect_release.key AND e.owner = effect_release.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM idemq.effects e WHERE e.key = effect_release.key AND e.status = 'done') THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('effect_release: effect "%s" is already done and cannot be released', idemq._excerpt(effect_release.key)),
      DETAIL = jsonb_build_object('key', effect_release.key, 'status', 'done')::text,
      HINT = 'A done effect happened; do not retry it.';
  END IF;
  PERFORM idemq._raise_not_owner('effect_release', effect_release.key, effect_release.owner,
    'Another owner reclaimed it after it went stale; leave it to them.');
END;
$$;

COMMENT ON FUNCTION idemq.effect_release(text, text) IS
  'Give up a claim whose external call did not happen; IQ410 if not this owner''s.';
