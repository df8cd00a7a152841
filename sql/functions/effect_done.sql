-- idemq.effect_done(key text, owner text, result jsonb) RETURNS void
--
-- Records that the claimed external effect happened, with what it returned.
--
-- Guarantees: afterwards effect_claim(key, ...) answers `done` with this
--   result, forever (until prune_keys passes its retention). Repeating the
--   call by the same owner is a no-op.
-- Concurrency: row lock on the record.
-- Errors: IQ410 the claim is not this owner's (reclaimed by another, or
--   never claimed; DETAIL {"key","owner"}); 22004 NULL key/owner; 22023 empty key/owner,
--   key or owner over key_bytes bytes (idemq._limit).
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_done(key text, owner text, result jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_owner text;
BEGIN
  IF effect_done.key IS NULL OR effect_done.owner IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'effect_done: key and owner must not be NULL',
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  IF effect_done.key = '' OR effect_done.owner = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_done: key and owner must be non-empty',
      HINT = 'Pass the key and owner given to effect_claim().';
  END IF;
  PERFORM idemq._check_size('effect_done', 'key', effect_done.key, 'key_bytes', 'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''credit:'' || md5(...).');
  PERFORM idemq._check_size('effect_done', 'owner', effect_done.owner, 'key_bytes', 'Owners are at most key_bytes bytes (idemq.settings): name the attempt, e.g. ''job:7:2@host:pid''.');
  UPDATE idemq.effects AS e
  SET status = 'done', done_at = now(), result = effect_done.result
  WHERE e.key = effect_done.key AND e.owner = effect_done.owner AND e.status = 'claimed';
  IF FOUND THEN
    RETURN;
  END IF;
  SELECT e.owner INTO v_owner FROM idemq.effects e
  WHERE e.key = effect_done.key AND e.status = 'done';
  IF v_owner IS NOT DISTINCT FROM effect_done.owner AND v_owner IS NOT NULL THEN
    RETURN;
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('effect_done: the claim on effect "%s" is not held by %s',
                   idemq._excerpt(effect_done.key), idemq._excerpt(effect_done.owner)),
    DETAIL = jsonb_build_object('key', effect_done.key, 'owner', effect_done.owner)::text,
    HINT = 'Another owner reclaimed it after it went stale: raise stale_after above the longest call.';
END;
$$;

COMMENT ON FUNCTION idemq.effect_done(text, text, jsonb) IS
  'Record that the claimed external effect happened (with its result); IQ410 if the claim is not this owner''s.';
