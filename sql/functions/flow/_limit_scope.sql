-- idemq._limit_scope(operation text, queue text, task text, OUT kind text, OUT name text)
--
-- The scope of a flow-control call (set_limit, clear_limit, pause, resume):
-- exactly one of queue and task, checked the one way for all four.
--
-- Guarantees: returns ('queue', queue) or ('task', task) only for exactly one
--   non-NULL, non-empty name within its limit: a queue name at most
--   _queue_name_limit() characters, a task name at most task_bytes bytes
--   (idemq._limit), as enqueue accepts them.
-- Concurrency: none (reads the settings).
-- Errors: 22023 both or neither given, an empty name, a name over its limit;
--   each with a HINT.
-- Tests: test/sql/flow-control.test.ts
CREATE OR REPLACE FUNCTION idemq._limit_scope(operation text, queue text, task text, OUT kind text, OUT name text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF (_limit_scope.queue IS NULL) = (_limit_scope.task IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: give exactly one of queue and task, not %s', operation,
                       CASE WHEN _limit_scope.queue IS NULL THEN 'neither' ELSE 'both' END),
      HINT = 'A limit or a pause is for one queue (queue => ''emails'') or one task (task => ''send-email''); a job obeys its queue''s and its task''s.';
  END IF;
  IF _limit_scope.queue = '' OR _limit_scope.task = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: the %s name must not be empty', operation, CASE WHEN _limit_scope.queue = '' THEN 'queue' ELSE 'task' END),
      HINT = 'Name the queue or the task as its jobs are enqueued.';
  END IF;
  IF char_length(_limit_scope.queue) > idemq._queue_name_limit() THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: queue is %s characters, over the limit of %s (%s)', operation,
                       char_length(_limit_scope.queue), idemq._queue_name_limit(), idemq._excerpt(_limit_scope.queue)),
      HINT = 'No job can be enqueued in a queue with a longer name.';
  END IF;
  PERFORM idemq._check_size(operation, 'task', _limit_scope.task, 'task_bytes',
    'No job can be enqueued with a longer task name (the limit task_bytes).');
  kind := CASE WHEN _limit_scope.queue IS NULL THEN 'task' ELSE 'queue' END;
  name := coalesce(_limit_scope.queue, _limit_scope.task);
END;
$$;

COMMENT ON FUNCTION idemq._limit_scope(text, text, text) IS
  'The one queue or task a flow-control call names (exactly one, non-empty, within the name limits), as (kind, name).';
