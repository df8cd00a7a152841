-- idemq._check_claimer(operation text, worker_id text, queues text[], tasks text[], lease interval)
--   RETURNS void
--
-- The checks of who takes jobs and for how long, shared by claim() and
-- complete_and_take_next(): a named worker, queue and task lists without
-- empty or NULL names, and a usable lease.
--
-- Guarantees: returns only when worker_id is a non-empty string of at most
--   worker_id_bytes bytes (idemq._limit), queues and tasks are NULL or lists
--   of valid names (_names_valid), and lease passes _check_lease. Messages
--   begin with `operation`.
-- Concurrency: none.
-- Errors: 22004 NULL worker_id or lease; 22023 empty or oversized
--   worker_id, an empty list or a bad name, a lease out of range.
-- Tests: test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._check_claimer(operation text, worker_id text, queues text[], tasks text[], lease interval)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('%s: worker_id must be a non-empty string', operation),
      HINT = 'Name the worker, e.g. hostname:pid; it is recorded as locked_by and in the error history.';
  END IF;
  PERFORM idemq._check_size(operation, 'worker_id', worker_id, 'worker_id_bytes',
    'Use a shorter worker id, e.g. hostname:pid; it is stored in every job the worker claims.');
  IF NOT idemq._names_valid(queues) THEN
    PERFORM idemq._raise_bad_names(operation, 'queues', queues, 'all queues', 'Pass NULL to claim from every queue.');
  END IF;
  IF NOT idemq._names_valid(tasks) THEN
    PERFORM idemq._raise_bad_names(operation, 'tasks', tasks, 'any task',
      'Pass the names of the tasks this worker has, or NULL to claim jobs of any task.');
  END IF;
  PERFORM idemq._check_lease(lease, operation);
END;
$$;

COMMENT ON FUNCTION idemq._check_claimer(text, text, text[], text[], interval) IS
  'Raise unless worker_id, queues, tasks and lease are what claim() and complete_and_take_next() accept.';
