-- idemq._tick(at timestamptz) RETURNS int
--
-- tick() on a given clock: enqueues the due slots of every schedule whose
-- next_at is at or before `at`. Returns how many jobs it created. (Tests pass
-- a clock; everything else calls tick(), which passes now().)
--
-- Guarantees:
--   * A slot is late by at - slot. Slots late by less than the schedule's
--     misfire_grace are on time and each gets a run. Older due slots were
--     missed (the ticks stopped): misfire `once` gives the latest missed slot
--     one run when no slot is on time (one run stands for all of them),
--     `skip` gives them none, `all` runs each of them. At most 100 slots run
--     per schedule and call, the latest ones; older ones are dropped.
--   * A slot's job is enqueued with idempotency key
--     schedule:<name>:<slot instant in UTC, YYYY-MM-DDTHH:MI:SSZ> and
--     duplicate_policy reject_always, so a slot never gets a second job,
--     whoever replays it: a slot whose key is taken (IQ409, IQ422) or held by
--     an active job (deduplicated) creates nothing.
--   * Overlap, per slot, against the schedule's latest job (last_job_id):
--     while it is active, `skip` drops the slot and adds 1 to `skipped`;
--     `allow` runs it anyway; `queue_one` enqueues it after the latest job
--     (enqueue ... after: it waits, awaiting, until that job succeeded, and
--     is cancelled if it does not) when the latest job is processing, and
--     drops and counts it when the latest job has not started yet (that one
--     is the waiting run).
--   * Afterwards next_at is the first slot after `at`, last_slot_at the
--     latest slot run, last_job_id that slot's job, and last_error and
--     last_error_at are NULL.
--   * One schedule cannot stop the others: each schedule's slots run in a
--     subtransaction of their own. When an enqueue refuses a slot's job for
--     a reason of the schedule's own (class 22, such as a payload over a
--     payload_bytes an admin lowered after schedule() accepted it, or a task
--     over task_bytes, or a key over key_bytes; class 23; class 54; IQ404),
--     none of that schedule's slots of this call is enqueued, its next_at,
--     last_slot_at, last_job_id and skipped stay, and last_error records
--     "<message> (SQLSTATE <code>)" with last_error_at = `at`; the other
--     schedules go on. It stays due: every later call tries it again, and
--     the first that enqueues it (the limit raised, the schedule redefined)
--     runs its slots by the misfire policy and clears last_error.
-- Concurrency: locks each due schedule row FOR UPDATE SKIP LOCKED and holds
--   it to commit: a concurrent tick skips a schedule another is handling,
--   and once that one commits the row's next_at is past `at`. So any number
--   of callers need no leader, and a slot gets exactly one job (the key makes
--   that hold even when next_at is moved back). schedule()/unschedule() of a
--   schedule being ticked wait for the tick's commit. One subtransaction per
--   due schedule, and one per slot's enqueue inside it.
-- Errors: none for a schedule's own refused job (recorded in last_error, see
--   above). Other errors of enqueue() (a deadlock, a serialization failure,
--   out of memory or disk: not the schedule's doing) abort the call as before.
-- Tests: test/sql/schedules-tick.test.ts, test/sql/schedules-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._tick(at timestamptz)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_created int := 0;
  v_s record;
  v_spec jsonb;
  v_on_time timestamptz[];
  v_missed timestamptz[];
  v_slot timestamptz;
  v_last_job bigint;
  v_last_slot timestamptz;
  v_last_state idemq.job_state;
  v_skipped int;
  v_after bigint[];
  v_job bigint;
  v_deduplicated boolean;
  v_new int;
  v_state text;
  v_message text;
BEGIN
  FOR v_s IN
    SELECT s.name, s.cron, s.timezone, s.task, s.payload, s.queue, s.priority, s.max_attempts,
           s.overlap, s.misfire, s.misfire_grace, s.next_at, s.last_job_id, s.last_slot_at
    FROM idemq.schedules s
    WHERE s.next_at <= _tick.at
    ORDER BY s.next_at, s.name
    FOR UPDATE SKIP LOCKED
  LOOP
    -- Each schedule in a subtransaction: a job enqueue refuses for the
    -- schedule's own reason (a limit lowered after schedule() checked it)
    -- undoes this schedule's slots only, and is recorded in the handler.
    BEGIN
      v_spec := idemq._cron_parse(v_s.cron);
      v_on_time := idemq._cron_latest(v_spec, v_s.timezone,
                                      greatest(v_s.next_at, _tick.at - v_s.misfire_grace + interval '1 microsecond'),
                                      _tick.at, 100);
      v_missed := '{}';
      IF v_s.next_at <= _tick.at - v_s.misfire_grace THEN
        IF v_s.misfire = 'all' THEN
          v_missed := idemq._cron_latest(v_spec, v_s.timezone, v_s.next_at, _tick.at - v_s.misfire_grace,
                                         100 - cardinality(v_on_time));
        ELSIF v_s.misfire = 'once' AND cardinality(v_on_time) = 0 THEN
          v_missed := idemq._cron_latest(v_spec, v_s.timezone, v_s.next_at, _tick.at - v_s.misfire_grace, 1);
        END IF;
      END IF;

      v_last_job := v_s.last_job_id;
      v_last_slot := v_s.last_slot_at;
      v_skipped := 0;
      v_new := 0;
      FOREACH v_slot IN ARRAY v_missed || v_on_time LOOP
        v_after := NULL;
        IF v_s.overlap <> 'allow' THEN
          SELECT j.state INTO v_last_state FROM idemq.jobs j WHERE j.id = v_last_job;
          IF v_last_state = ANY (idemq.active_states()) THEN
            IF v_s.overlap = 'skip' OR v_last_state <> 'processing' THEN
              v_skipped := v_skipped + 1;
              CONTINUE;
            END IF;
            v_after := ARRAY[v_last_job];
          END IF;
        END IF;
        BEGIN
          SELECT e.job_id, e.deduplicated INTO v_job, v_deduplicated
          FROM idemq.enqueue(
            task => v_s.task, payload => v_s.payload, queue => v_s.queue, priority => v_s.priority,
            max_attempts => v_s.max_attempts,
            idempotency_key => format('schedule:%s:%s', v_s.name,
                                      to_char(v_slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
            duplicate_policy => 'reject_always', after => v_after) e;
        EXCEPTION WHEN SQLSTATE 'IQ409' OR SQLSTATE 'IQ422' THEN
          -- The slot's key was used already: the slot ran (or was replayed) before.
          CONTINUE;
        END;
        IF NOT v_deduplicated THEN
          v_new := v_new + 1;
        END IF;
        v_last_job := v_job;
        v_last_slot := v_slot;
      END LOOP;

      UPDATE idemq.schedules AS s
      SET next_at = coalesce(idemq._cron_next(v_spec, v_s.timezone, _tick.at), 'infinity'),
          last_slot_at = v_last_slot,
          last_job_id = v_last_job,
          skipped = s.skipped + v_skipped,
          last_error = NULL,
          last_error_at = NULL
      WHERE s.name = v_s.name;
      v_created := v_created + v_new;
    EXCEPTION WHEN data_exception OR integrity_constraint_violation OR program_limit_exceeded
                   OR SQLSTATE 'IQ404' THEN
      -- Its slots are undone and its next_at stays (due: the next call tries
      -- again); the row lock of the loop's FOR UPDATE is the transaction's.
      GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
      UPDATE idemq.schedules AS s
      SET last_error = format('%s (SQLSTATE %s)', v_message, v_state),
          last_error_at = _tick.at
      WHERE s.name = v_s.name;
    END;
  END LOOP;
  RETURN v_created;
END;
$$;

COMMENT ON FUNCTION idemq._tick(timestamptz) IS
  'tick() on a given clock: enqueue each due slot of every due schedule once, by its overlap and misfire policies.';
