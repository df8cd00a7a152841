-- idemq.hold(job_id bigint, attempt int, scope text, until timestamptz, lease_token uuid DEFAULT NULL)
--   RETURNS timestamptz
--
-- Back-pressure from an API (a 429 with Retry-After): the attempt holding
-- the job holds back the job's own queue or task until `until`, and the
-- job goes back to `scheduled` at `until` without spending an attempt.
--
-- Guarantees:
--   * scope 'queue' holds the job's queue, 'task' its task (only the scope
--     of a job the caller holds: a worker cannot hold a queue it has no job
--     of).
--   * The job: as snooze(job_id, attempt, until, lease_token) (scheduled at
--     until, no error recorded, the attempt not counted against
--     max_attempts), in the same transaction as the hold.
--   * The hold: the scope's idemq.limits row (created when it has none) gets
--     held_until = the later of its hold and until. Every claim() whose
--     transaction starts before held_until and after this commits hands out
--     no job of the scope, from any client (claim's gate treats it as a
--     pause until then); from held_until on, claims take its jobs again
--     within its limits. limits() shows held_until.
--   * until not in the future: the job is snoozed to until and no scope is
--     held (a Retry-After of 0).
--   * Returns the scope's held_until after the call (the later of the two
--     holds), or until when it held nothing.
--   * resume() ends a hold early; clear_limit() keeps it. A row holding
--     nothing but a hold that has passed is deleted by the next hold of any
--     scope (claims ignore it meanwhile: no-limit claims stay free).
--   * Per concurrency key: not yet (the key scope comes with concurrency
--     keys).
-- Concurrency: row lock on the job, as snooze(); then an upsert of the
--   scope's limits row (waits only for a set_limit, clear_limit, pause or
--   resume of that scope in flight). Takes no lock a claim waits for.
-- Errors: IQ404; IQ410 lease lost (fenced like snooze: nothing is held);
--   22004 NULL job_id, attempt, scope or until; 22023 scope not 'queue' or
--   'task', until infinite or more than duration_days days ahead
--   (idemq._limit).
-- Tests: test/sql/hold.test.ts, test/worker/rate-limited.test.ts
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
  v_held timestamptz;
BEGIN
  IF hold.job_id IS NULL OR hold.attempt IS NULL OR hold.scope IS NULL OR hold.until IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('hold: %s must not be NULL',
                       CASE WHEN hold.job_id IS NULL THEN 'job_id' WHEN hold.attempt IS NULL THEN 'attempt'
                            WHEN hold.scope IS NULL THEN 'scope' ELSE 'until' END),
      HINT = 'Pass the held job''s job_id and attempt (and lease_token), the scope (''queue'' or ''task'') and when the API accepts calls again.';
  END IF;
  IF hold.scope NOT IN ('queue', 'task') THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('hold: scope must be ''queue'' or ''task'', not %s', idemq._excerpt(hold.scope)),
      HINT = 'Hold the job''s queue (every task sharing the API) or its task; a concurrency key is not a scope of hold yet.';
  END IF;
  PERFORM idemq._check_instant('hold', 'until', hold.until);
  IF hold.until > now() + make_interval(days => idemq._limit('duration_days')::int) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('hold: until must be at most %s days ahead (duration_days), not %s',
                       idemq._limit('duration_days'), hold.until),
      HINT = 'A Retry-After that far ahead is likely a parsing error; hold for the API''s real window, or pause() the queue.';
  END IF;
  UPDATE idemq.jobs AS j
  SET state = 'scheduled', run_at = hold.until, uncounted = j.uncounted + 1,
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = hold.job_id AND j.attempt = hold.attempt
    AND j.lease_token IS NOT DISTINCT FROM hold.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.queue, j.task INTO v_queue, v_task;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(hold.job_id, hold.attempt, 'hold');
  END IF;
  IF hold.until <= now() THEN
    PERFORM idemq._notify_waiting(v_queue);
    RETURN hold.until;
  END IF;
  -- Rows that held nothing but a hold now past (claim ignores them; this
  -- keeps the table as small as the limits set).
  DELETE FROM idemq.limits l
  WHERE l.held_until <= now() AND NOT l.paused
    AND l.concurrency IS NULL AND l.rate IS NULL AND l.per_key IS NULL;
  INSERT INTO idemq.limits AS l (kind, name, held_until)
  VALUES (hold.scope, CASE WHEN hold.scope = 'queue' THEN v_queue ELSE v_task END, hold.until)
  ON CONFLICT ON CONSTRAINT limits_scope DO UPDATE
    SET held_until = greatest(l.held_until, hold.until), updated_at = now()
  RETURNING l.held_until INTO v_held;
  RETURN v_held;
END;
$$;

COMMENT ON FUNCTION idemq.hold(bigint, int, text, timestamptz, uuid) IS
  'Back-pressure (a 429): snooze the held job to until without spending an attempt, and hold back its queue or task from every claim until then.';
