-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes',
--                    job_id bigint DEFAULT NULL, attempt int DEFAULT NULL,
--                    lease_token uuid DEFAULT NULL)
--   RETURNS TABLE(status text, result jsonb)
--
-- The claim-first record for an effect outside the database (an email, a
-- charge, a webhook). Call it in its own transaction (autocommit) before the
-- external call, then effect_done() or effect_release().
--
-- Guarantees: status is one of
--   claimed   no record existed: this owner may make the call;
--   reclaimed an earlier claim is older than stale_after (its owner likely
--             died, perhaps after the call), or was made by an earlier
--             attempt of the caller's own job (job_id, attempt and
--             lease_token given, and the caller holds that attempt with that
--             token, as complete() would check: the earlier one is fenced
--             out, so there is no need to wait out stale_after): check with
--             the external system first, or resend with the same
--             idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
--   The job binding needs the lease token: a worker that names another
--   worker's job and guesses its attempt cannot take over that job's fresh
--   claims (it gets `busy`). A NULL lease_token binds only to a job claimed
--   without one (before 0.2.0).
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at (or on the claim's job and attempt),
--   re-checked after a concurrent reclaimer commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner, key or owner over key_bytes
--   bytes (idemq._limit), stale_after <= 0 or over duration_days, only one
--   of job_id and attempt given, or lease_token given without them.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(
  key text,
  owner text,
  stale_after interval DEFAULT '10 minutes',
  job_id bigint DEFAULT NULL,
  attempt int DEFAULT NULL,
  lease_token uuid DEFAULT NULL)
RETURNS TABLE(status text, result jsonb)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_round int := 0;
  v_row record;
BEGIN
  IF effect_claim.key IS NULL OR effect_claim.owner IS NULL OR effect_claim.stale_after IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'effect_claim: key, owner and stale_after must not be NULL',
      HINT = 'key names the effect (e.g. ''invoice-email:42''), owner names this attempt (e.g. ''job:7:2'').';
  END IF;
  IF effect_claim.key = '' OR effect_claim.owner = '' OR effect_claim.stale_after <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: key and owner must be non-empty and stale_after positive',
      HINT = 'stale_after should exceed the longest the external call can take.';
  END IF;
  IF (effect_claim.job_id IS NULL) <> (effect_claim.attempt IS NULL)
     OR (effect_claim.lease_token IS NOT NULL AND effect_claim.job_id IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: job_id, attempt and lease_token go together',
      HINT = 'Pass all three (the job, attempt and lease token this claim is made for, as claim() returned them) or none.';
  END IF;
  PERFORM idemq._check_key_bytes('effect_claim', effect_claim.key, effect_claim.owner);
  PERFORM idemq._check_duration('effect_claim', 'stale_after', effect_claim.stale_after);

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at, job_id, attempt)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp(), effect_claim.job_id, effect_claim.attempt)
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    -- Stale, or left by an earlier attempt of the job the caller holds now
    -- (fencing: that attempt can no longer finish, so its claim is dead).
    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1,
        job_id = effect_claim.job_id, attempt = effect_claim.attempt
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND (e.claimed_at < clock_timestamp() - effect_claim.stale_after
           OR (e.job_id = effect_claim.job_id AND e.attempt < effect_claim.attempt
               AND EXISTS (SELECT 1 FROM idemq.jobs j
                           WHERE j.id = effect_claim.job_id AND j.attempt = effect_claim.attempt
                             AND j.lease_token IS NOT DISTINCT FROM effect_claim.lease_token
                             AND idemq._held(j.lease_expires_at, j.locked_by))));
    IF FOUND THEN
      status := 'reclaimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    SELECT e.status, e.result INTO v_row FROM idemq.effects e WHERE e.key = effect_claim.key;
    IF FOUND THEN
      status := CASE WHEN v_row.status = 'done' THEN 'done' ELSE 'busy' END;
      result := v_row.result;
      RETURN NEXT; RETURN;
    END IF;
    -- released between our statements: claim again
    IF v_round >= 10 THEN
      status := 'busy'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval, bigint, int, uuid) IS
  'Claim-first record for an external effect: claimed | reclaimed (stale) | done (with result) | busy.';
