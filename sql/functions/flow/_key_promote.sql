-- idemq._key_promote(keys text[]) RETURNS void
--
-- Admits waiting jobs of these concurrency keys while their keys have room:
-- for each key, the best job waiting for it (awaiting, no parent left in
-- job_dependencies; by priority desc, run_at, id: the order claim() takes
-- them in) becomes enqueued (or scheduled, _initial_state) as long as fewer
-- than its K (_per_key) jobs of the key are admitted (enqueued, scheduled
-- or processing). Called by the trigger function _count_jobs when admitted
-- jobs leave (finish or are deleted), by enqueue and _insert_jobs for new
-- jobs, by _on_job_finished for children whose parents all succeeded, by
-- retry and by set_limit (a raised per_key).
--
-- Guarantees:
--   * Under the keys' locks (_key_lock) and in statements started after
--     them: at most K of a key are admitted once this returns, and none of
--     its jobs waits for it while it has room for the best of them (a job
--     whose own K is lower than the admitted count waits, and the jobs
--     behind it with it: the order holds).
--   * A promoted job runnable now wakes its queue's waiting consumers
--     (_notify_waiting).
--   * Costs a key with nothing waiting one probe of jobs_key_waiting.
-- Concurrency: the count is exact because every admission of a key holds
--   its lock, and every release (_count_jobs) takes it after the released
--   job left: a release that commits after this one's count promotes after
--   this transaction ends; one counted as still admitted only delays. The
--   promoted row is updated only if still awaiting without parents (read on
--   its newest version), so a concurrent cancel is never undone.
-- Errors: none.
-- Tests: test/sql/concurrency-keys.test.ts, test/sql/concurrency-keys-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._key_promote(keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_key text;
  v_next record;
  v_admitted bigint;
  v_state idemq.job_state;
  v_queues text[] := '{}';
BEGIN
  PERFORM idemq._key_lock(keys);
  FOR v_key IN SELECT DISTINCT k FROM unnest(keys) AS k WHERE k IS NOT NULL ORDER BY 1 LOOP
    LOOP
      SELECT w.id, w.queue, w.task INTO v_next
      FROM idemq.jobs w
      WHERE w.concurrency_key = v_key AND w.state = 'awaiting'
        AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = w.id)
      ORDER BY w.priority DESC, w.run_at, w.id
      LIMIT 1;
      EXIT WHEN NOT FOUND;
      SELECT count(*) INTO v_admitted
      FROM idemq.jobs h
      WHERE h.concurrency_key = v_key AND h.state IN ('enqueued', 'scheduled', 'processing');
      EXIT WHEN v_admitted >= idemq._per_key(v_next.queue, v_next.task);
      -- Re-judged on the row's newest version: a job cancelled or deleted
      -- meanwhile is left alone, and the loop looks again.
      UPDATE idemq.jobs AS j SET state = idemq._initial_state(j.run_at)
      WHERE j.id = v_next.id AND j.state = 'awaiting'
        AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id)
      RETURNING j.state INTO v_state;
      IF v_state = 'enqueued' AND v_next.queue <> ALL (v_queues) THEN
        v_queues := v_queues || v_next.queue;
      END IF;
      v_state := NULL;
    END LOOP;
  END LOOP;
  PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) AS q;
END;
$$;

COMMENT ON FUNCTION idemq._key_promote(text[]) IS
  'Admit the best waiting jobs of these concurrency keys while fewer than K of each are admitted; called where a key''s place frees or its jobs arrive.';
