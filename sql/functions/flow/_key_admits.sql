-- idemq._key_admits(key text, queue text, task text) RETURNS boolean
--
-- Whether a new job of concurrency key `key` (of this queue and task) is
-- admitted at once (enqueued or scheduled) or waits (awaiting): enqueue's
-- fast path asks this before it inserts the job, in state
-- _initial_state(run_at) when true, `awaiting` when false.
--
-- Guarantees:
--   * Takes the key's lock (_key_lock's, for one key), kept until the transaction ends, so
--     the answer holds until the job is inserted and committed.
--   * True only when fewer than _per_key(queue, task) jobs of the key are
--     admitted and none waits for it; jobs already waiting that the key has
--     room for are promoted first (_key_promote), so a new job never
--     overtakes them.
-- Concurrency: see _key_promote.
-- Errors: none.
-- Tests: test/sql/concurrency-keys.test.ts, test/sql/concurrency-keys-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._key_admits(key text, queue text, task text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_limit int;
BEGIN
  -- _key_lock's lock for one key, taken here directly (a call less per enqueue).
  PERFORM pg_advisory_xact_lock(1801812339, hashtext(_key_admits.key));
  v_limit := idemq._per_key(_key_admits.queue, _key_admits.task);
  IF (SELECT count(*) FROM idemq.jobs h
      WHERE h.concurrency_key = _key_admits.key AND h.state IN ('enqueued', 'scheduled', 'processing')) >= v_limit THEN
    RETURN false;
  END IF;
  IF EXISTS (SELECT FROM idemq.jobs w
             WHERE w.concurrency_key = _key_admits.key AND w.state = 'awaiting'
               AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = w.id)) THEN
    PERFORM idemq._key_promote(ARRAY[_key_admits.key]);
    RETURN (SELECT count(*) FROM idemq.jobs h
            WHERE h.concurrency_key = _key_admits.key AND h.state IN ('enqueued', 'scheduled', 'processing')) < v_limit
       AND NOT EXISTS (SELECT FROM idemq.jobs w
                       WHERE w.concurrency_key = _key_admits.key AND w.state = 'awaiting'
                         AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = w.id));
  END IF;
  RETURN true;
END;
$$;

COMMENT ON FUNCTION idemq._key_admits(text, text, text) IS
  'Lock a concurrency key and say whether a new job of it is admitted at once (fewer than K admitted, none waiting).';
