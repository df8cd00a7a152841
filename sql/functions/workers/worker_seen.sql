-- idemq.worker_seen(worker_id text, queues text[] DEFAULT NULL, tasks text[] DEFAULT NULL) RETURNS void
--
-- Records that a worker is alive and which queues and tasks it claims: its
-- row in idemq.workers is created, or refreshed with last_seen_at = now().
--
-- Guarantees:
--   * One row per worker_id: the first call sets started_at, every call sets
--     queues, tasks and last_seen_at. queues NULL means every queue, tasks
--     NULL any task, as in claim(); lists are stored sorted, without
--     duplicates.
--   * Writes only the caller's named row of idemq.workers, nothing else: the
--     worker role has no table privilege, so this is its only way to say it
--     is there (workers() and unserved_jobs() read it; apply_retention()
--     deletes rows not seen for worker_retention_seconds).
--   * One statement, no session state: works through a transaction pooler,
--     and after a database restart the next call registers the worker again.
-- Concurrency: an upsert of one row: callers with the same worker_id take
--   turns on its row lock; different workers never wait for each other.
-- Errors: 22004 NULL worker_id; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes, an empty list or an empty or NULL name in it, a
--   queue name over 1000 characters, a task name over task_bytes bytes, more
--   than worker_names names in queues and tasks together.
-- Tests: test/sql/workers.test.ts, test/worker/presence.test.ts
CREATE OR REPLACE FUNCTION idemq.worker_seen(
  worker_id text,
  queues text[] DEFAULT NULL,
  tasks text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_names bigint := idemq._limit('worker_names');
  v_task text;
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'worker_seen: worker_id must be a non-empty string',
      HINT = 'Pass the worker id the worker claims with (claim''s worker_id).';
  END IF;
  PERFORM idemq._check_size('worker_seen', 'worker_id', worker_id, 'worker_id_bytes',
    'Use a shorter worker id, e.g. hostname:pid; claim() refuses the same.');
  IF coalesce(cardinality(queues), 0) + coalesce(cardinality(tasks), 0) > v_names THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: %s queue and task names, over the limit of %s (worker_names)',
                       coalesce(cardinality(queues), 0) + coalesce(cardinality(tasks), 0), v_names),
      HINT = 'Pass NULL for every queue or any task, or raise worker_names in idemq.settings.';
  END IF;
  IF NOT idemq._names_valid(queues)
     OR EXISTS (SELECT 1 FROM unnest(queues) q WHERE length(q) > idemq._queue_name_limit()) THEN
    PERFORM idemq._raise_bad_names('worker_seen', 'queues', queues, 'every queue',
      'Pass the queues the worker claims from, as claim() gets them.', idemq._queue_name_limit());
  END IF;
  IF NOT idemq._names_valid(tasks) THEN
    PERFORM idemq._raise_bad_names('worker_seen', 'tasks', tasks, 'any task',
      'Pass the task names the worker has, as claim() gets them.');
  END IF;
  FOREACH v_task IN ARRAY coalesce(tasks, '{}') LOOP
    PERFORM idemq._check_size('worker_seen', 'a task name', v_task, 'task_bytes',
      'Task names longer than task_bytes cannot be enqueued: no job needs this one.');
  END LOOP;

  INSERT INTO idemq.workers AS w (worker_id, queues, tasks)
  VALUES (worker_seen.worker_id,
          (SELECT array_agg(DISTINCT q ORDER BY q) FROM unnest(worker_seen.queues) q),
          (SELECT array_agg(DISTINCT t ORDER BY t) FROM unnest(worker_seen.tasks) t))
  ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
    SET queues = excluded.queues, tasks = excluded.tasks, last_seen_at = now();
END;
$$;

COMMENT ON FUNCTION idemq.worker_seen(text, text[], text[]) IS
  'Register or refresh a worker''s presence (idemq.workers): its queues and tasks, last_seen_at = now().';
