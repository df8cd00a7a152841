-- idemq._scope_waits() RETURNS TABLE(queue text, task text, waiting_for idemq.waiting_reason)
--
-- Why each queue and task with flow control holds its runnable jobs back
-- now: the one rule job(), stats() and (through job()) `idemq jobs` say
-- why a runnable job is not running by. Decided from limits()' columns
-- alone, so it holds however the slots and starts are stored.
--
-- Guarantees:
--   * One row per row of limits() (queue set and task NULL, or the
--     reverse), waiting_for the first that holds: 'paused' (paused),
--     'held' (held_until, a hold still to come), 'concurrency' (running >=
--     concurrency: no slot free), 'rate' (started >= rate: no start left in
--     the last per); NULL when none does (its jobs wait for a worker, as far
--     as this scope goes). The dashboard's /limits (scopeWaitingFor())
--     words the same rule per scope (test/contract/waiting-reasons.test.ts
--     holds them equal).
--   * The reasons are idemq.waiting_reason's values, in its order, so a job
--     held back by both its queue and its task says the first: min().
--   * Cost: one call of limits() (every scope's row and use), whatever the
--     caller asks about; a caller asking about many (queue, task) pairs
--     reads it once (stats() does).
-- Concurrency: a plain read, as limits().
-- Errors: none.
-- Tests: test/sql/waiting-for.test.ts, test/contract/waiting-reasons.test.ts
CREATE OR REPLACE FUNCTION idemq._scope_waits()
RETURNS TABLE(queue text, task text, waiting_for idemq.waiting_reason)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  -- PL/pgSQL, not a SQL-standard body: bound at each call, so a limits()
  -- redefined (DROP and CREATE, to give it a column) is not held by this
  -- function, and the migration may create it before limits().
  RETURN QUERY
  SELECT l.queue, l.task,
         CASE WHEN l.paused THEN 'paused'
              WHEN l.held_until IS NOT NULL THEN 'held'
              WHEN l.running >= l.concurrency THEN 'concurrency'
              WHEN l.started >= l.rate THEN 'rate' END::idemq.waiting_reason
  FROM idemq.limits() l;
END;
$$;

COMMENT ON FUNCTION idemq._scope_waits() IS
  'Why each queue and task with flow control holds its runnable jobs back now (paused, held, concurrency, rate), from limits(); NULL when it does not.';
