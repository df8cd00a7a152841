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
  PERFORM idemq._check_key_owner('effect_done', effect_done.key, effect_done.owner);
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
  PERFORM idemq._raise_not_owner('effect_done', effect_done.key, effect_done.owner,
    'Another owner reclaimed it after it went stale: raise stale_after above the longest call.');
END;
$$;

COMMENT ON FUNCTION idemq.effect_done(text, text, jsonb) IS
  'Record that the claimed external effect happened (with its result); IQ410 if the claim is not this owner''s.';
