-- idemq._on_job_finished() RETURNS trigger
--
-- Trigger (AFTER UPDATE OF state ON idemq.jobs, for rows entering a terminal
-- state that have an idempotency key or children): keeps the key ledger and
-- continuations in step with the job, whichever function finished it.
--
-- Guarantees:
--   * The key, if it still points at this job, records its terminal state and
--     finished_at, so the duplicate policy applies from now on.
--   * Children waiting on this job (after): when it succeeded, each child whose
--     parents have all succeeded becomes runnable (enqueued, or scheduled if
--     its run_at is later) and waiting workers are notified, or, with a
--     concurrency key, goes on awaiting its key and is admitted when the key
--     has room (_key_promote); when it failed, was
--     cancelled or expired, its awaiting children are cancelled with the
--     reason in their errors (and theirs in turn, through this trigger).
--     Their other dependency rows stay until those parents finish; they
--     only ever release jobs still awaiting.
--   * A job a client waits for (result_watched: job_result's notify) sends
--     NOTIFY idemq_results with its id, at the finishing commit.
--   * A spawned child (job_children) records its outcome for its parents
--     and releases a parent whose wait it ends (_child_finished).
-- Concurrency: runs inside the finishing transaction; children are locked
--   in id order before their remaining parents are read, so two parents of one
--   child finishing at once serialise on the child and the later one sees the
--   earlier one's outcome (the child is released once, or stays cancelled).
-- Errors: none of its own.
-- Tests: test/sql/continuations.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/concurrency-keys.test.ts, test/sql/job-result.test.ts, test/sql/children.test.ts
CREATE OR REPLACE FUNCTION idemq._on_job_finished()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_children bigint[];
  v_queues text[];
  v_keys text[];
BEGIN
  IF NEW.idempotency_key IS NOT NULL THEN
    UPDATE idemq.keys AS k
    SET finished_state = NEW.state, finished_at = NEW.finished_at
    WHERE k.key = NEW.idempotency_key AND k.job_id = NEW.id;
  END IF;

  IF NEW.has_children THEN
    -- A client waits for this outcome (job_result's notify), and parents
    -- wait for this child (spawn, enqueue_batch): before the continuations,
    -- which may end the trigger early.
    IF NEW.result_watched THEN
      PERFORM pg_notify('idemq_results', NEW.id::text);
    END IF;
    PERFORM idemq._child_finished(NEW.id, NEW.state, NEW.result, NEW.errors);
    WITH released AS (
      DELETE FROM idemq.job_dependencies AS d
      WHERE d.parent_id = NEW.id
      RETURNING d.child_id
    )
    SELECT array_agg(r.child_id) INTO v_children FROM released r;
    IF v_children IS NULL THEN
      RETURN NULL;
    END IF;
    -- Lock the children (in id order) before looking at what else they wait
    -- on, and look in statements of their own: each takes its snapshot after
    -- the lock, so it sees what a concurrent parent's transaction committed.
    -- Read in the statement that deletes the dependency rows, two parents
    -- succeeding at once would each still see the other's row, and neither
    -- would release the child.
    PERFORM 1 FROM idemq.jobs j
    WHERE j.id = ANY (v_children)
    ORDER BY j.id
    FOR NO KEY UPDATE;

    IF NEW.state = 'succeeded' THEN
      WITH moved AS (
        UPDATE idemq.jobs AS j
        SET state = idemq._initial_state(j.run_at)
        WHERE j.id = ANY (v_children)
          AND j.state = 'awaiting'
          AND j.concurrency_key IS NULL
          AND NOT EXISTS (SELECT 1 FROM idemq.job_dependencies d WHERE d.child_id = j.id)
        RETURNING j.queue, j.state
      )
      SELECT array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued') INTO v_queues FROM moved m;
      PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;
      -- A child with a concurrency key stays awaiting, now for its key, and
      -- is admitted when the key has room (_key_promote).
      SELECT array_agg(DISTINCT j.concurrency_key) INTO v_keys
      FROM idemq.jobs j
      WHERE j.id = ANY (v_children) AND j.state = 'awaiting' AND j.concurrency_key IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM idemq.job_dependencies d WHERE d.child_id = j.id);
      IF v_keys IS NOT NULL THEN
        PERFORM idemq._key_promote(v_keys);
      END IF;
    ELSE
      UPDATE idemq.jobs AS j
      SET state = 'cancelled', finished_at = now(),
          errors = idemq._append_error(j.errors, jsonb_build_object(
            'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
            'message', format('parent job %s ended %s before this job could run', NEW.id, NEW.state)))
      WHERE j.id = ANY (v_children) AND j.state = 'awaiting';
    END IF;
  END IF;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._on_job_finished() IS
  'Trigger: on a job entering a terminal state, finish its key in the ledger and release or cancel its children.';
