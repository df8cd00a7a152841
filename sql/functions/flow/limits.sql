-- idemq.limits() RETURNS TABLE(queue text, task text, concurrency int, rate int, per interval,
--   per_key int, paused boolean, held_until timestamptz, running int, started int, updated_at timestamptz)
--
-- Every queue and task with a limit, a pause or a hold, and what it uses now.
--
-- Guarantees:
--   * One row per scope (queue set and task NULL, or the reverse), ordered
--     by queues first, then by name. concurrency, rate, per, per_key: NULL
--     when not set.
--   * running: the slots held (the jobs of the scope processing under its
--     concurrency limit: the stripes' held less the releases not yet folded
--     into them; more than concurrency only while a lowered limit drains);
--     NULL without a concurrency limit.
--   * held_until: the end of a hold (hold(): a 429's Retry-After) still to
--     come; NULL when the scope is not held (a hold that has passed included).
--   * started: the starts within the last per (rate rows used after now() -
--     per); NULL without a rate limit.
-- Concurrency: a plain read; waits only while set_limit gives a concurrency
--   (its table lock).
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts
CREATE OR REPLACE FUNCTION idemq.limits()
RETURNS TABLE(queue text, task text, concurrency int, rate int, per interval, per_key int, paused boolean,
              held_until timestamptz,
              running int, started int, updated_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE WHEN l.kind = 'queue' THEN l.name END, CASE WHEN l.kind = 'task' THEN l.name END,
         l.concurrency, l.rate, l.per, l.per_key, l.paused,
         CASE WHEN l.held_until > now() THEN l.held_until END,
         CASE WHEN l.concurrency IS NOT NULL THEN
           ((SELECT coalesce(sum(s.held), 0) FROM idemq.limit_slots s WHERE s.limit_id = l.id)
            - (SELECT coalesce(sum(r.n), 0) FROM idemq.limit_releases r WHERE r.limit_id = l.id))::int END,
         CASE WHEN l.rate IS NOT NULL THEN
           (SELECT count(*) FROM idemq.limit_starts r WHERE r.limit_id = l.id AND r.started_at > now() - r.per)::int END,
         l.updated_at
  FROM idemq.limits l
  ORDER BY l.kind, l.name;
$$;

COMMENT ON FUNCTION idemq.limits() IS
  'Every queue and task with a limit, a pause or a hold: its limits, paused, and its use now (slots held, starts in the last period).';
