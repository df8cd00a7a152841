-- idemq.hold(job_id bigint, attempt int, scope text, until timestamptz, lease_token uuid DEFAULT NULL)
--   RETURNS timestamptz
--
-- Back-pressure from an API (a 429 with Retry-After): the attempt holding
-- the job holds back the job's own queue, task or concurrency key until
-- `until`, and the job goes back to `scheduled` at `until` without spending
-- an attempt.
--
-- Guarantees:
--   * scope 'queue' holds the job's queue, 'task' its task, 'key' its
--     concurrency key (only the scope of a job the caller holds: a worker
--     cannot hold a queue or a key it has no job of).
--   * The job: as snooze(job_id, attempt, until, lease_token) (scheduled at
--     until, no error recorded, the attempt not counted against
--     max_attempts), in the same transaction as the hold.
--   * Queue or task: the scope's idemq.limits row (created when it has
--     none) gets held_until = the later of its hold and until. Every
--     claim() whose transaction starts before held_until and after this
--     commits hands out no job of the scope, from any client (claim's gate
--     treats it as a pause until then); from held_until on, claims take its
--     jobs again within its limits. limits() shows held_until.
--   * Key: the key's idemq.key_holds row gets held_until = the later of its
--     hold and until, and no job of the key runs before it, from any client:
--     the key's admitted jobs not processing (enqueued, scheduled) are
--     scheduled at held_until when they would run sooner, and so is every
--     job of the key written runnable before it (a new enqueue admitted at
--     once, a promotion when another job of the key finishes, a retry or a
--     snooze of a job that was processing: the jobs trigger _count_jobs).
--     Jobs of the key processing run on. Other keys, and the queue and the
--     task, are not held; K (per_key) is unchanged.
--   * until not in the future: the job is snoozed to until and no scope is
--     held (a Retry-After of 0).
--   * Returns the scope's held_until after the call (the later of the two
--     holds), or until when it held nothing.
--   * resume() ends a queue's or task's hold early; clear_limit() keeps it.
--     A row holding nothing but a hold that has passed (limits, key_holds)
--     is deleted by the next hold of any scope (claims and the trigger
--     ignore it meanwhile: no-limit claims stay free).
-- Concurrency: scope 'key' first locks the rows of the key's jobs enqueued
--   or scheduled (in id order, as any other hold of the key), then, as
--   every scope, the job's row, as snooze(); then the key's lock (_key_lock,
--   which every admission and every return from processing of a job of the
--   key takes before it looks for a hold), the key_holds upsert and the
--   move of the key's runnable jobs. A cancel of one of the key's runnable
--   jobs in flight waits for the hold, or the hold for it. Queue and task: an
--   upsert of the scope's limits row (waits only for a set_limit,
--   clear_limit, pause or resume of that scope in flight). Takes no lock a
--   claim waits for (claims skip the locked rows).
-- Errors: IQ404; IQ410 lease lost (fenced like snooze: nothing is held);
--   22004 NULL job_id, attempt, scope or until; 22023 scope not 'queue',
--   'task' or 'key', scope 'key' for a job without a concurrency_key, until
--   infinite or more than duration_days days ahead (idemq._limit).
-- Tests: test/sql/hold.test.ts, test/sql/hold-key.test.ts, test/worker/rate-limited.test.ts
CREATE OR REPLACE FUNCTION idemq.hold(job_id bigint, attempt int, scope text, until timestamptz,
                                      lease_token uuid DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_queue text;
  v_task text;
  v_key text;
  v_held timestamptz;
BEGIN
  IF hold.job_id IS NULL OR hold.attempt IS NULL OR hold.scope IS NULL OR hold.until IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('hold: %s must not be NULL',
                       CASE WHEN hold.job_id IS NULL THEN 'job_id' WHEN hold.attempt IS NULL THEN 'attempt'
                            WHEN hold.scope IS NULL THEN 'scope' ELSE 'until' END),
      HINT = 'Pass the held job''s job_id and attempt (and lease_token), the scope (''queue'', ''task'' or ''key'') and when the API accepts calls again.';
  END IF;
  IF hold.scope NOT IN ('queue', 'task', 'key') THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('hold: scope must be ''queue'', ''task'' or ''key'', not %s', idemq._excerpt(hold.scope)),
      HINT = 'Hold the job''s queue (every task sharing the API), its task, or its concurrency key (one customer''s API key).';
  END IF;
  PERFORM idemq._check_instant('hold', 'until', hold.until);
  IF hold.until > now() + make_interval(days => idemq._limit('duration_days')::int) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('hold: until must be at most %s days ahead (duration_days), not %s',
                       idemq._limit('duration_days'), hold.until),
      HINT = 'A Retry-After that far ahead is likely a parsing error; hold for the API''s real window, or pause() the queue.';
  END IF;
  IF hold.scope = 'key' THEN
    -- The key's runnable jobs, locked before the job's row and the key's
    -- lock, the order a cancel of one of them takes (its row, then the key's
    -- lock in _count_jobs); by id, as another hold of the key locks them.
    -- A job's key never changes, so it is read unlocked.
    PERFORM FROM idemq.jobs k
    WHERE k.concurrency_key = (SELECT h.concurrency_key FROM idemq.jobs h WHERE h.id = hold.job_id)
      AND k.state IN ('enqueued', 'scheduled')
    ORDER BY k.id
    FOR UPDATE;
  END IF;
  UPDATE idemq.jobs AS j
  SET state = 'scheduled', run_at = hold.until, uncounted = j.uncounted + 1,
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = hold.job_id AND j.attempt = hold.attempt
    AND j.lease_token IS NOT DISTINCT FROM hold.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.queue, j.task, j.concurrency_key INTO v_queue, v_task, v_key;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(hold.job_id, hold.attempt, 'hold');
  END IF;
  IF hold.scope = 'key' AND v_key IS NULL THEN
    -- Raised after the fence (a stale attempt gets IQ410 first); the snooze
    -- above rolls back with the error.
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('hold: job %s has no concurrency_key, so scope ''key'' has nothing to hold', hold.job_id),
      HINT = 'Enqueue the job with a concurrency_key (concurrencyKey) to hold one key, or hold its ''queue'' or ''task''.';
  END IF;
  IF hold.until <= now() THEN
    PERFORM idemq._notify_waiting(v_queue);
    RETURN hold.until;
  END IF;
  -- Rows that held nothing but a hold now past (claim and the jobs trigger
  -- ignore them; this keeps limits as small as the limits set, and
  -- key_holds as small as the keys held now).
  DELETE FROM idemq.limits l
  WHERE l.held_until <= now() AND NOT l.paused
    AND l.concurrency IS NULL AND l.rate IS NULL AND l.per_key IS NULL;
  DELETE FROM idemq.key_holds h WHERE h.held_until <= now();
  IF hold.scope = 'key' THEN
    -- Under the key's lock (the job's UPDATE above took it already, in
    -- _count_jobs): an admission or a retry of the key in flight commits
    -- first and is moved below, or comes after and sees the hold.
    PERFORM idemq._key_lock(ARRAY[v_key]);
    INSERT INTO idemq.key_holds AS h (concurrency_key, held_until)
    VALUES (v_key, hold.until)
    ON CONFLICT (concurrency_key) DO UPDATE SET held_until = greatest(h.held_until, hold.until)
    RETURNING h.held_until INTO v_held;
    UPDATE idemq.jobs AS j SET run_at = v_held, state = 'scheduled'
    WHERE j.concurrency_key = v_key AND j.state IN ('enqueued', 'scheduled') AND j.run_at < v_held;
    RETURN v_held;
  END IF;
  INSERT INTO idemq.limits AS l (kind, name, held_until)
  VALUES (hold.scope, CASE WHEN hold.scope = 'queue' THEN v_queue ELSE v_task END, hold.until)
  ON CONFLICT ON CONSTRAINT limits_scope DO UPDATE
    SET held_until = greatest(l.held_until, hold.until), updated_at = now()
  RETURNING l.held_until INTO v_held;
  RETURN v_held;
END;
$$;

COMMENT ON FUNCTION idemq.hold(bigint, int, text, timestamptz, uuid) IS
  'Back-pressure (a 429): snooze the held job to until without spending an attempt, and hold back its queue, task or concurrency key from every claim until then.';
