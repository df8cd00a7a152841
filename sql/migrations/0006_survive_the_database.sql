-- Migration 0006_survive_the_database (issue 12): a rescued job keeps its run_at (its place in line); effect_claim takes the job attempt it is made for, so the job's next attempt reclaims at once a claim its fenced-out predecessor left; fail(counted => false) records an error without spending the attempt or a backoff (a hand-back at shutdown).
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

ALTER TABLE idemq.effects
  ADD COLUMN job_id bigint,
  ADD COLUMN attempt int,
  ADD CONSTRAINT effects_job_and_attempt_together CHECK ((job_id IS NULL) = (attempt IS NULL));

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.effect_claim;
-- ---- sql/functions/effect_claim.sql ----
-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes',
--                    job_id bigint DEFAULT NULL, attempt int DEFAULT NULL)
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
--             attempt of the caller's own job (job_id, attempt given and the
--             caller holds that attempt: the earlier one is fenced out, so
--             there is no need to wait out stale_after): check with the
--             external system first, or resend with the same idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at (or on the claim's job and attempt),
--   re-checked after a concurrent reclaimer commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner, stale_after <= 0, or
--   only one of job_id and attempt given.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(
  key text,
  owner text,
  stale_after interval DEFAULT '10 minutes',
  job_id bigint DEFAULT NULL,
  attempt int DEFAULT NULL)
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
  IF (effect_claim.job_id IS NULL) <> (effect_claim.attempt IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: job_id and attempt go together',
      HINT = 'Pass both (the job and attempt this claim is made for, as claim() returned them) or neither.';
  END IF;

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

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval, bigint, int) IS
  'Claim-first record for an external effect: claimed | reclaimed (stale) | done (with result) | busy.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.fail;
-- ---- sql/functions/fail.sql ----
-- idemq.fail(job_id bigint, attempt int, error jsonb, retryable boolean DEFAULT true,
--   retry_at timestamptz DEFAULT NULL, backoff jsonb DEFAULT NULL,
--   max_attempts int DEFAULT NULL, counted boolean DEFAULT true)
--   RETURNS TABLE(state idemq.job_state, run_at timestamptz)
--
-- Records a failed attempt; schedules a retry or fails the job for good.
-- Returns one row: the job's new state and the run_at of its retry (NULL
-- when it failed), exactly as stored.
--
-- Guarantees:
--   * Appends to errors one entry: the fields of `error` (by convention
--     class and message; a JSON string is taken as the message, with
--     class "Error"), with
--     attempt, started_at (the claim), failed_at and worker set by fail()
--     over any fields of the same names.
--   * The job goes to `scheduled` at retry_at, or after the job's backoff
--     (_backoff_delay with the number of counted attempts so far, 1 for the
--     first failure); or to `failed` when the error is not retryable or the
--     counted attempts reached max_attempts. Snoozes do not count.
--   * backoff and max_attempts override the job's for this decision (a
--     worker's task settings): the delay is _backoff_delay(backoff, counted
--     attempts) on the database clock, and the job fails once the counted
--     attempts reach the lower of the two limits.
--   * counted = false records the error without spending the attempt (a
--     worker handing a job back at shutdown: the attempt was cut short, it
--     did not fail): it does not count against max_attempts, like a snooze,
--     and the retry runs at retry_at or at once, with no backoff.
--   * A retry already due (retry_at not in the future) NOTIFYs idemq_jobs
--     when a listener waits (_notify_waiting).
--   * Fenced like complete(): a stale attempt changes nothing.
--   * The returned run_at is the one source of the retry time: a worker reports
--     it instead of computing the backoff again.
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id/attempt/error/retryable/counted;
--   22023 error is not a JSON object or string, a malformed backoff,
--   max_attempts < 1.
-- Tests: test/sql/fail.test.ts, test/sql/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq.fail(
  job_id bigint,
  attempt int,
  error jsonb,
  retryable boolean DEFAULT true,
  retry_at timestamptz DEFAULT NULL,
  backoff jsonb DEFAULT NULL,
  max_attempts int DEFAULT NULL,
  counted boolean DEFAULT true)
RETURNS TABLE(state idemq.job_state, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No "#variable_conflict error" line: the parameter named "error" (fixed by
-- the contract) would be read there as the variable; nor SET
-- plpgsql.variable_conflict, which only a superuser may set (it kept anyone
-- else from installing idemq). Every name in the body is qualified, so it
-- means the same under any setting (the default is error).
AS $$
DECLARE
  v_error jsonb;
  v_job record;
  v_state idemq.job_state;
  v_due record;
  v_problem text;
BEGIN
  IF fail.error IS NULL OR fail.retryable IS NULL OR fail.counted IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'fail: error, retryable and counted must not be NULL',
      HINT = 'Pass the error as {"class": "TimeoutError", "message": "..."}.';
  END IF;
  v_error := CASE jsonb_typeof(fail.error)
    WHEN 'object' THEN fail.error
    WHEN 'string' THEN jsonb_build_object('class', 'Error', 'message', fail.error #>> '{}')
  END;
  IF v_error IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: error must be a JSON object or string, not %s', fail.error),
      HINT = 'Pass {"class": "TimeoutError", "message": "...", "stack": "..."}.';
  END IF;
  v_problem := idemq._backoff_problem(fail.backoff);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: %s', v_problem),
      HINT = 'Pass NULL to use the job''s own backoff.';
  END IF;
  IF fail.max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: max_attempts must be NULL or >= 1, not %s', fail.max_attempts),
      HINT = 'Pass NULL to use the job''s own max_attempts.';
  END IF;

  SELECT j.attempt, j.uncounted, j.max_attempts, j.backoff INTO v_job
  FROM idemq.jobs j
  WHERE j.id = fail.job_id AND j.attempt = fail.attempt AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(fail.job_id, fail.attempt, 'fail');
  END IF;
  v_state := CASE WHEN NOT fail.retryable THEN 'failed'
                  WHEN NOT fail.counted THEN 'scheduled'
                  WHEN v_job.attempt - v_job.uncounted >= least(v_job.max_attempts, fail.max_attempts) THEN 'failed'
                  ELSE 'scheduled' END;

  UPDATE idemq.jobs AS j
  SET state = v_state,
      run_at = CASE WHEN v_state <> 'scheduled' THEN j.run_at
                    WHEN NOT fail.counted THEN coalesce(fail.retry_at, now())
                    ELSE coalesce(fail.retry_at, now() + idemq._backoff_delay(coalesce(nullif(fail.backoff, 'null'), v_job.backoff),
                                                                  v_job.attempt - v_job.uncounted)) END,
      uncounted = j.uncounted + CASE WHEN fail.counted THEN 0 ELSE 1 END,
      finished_at = CASE WHEN v_state = 'failed' THEN now() END,
      errors = j.errors || jsonb_build_array(v_error || jsonb_build_object(
        'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by)),
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = fail.job_id
  RETURNING j.run_at, j.queue INTO v_due;
  -- A retry due at once (retry_at in the past, a zero delay) must not wait
  -- for a worker's fallback poll.
  IF v_state = 'scheduled' AND v_due.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_due.queue);
  END IF;
  state := v_state;
  run_at := CASE WHEN v_state = 'scheduled' THEN v_due.run_at END;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int, boolean) IS
  'Record a failed attempt; scheduled for a retry by backoff (or retry_at), or failed when not retryable or out of attempts.';

-- ---- sql/functions/rescue.sql ----
-- idemq.rescue() RETURNS int
--
-- Takes jobs away from workers whose lease ran out, and expires jobs past
-- their deadline. Returns how many jobs it changed.
--
-- Guarantees:
--   * A job in processing whose lease_expires_at has passed (a crashed or
--     partitioned worker) goes back to enqueued, runnable now, or to failed
--     when that was its last counted attempt, or to expired when it is past
--     its expires_at (it could never be claimed again). It keeps its run_at,
--     so it is claimed ahead of the jobs that became due after it. Its errors record
--     {"class": "LeaseExpired", "message": "lease expired", ...}, and the next
--     claim reports reclaimed = true. The old attempt is fenced out from then on.
--   * Every active job that is not processing and is past its expires_at
--     (never started, or a retry waiting past its deadline) becomes expired.
--   * Each job changed counts once in the result.
--   * Idempotent: any number of workers, or pg_cron, may call it at any time;
--     no leader is needed. Waiting workers are notified (_notify_waiting)
--     of jobs it put back to enqueued.
-- Concurrency: FOR UPDATE SKIP LOCKED: rows another transaction holds (a
--   completing worker, a concurrent rescue) are left for the next call.
-- Errors: none.
-- Tests: test/sql/rescue.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.rescue()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_rescued int;
  v_expired int;
  v_queues text[];
BEGIN
  WITH lost AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.state = 'processing' AND j.lease_expires_at < now()
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), moved AS (
    UPDATE idemq.jobs AS j
    -- Straight to expired rather than enqueued-then-expired below, so the
    -- job counts once and no worker is woken for it.
    SET state = CASE WHEN j.attempt - j.uncounted >= j.max_attempts THEN 'failed'
                     WHEN j.expires_at <= now() THEN 'expired'
                     ELSE 'enqueued' END::idemq.job_state,
        finished_at = CASE WHEN j.attempt - j.uncounted >= j.max_attempts OR j.expires_at <= now()
                           THEN now() END,
        -- run_at stays: the job was due before the backlog behind it, and
        -- keeps its place in line (claim orders by priority, run_at, id).
        lease_lost = true,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by,
          'class', 'LeaseExpired',
          'message', format('lease expired at %s while %s held the job', j.lease_expires_at, j.locked_by))),
        locked_by = NULL, lease_expires_at = NULL
    FROM lost l
    WHERE j.id = l.id
    RETURNING j.queue, j.state
  )
  SELECT count(*), array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued')
  INTO v_rescued, v_queues
  FROM moved m;
  PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;

  WITH late AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.expires_at <= now() AND j.state IN ('enqueued', 'scheduled', 'awaiting')
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), expired AS (
    UPDATE idemq.jobs AS j
    SET state = 'expired', finished_at = now()
    FROM late l
    WHERE j.id = l.id
    RETURNING j.id
  )
  SELECT count(*) INTO v_expired FROM expired;

  RETURN v_rescued + v_expired;
END;
$$;

COMMENT ON FUNCTION idemq.rescue() IS
  'Return jobs with expired leases to enqueued (or failed on their last attempt) and expire jobs past expires_at.';

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.effect_claim;
-- sql/functions/effect_claim.sql as of 0005_least_privilege
-- idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes')
--   RETURNS TABLE(status text, result jsonb)
--
-- The claim-first record for an effect outside the database (an email, a
-- charge, a webhook). Call it in its own transaction (autocommit) before the
-- external call, then effect_done() or effect_release().
--
-- Guarantees: status is one of
--   claimed   no record existed: this owner may make the call;
--   reclaimed an earlier claim is older than stale_after (its owner likely
--             died, perhaps after the call): check with the external system
--             first, or resend with the same idempotency key;
--   done      the effect was recorded; result holds what the call returned;
--   busy      a fresh claim is held by someone (this owner included): retry
--             later, never skip.
--   Of several concurrent reclaimers of one stale claim exactly one gets
--   `reclaimed`; the others get `busy`.
-- Concurrency: the primary key serialises first claims; the reclaim is an
--   UPDATE conditioned on claimed_at, re-checked after a concurrent reclaimer
--   commits, so only one wins.
-- Errors: 22004 NULL argument; 22023 empty key/owner or stale_after <= 0.
-- Tests: test/sql/effects.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.effect_claim(key text, owner text, stale_after interval DEFAULT '10 minutes')
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

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp())
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND e.claimed_at < clock_timestamp() - effect_claim.stale_after;
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

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval) IS
  'Claim-first record for an external effect: claimed | reclaimed (stale) | done (with result) | busy.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.fail;
-- sql/functions/fail.sql as of 0005_least_privilege
-- idemq.fail(job_id bigint, attempt int, error jsonb, retryable boolean DEFAULT true,
--   retry_at timestamptz DEFAULT NULL, backoff jsonb DEFAULT NULL,
--   max_attempts int DEFAULT NULL) RETURNS TABLE(state idemq.job_state, run_at timestamptz)
--
-- Records a failed attempt; schedules a retry or fails the job for good.
-- Returns one row: the job's new state and the run_at of its retry (NULL
-- when it failed), exactly as stored.
--
-- Guarantees:
--   * Appends to errors one entry: the fields of `error` (by convention
--     class and message; a JSON string is taken as the message, with
--     class "Error"), with
--     attempt, started_at (the claim), failed_at and worker set by fail()
--     over any fields of the same names.
--   * The job goes to `scheduled` at retry_at, or after the job's backoff
--     (_backoff_delay with the number of counted attempts so far, 1 for the
--     first failure); or to `failed` when the error is not retryable or the
--     counted attempts reached max_attempts. Snoozes do not count.
--   * backoff and max_attempts override the job's for this decision (a
--     worker's task settings): the delay is _backoff_delay(backoff, counted
--     attempts) on the database clock, and the job fails once the counted
--     attempts reach the lower of the two limits.
--   * A retry already due (retry_at not in the future) NOTIFYs idemq_jobs
--     when a listener waits (_notify_waiting).
--   * Fenced like complete(): a stale attempt changes nothing.
--   * The returned run_at is the one source of the retry time: a worker reports
--     it instead of computing the backoff again.
-- Concurrency: row lock on the job, as complete().
-- Errors: IQ404; IQ410 lease lost; 22004 NULL job_id/attempt/error/retryable;
--   22023 error is not a JSON object or string, a malformed backoff,
--   max_attempts < 1.
-- Tests: test/sql/fail.test.ts, test/sql/backoff.test.ts
CREATE OR REPLACE FUNCTION idemq.fail(
  job_id bigint,
  attempt int,
  error jsonb,
  retryable boolean DEFAULT true,
  retry_at timestamptz DEFAULT NULL,
  backoff jsonb DEFAULT NULL,
  max_attempts int DEFAULT NULL)
RETURNS TABLE(state idemq.job_state, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No "#variable_conflict error" line: the parameter named "error" (fixed by
-- the contract) would be read there as the variable; nor SET
-- plpgsql.variable_conflict, which only a superuser may set (it kept anyone
-- else from installing idemq). Every name in the body is qualified, so it
-- means the same under any setting (the default is error).
AS $$
DECLARE
  v_error jsonb;
  v_job record;
  v_state idemq.job_state;
  v_due record;
  v_problem text;
BEGIN
  IF fail.error IS NULL OR fail.retryable IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'fail: error and retryable must not be NULL',
      HINT = 'Pass the error as {"class": "TimeoutError", "message": "..."}.';
  END IF;
  v_error := CASE jsonb_typeof(fail.error)
    WHEN 'object' THEN fail.error
    WHEN 'string' THEN jsonb_build_object('class', 'Error', 'message', fail.error #>> '{}')
  END;
  IF v_error IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: error must be a JSON object or string, not %s', fail.error),
      HINT = 'Pass {"class": "TimeoutError", "message": "...", "stack": "..."}.';
  END IF;
  v_problem := idemq._backoff_problem(fail.backoff);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: %s', v_problem),
      HINT = 'Pass NULL to use the job''s own backoff.';
  END IF;
  IF fail.max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: max_attempts must be NULL or >= 1, not %s', fail.max_attempts),
      HINT = 'Pass NULL to use the job''s own max_attempts.';
  END IF;

  SELECT j.attempt, j.uncounted, j.max_attempts, j.backoff INTO v_job
  FROM idemq.jobs j
  WHERE j.id = fail.job_id AND j.attempt = fail.attempt AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(fail.job_id, fail.attempt, 'fail');
  END IF;
  v_state := CASE WHEN NOT fail.retryable
                    OR v_job.attempt - v_job.uncounted >= least(v_job.max_attempts, fail.max_attempts)
                  THEN 'failed' ELSE 'scheduled' END;

  UPDATE idemq.jobs AS j
  SET state = v_state,
      run_at = CASE WHEN v_state = 'scheduled'
                    THEN coalesce(fail.retry_at, now() + idemq._backoff_delay(coalesce(nullif(fail.backoff, 'null'), v_job.backoff),
                                                                  v_job.attempt - v_job.uncounted))
                    ELSE j.run_at END,
      finished_at = CASE WHEN v_state = 'failed' THEN now() END,
      errors = j.errors || jsonb_build_array(v_error || jsonb_build_object(
        'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by)),
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = fail.job_id
  RETURNING j.run_at, j.queue INTO v_due;
  -- A retry due at once (retry_at in the past, a zero delay) must not wait
  -- for a worker's fallback poll.
  IF v_state = 'scheduled' AND v_due.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_due.queue);
  END IF;
  state := v_state;
  run_at := CASE WHEN v_state = 'scheduled' THEN v_due.run_at END;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int) IS
  'Record a failed attempt; scheduled for a retry by backoff (or retry_at), or failed when not retryable or out of attempts.';

-- sql/functions/rescue.sql as of 0005_least_privilege
-- idemq.rescue() RETURNS int
--
-- Takes jobs away from workers whose lease ran out, and expires jobs past
-- their deadline. Returns how many jobs it changed.
--
-- Guarantees:
--   * A job in processing whose lease_expires_at has passed (a crashed or
--     partitioned worker) goes back to enqueued, runnable now, or to failed
--     when that was its last counted attempt, or to expired when it is past
--     its expires_at (it could never be claimed again). Its errors record
--     {"class": "LeaseExpired", "message": "lease expired", ...}, and the next
--     claim reports reclaimed = true. The old attempt is fenced out from then on.
--   * Every active job that is not processing and is past its expires_at
--     (never started, or a retry waiting past its deadline) becomes expired.
--   * Each job changed counts once in the result.
--   * Idempotent: any number of workers, or pg_cron, may call it at any time;
--     no leader is needed. Waiting workers are notified (_notify_waiting)
--     of jobs it put back to enqueued.
-- Concurrency: FOR UPDATE SKIP LOCKED: rows another transaction holds (a
--   completing worker, a concurrent rescue) are left for the next call.
-- Errors: none.
-- Tests: test/sql/rescue.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.rescue()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_rescued int;
  v_expired int;
  v_queues text[];
BEGIN
  WITH lost AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.state = 'processing' AND j.lease_expires_at < now()
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), moved AS (
    UPDATE idemq.jobs AS j
    -- Straight to expired rather than enqueued-then-expired below, so the
    -- job counts once and no worker is woken for it.
    SET state = CASE WHEN j.attempt - j.uncounted >= j.max_attempts THEN 'failed'
                     WHEN j.expires_at <= now() THEN 'expired'
                     ELSE 'enqueued' END::idemq.job_state,
        finished_at = CASE WHEN j.attempt - j.uncounted >= j.max_attempts OR j.expires_at <= now()
                           THEN now() END,
        run_at = now(),
        lease_lost = true,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by,
          'class', 'LeaseExpired',
          'message', format('lease expired at %s while %s held the job', j.lease_expires_at, j.locked_by))),
        locked_by = NULL, lease_expires_at = NULL
    FROM lost l
    WHERE j.id = l.id
    RETURNING j.queue, j.state
  )
  SELECT count(*), array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued')
  INTO v_rescued, v_queues
  FROM moved m;
  PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;

  WITH late AS MATERIALIZED (
    SELECT j.id
    FROM idemq.jobs j
    WHERE j.expires_at <= now() AND j.state IN ('enqueued', 'scheduled', 'awaiting')
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
  ), expired AS (
    UPDATE idemq.jobs AS j
    SET state = 'expired', finished_at = now()
    FROM late l
    WHERE j.id = l.id
    RETURNING j.id
  )
  SELECT count(*) INTO v_expired FROM expired;

  RETURN v_rescued + v_expired;
END;
$$;

COMMENT ON FUNCTION idemq.rescue() IS
  'Return jobs with expired leases to enqueued (or failed on their last attempt) and expire jobs past expires_at.';

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Hand-written reversal of the schema changes above goes here, after the functions.

ALTER TABLE idemq.effects
  DROP CONSTRAINT effects_job_and_attempt_together,
  DROP COLUMN job_id,
  DROP COLUMN attempt;
