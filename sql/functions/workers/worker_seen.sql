-- idemq.worker_seen(worker_id text, queues text[] DEFAULT NULL, tasks text[] DEFAULT NULL,
--   host text DEFAULT NULL, pid int DEFAULT NULL, concurrency int DEFAULT NULL,
--   refresh_every interval DEFAULT NULL, outages int DEFAULT NULL, outage_ms bigint DEFAULT NULL) RETURNS void
--
-- Records that a worker is alive and which queues and tasks it claims: its
-- row in idemq.workers is created, or refreshed with last_seen_at = now().
--
-- Guarantees:
--   * One row per worker_id: the first call sets started_at, every call sets
--     queues, tasks and last_seen_at. A call on a stopped row
--     (worker_stopped) makes it live again (stopped_at NULL) and sets
--     started_at anew: the id started again. queues NULL means every queue, tasks
--     NULL any task, as in claim(); lists are stored sorted, without
--     duplicates.
--   * host, pid, concurrency (jobs it runs at once), refresh_every (how
--     often it calls this: workers() calls the row late after two), outages
--     and outage_ms (the database outages it lived through since it started,
--     and their time down, as the worker counts them) are stored as given;
--     one left NULL keeps what the row has (a caller that does not know them,
--     such as a 0.1.0 worker, takes nothing away). last_outage_at = now()
--     when outages rises (or a new row has some: a row lost in the outage
--     comes back with the worker's count): the latest outage ended by then.
--   * Writes only the caller's named row of idemq.workers, nothing else: the
--     worker role has no table privilege, so this is its only way to say it
--     is there (workers() and unserved_jobs() read it; apply_retention()
--     deletes rows not seen for worker_retention_seconds, and stopped ones
--     stopped_worker_seconds after they stopped).
--   * One statement, no session state: works through a transaction pooler,
--     and after a database restart the next call registers the worker again.
-- Concurrency: an upsert of one row: callers with the same worker_id take
--   turns on its row lock; different workers never wait for each other.
-- Errors: 22004 NULL worker_id; 22023 empty worker_id, worker_id over
--   worker_id_bytes bytes, an empty list or an empty or NULL name in it, a
--   queue name over 1000 characters, a task name over task_bytes bytes, more
--   than worker_names names in queues and tasks together, an empty host or
--   one over worker_id_bytes bytes, pid or concurrency below 1, refresh_every
--   not positive or over duration_days, outages or outage_ms negative.
-- Tests: test/sql/workers.test.ts, test/worker/presence.test.ts, test/sql/bad-input.test.ts, test/dashboard/workers.test.ts
CREATE OR REPLACE FUNCTION idemq.worker_seen(
  worker_id text,
  queues text[] DEFAULT NULL,
  tasks text[] DEFAULT NULL,
  host text DEFAULT NULL,
  pid int DEFAULT NULL,
  concurrency int DEFAULT NULL,
  refresh_every interval DEFAULT NULL,
  outages int DEFAULT NULL,
  outage_ms bigint DEFAULT NULL)
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
  IF host = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'worker_seen: host must not be empty',
      HINT = 'Pass the host name the worker runs on, or NULL when it is not known.';
  END IF;
  PERFORM idemq._check_size('worker_seen', 'host', host, 'worker_id_bytes',
    'Pass the host name the worker runs on (the worker id holds it too).');
  IF pid < 1 OR concurrency < 1 OR outages < 0 OR outage_ms < 0 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: pid and concurrency must be at least 1, outages and outage_ms at least 0; got pid %s, concurrency %s, outages %s, outage_ms %s',
                       pid, concurrency, outages, outage_ms),
      HINT = 'Pass the process id, the jobs the worker runs at once, and the outages it counted since it started (NULL when not known).';
  END IF;
  IF refresh_every <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: refresh_every must be positive, not %s', refresh_every),
      HINT = 'Pass how often the worker calls worker_seen, e.g. ''15 seconds''.';
  END IF;
  PERFORM idemq._check_duration('worker_seen', 'refresh_every', refresh_every);
  FOREACH v_task IN ARRAY coalesce(tasks, '{}') LOOP
    PERFORM idemq._check_size('worker_seen', 'a task name', v_task, 'task_bytes',
      'Task names longer than task_bytes cannot be enqueued: no job needs this one.');
  END LOOP;

  INSERT INTO idemq.workers AS w (worker_id, queues, tasks, host, pid, concurrency, refresh_every, outages, outage_ms, last_outage_at)
  VALUES (worker_seen.worker_id,
          (SELECT array_agg(DISTINCT q ORDER BY q) FROM unnest(worker_seen.queues) q),
          (SELECT array_agg(DISTINCT t ORDER BY t) FROM unnest(worker_seen.tasks) t),
          worker_seen.host, worker_seen.pid, worker_seen.concurrency, worker_seen.refresh_every,
          coalesce(worker_seen.outages, 0), coalesce(worker_seen.outage_ms, 0),
          CASE WHEN worker_seen.outages > 0 THEN now() END)
  ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
    SET queues = excluded.queues, tasks = excluded.tasks, last_seen_at = now(),
        started_at = CASE WHEN w.stopped_at IS NULL THEN w.started_at ELSE now() END, stopped_at = NULL,
        host = coalesce(worker_seen.host, w.host), pid = coalesce(worker_seen.pid, w.pid),
        concurrency = coalesce(worker_seen.concurrency, w.concurrency),
        refresh_every = coalesce(worker_seen.refresh_every, w.refresh_every),
        outages = coalesce(worker_seen.outages, w.outages),
        outage_ms = coalesce(worker_seen.outage_ms, w.outage_ms),
        last_outage_at = CASE WHEN worker_seen.outages > w.outages THEN now() ELSE w.last_outage_at END;
END;
$$;

COMMENT ON FUNCTION idemq.worker_seen(text, text[], text[], text, int, int, interval, int, bigint) IS
  'Register or refresh a worker''s presence (idemq.workers): its queues and tasks, host, pid, concurrency, refresh interval and outages lived through, last_seen_at = now().';
