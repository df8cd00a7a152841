-- idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states(),
--   batch_size int DEFAULT NULL) RETURNS int
--
-- Deletes finished jobs that finished more than older_than ago, at most
-- batch_size of them (NULL: all). Returns how many.
--
-- Guarantees:
--   * Only terminal jobs are ever deleted (states must be terminal).
--   * Never releases an idempotency key: the ledger (idemq.keys) keeps it
--     until prune_keys() passes the key retention, so a purged job's key
--     still deduplicates or rejects.
--   * Dependency rows of purged parents are removed with them.
--   * With batch_size, the oldest first within each state: call it again while
--     it returns batch_size, each call a short transaction (the CLI does).
--     Independent of the retention settings (apply_retention).
-- Concurrency: SKIP LOCKED: rows a concurrent transaction holds are left for the next call.
-- Errors: 22004 NULL older_than or states; 22023 negative older_than or over
--   duration_days (idemq._limit), an active state in states, batch_size
--   outside 1..10000.
-- Tests: test/sql/retention.test.ts, test/cli/purge.test.ts
CREATE OR REPLACE FUNCTION idemq.purge(older_than interval, states idemq.job_state[] DEFAULT idemq.terminal_states(),
                                       batch_size int DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_state idemq.job_state;
  v_left int := batch_size;
BEGIN
  IF older_than IS NULL OR states IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'purge: older_than and states must not be NULL',
      HINT = 'e.g. purge(older_than => ''7 days'') purges every terminal state.';
  END IF;
  IF older_than < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: older_than must not be negative, not %s', older_than),
      HINT = 'older_than is how long a finished job is kept, e.g. ''7 days''.';
  END IF;
  PERFORM idemq._check_duration('purge', 'older_than', older_than);
  IF NOT states <@ idemq.terminal_states() OR array_position(states, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('purge: states must be terminal (%s), not %s', idemq.terminal_states(), idemq._excerpt(states::text)),
      HINT = 'Active jobs are never purged; cancel them first.';
  END IF;
  IF batch_size IS NOT NULL THEN
    PERFORM idemq._check_delete_batch('purge', batch_size);
  END IF;

  IF batch_size IS NULL THEN
    SELECT array_agg(x.id) INTO v_ids FROM (
      SELECT j.id FROM idemq.jobs j
      WHERE j.state = ANY (states) AND j.finished_at < now() - older_than
      FOR UPDATE OF j SKIP LOCKED) x;
    RETURN idemq._delete_jobs(coalesce(v_ids, '{}'));
  END IF;
  -- A batch: one state at a time, each a range scan of jobs_by_finish (state,
  -- finished_at) in index order (see apply_retention for why the ORDER BY).
  -- One query over all the states would sort every due row for each batch.
  FOREACH v_state IN ARRAY states LOOP
    EXIT WHEN v_left = 0;
    SELECT array_agg(x.id) INTO v_ids FROM (
      SELECT j.id FROM idemq.jobs j
      WHERE j.state = v_state AND j.finished_at < now() - older_than
      ORDER BY j.finished_at
      LIMIT v_left
      FOR UPDATE OF j SKIP LOCKED) x;
    v_left := v_left - idemq._delete_jobs(coalesce(v_ids, '{}'));
  END LOOP;
  RETURN batch_size - v_left;
END;
$$;

COMMENT ON FUNCTION idemq.purge(interval, idemq.job_state[], int) IS
  'Delete terminal jobs finished more than older_than ago (at most batch_size per call); keys stay until prune_keys.';
