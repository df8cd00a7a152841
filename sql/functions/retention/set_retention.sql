-- idemq.set_retention(state idemq.job_state, keep interval, queue text DEFAULT NULL,
--   task text DEFAULT NULL) RETURNS void
--
-- Sets how long finished jobs in a terminal state are kept: the default for
-- every job (neither queue nor task), or an override for one queue or one
-- task. keep => NULL removes an override (the default applies again).
--
-- Guarantees:
--   * Precedence when apply_retention() and completions judge a job: an
--     override of its task, else of its queue, else the default.
--   * keep 0 for succeeded: complete() and complete_many() delete the row
--     as they complete it (the key ledger keeps the outcome).
--   * The default is the settings row retention_<state>_seconds, stored in
--     whole seconds (keep is rounded to the second); an override keeps keep
--     as given. Every argument is checked before anything is written.
-- Concurrency: an upsert of one row (idemq.retention or idemq.settings);
--   calls that start after the commit see it.
-- Errors: 22004 NULL state, NULL keep for a default; 22023 an active state,
--   negative keep or over duration_days (idemq._limit), both queue and
--   task, an empty queue or task name.
-- Tests: test/sql/retention-policy.test.ts
CREATE OR REPLACE FUNCTION idemq.set_retention(state idemq.job_state, keep interval, queue text DEFAULT NULL,
                                               task text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF set_retention.state IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'set_retention: state must not be NULL',
      HINT = format('Name a terminal state: %s.', array_to_string(idemq.terminal_states(), ', '));
  END IF;
  IF NOT set_retention.state = ANY (idemq.terminal_states()) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('set_retention: state must be terminal (%s), not %s',
                       array_to_string(idemq.terminal_states(), ', '), set_retention.state),
      HINT = 'Only finished jobs have a retention; active jobs are never deleted.';
  END IF;
  IF set_retention.queue IS NOT NULL AND set_retention.task IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'set_retention: give a queue or a task, not both',
      HINT = 'An override names one queue or one task; a task''s override wins over its queue''s.';
  END IF;
  IF set_retention.queue = '' OR set_retention.task = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'set_retention: queue and task must not be empty',
      HINT = 'Leave both out (NULL) to set the default of the state.';
  END IF;
  IF set_retention.keep IS NULL AND set_retention.queue IS NULL AND set_retention.task IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('set_retention: keep must not be NULL for the default of %s', set_retention.state),
      HINT = 'Give the default a duration, e.g. ''7 days'' (0 deletes at once); NULL only removes an override.';
  END IF;
  IF set_retention.keep < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('set_retention: keep must not be negative, not %s', set_retention.keep),
      HINT = 'keep is how long a finished job stays, e.g. ''7 days''; 0 deletes it at once.';
  END IF;
  PERFORM idemq._check_duration('set_retention', 'keep', set_retention.keep);

  IF set_retention.queue IS NULL AND set_retention.task IS NULL THEN
    UPDATE idemq.settings AS s SET value = round(extract(epoch FROM set_retention.keep))::bigint
    WHERE s.name = idemq._retention_setting(set_retention.state);
  ELSIF set_retention.keep IS NULL THEN
    DELETE FROM idemq.retention AS r
    WHERE r.state = set_retention.state
      AND (r.queue = set_retention.queue OR r.task = set_retention.task);
  ELSIF set_retention.queue IS NOT NULL THEN
    INSERT INTO idemq.retention AS r (queue, state, keep)
    VALUES (set_retention.queue, set_retention.state, set_retention.keep)
    ON CONFLICT ON CONSTRAINT retention_queue_state DO UPDATE SET keep = EXCLUDED.keep, updated_at = now();
  ELSE
    INSERT INTO idemq.retention AS r (task, state, keep)
    VALUES (set_retention.task, set_retention.state, set_retention.keep)
    ON CONFLICT ON CONSTRAINT retention_task_state DO UPDATE SET keep = EXCLUDED.keep, updated_at = now();
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.set_retention(idemq.job_state, interval, text, text) IS
  'Set how long finished jobs of a state are kept: the default, or an override for a queue or a task (NULL keep removes it).';
