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
  IF effect_release.key IS NULL OR effect_release.owner IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'effect_release: key and owner must not be NULL',
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  IF effect_release.key = '' OR effect_release.owner = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_release: key and owner must be non-empty',
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  PERFORM idemq._check_size('effect_release', 'key', effect_release.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  PERFORM idemq._check_size('effect_release', 'owner', effect_release.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
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
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('effect_release: the claim on effect "%s" is not held by %s',
                   idemq._excerpt(effect_release.key), idemq._excerpt(effect_release.owner)),
    DETAIL = jsonb_build_object('key', effect_release.key, 'owner', effect_release.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale; leave it to them.';
END;
$$;

COMMENT ON FUNCTION idemq.effect_release(text, text) IS
  'Give up a claim whose external call did not happen; IQ410 if not this owner''s.';
