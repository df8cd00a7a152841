-- idemq._per_key(queue text, task text) RETURNS int
--
-- K, the number of jobs of one concurrency key that may be admitted at once
-- for a job of this queue and task: the lower of the queue's and the task's
-- per_key (set_limit), 1 when neither sets one.
--
-- Guarantees: at least 1, at most 10,000 (limits_per_key_range); read from
--   idemq.limits as the caller's statement sees it.
-- Concurrency: none (reads; callers hold the key's lock, _key_promote).
-- Errors: none.
-- Tests: test/sql/concurrency-keys.test.ts
CREATE OR REPLACE FUNCTION idemq._per_key(queue text, task text)
RETURNS int
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
-- PL/pgSQL, not SQL: its callers run once per transaction (an enqueue, a
-- release), and a SQL function with a sub-SELECT is not inlined and was
-- planned again in every transaction; PL/pgSQL keeps the plan for the
-- session (bench/FINDINGS.md, "Flow control: concurrency keys").
AS $$
#variable_conflict error
BEGIN
  RETURN coalesce((SELECT min(l.per_key) FROM idemq.limits l
                   WHERE l.per_key IS NOT NULL
                     AND ((l.kind = 'queue' AND l.name = _per_key.queue) OR (l.kind = 'task' AND l.name = _per_key.task))),
                  1);
END;
$$;

COMMENT ON FUNCTION idemq._per_key(text, text) IS
  'How many jobs of one concurrency key may be admitted at once for a job of this queue and task: the lower per_key, else 1.';
