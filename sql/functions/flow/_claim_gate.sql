-- idemq._claim_gate(key_tasks text[], key_queues text[], batch_size int,
--   OUT tasks text[], OUT queues text[], OUT take int, OUT caps int[], OUT limited boolean)
--
-- claim()'s flow control before it walks any job, when idemq.limits has a
-- row: the (task, queue) keys it may take jobs from, and how many jobs at
-- most. No row is locked here; _claim_take takes the slots and starts.
--
-- Guarantees:
--   * tasks, queues: the keys given, in their order, less those whose task
--     or queue is paused, held (held_until after the claim's now(): hold())
--     or has, as this statement sees it, no free slot or no start left in
--     its period.
--   * take: at most batch_size, and at most the sum over the keys left of
--     the least of their scopes' free slots (concurrency less the stripes'
--     held, plus the releases not yet folded) and starts (an estimate:
--     slots another claim takes uncommitted count as free here; _claim_take
--     then finds their stripes locked and drops the jobs it cannot start).
--   * caps: per key left, the most jobs it could start (at most
--     batch_size); NULL when no key is capped below batch_size (then the
--     claim merges the keys as without limits).
--   * limited: whether a key left has a scope with a concurrency or a rate
--     limit, that is whether _claim_take has slots or starts to take; read
--     with the rest, so claim() reads idemq.limits once more for nothing.
-- Concurrency: plain reads.
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts
CREATE OR REPLACE FUNCTION idemq._claim_gate(key_tasks text[], key_queues text[], batch_size int,
                                             OUT tasks text[], OUT queues text[], OUT take int, OUT caps int[],
                                             OUT limited boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  WITH scopes AS MATERIALIZED (
    SELECT l.kind, l.name,
           CASE WHEN l.paused OR l.held_until > now() THEN 0 ELSE
             least(_claim_gate.batch_size,
                   CASE WHEN l.concurrency IS NOT NULL THEN
                     greatest(0, l.concurrency
                                 - (SELECT coalesce(sum(s.held), 0) FROM idemq.limit_slots s WHERE s.limit_id = l.id)
                                 + (SELECT coalesce(sum(r.n), 0) FROM idemq.limit_releases r WHERE r.limit_id = l.id))::int END,
                   CASE WHEN l.rate IS NOT NULL THEN
                     (SELECT count(*) FROM (SELECT FROM idemq.limit_starts r
                                            WHERE r.limit_id = l.id AND r.started_at < now() - r.per
                                            LIMIT _claim_gate.batch_size) f)::int END)
           END AS cap,
           l.concurrency IS NOT NULL OR l.rate IS NOT NULL AS takes
    FROM idemq.limits l
    WHERE (l.kind = 'queue' AND l.name = ANY (key_queues)) OR (l.kind = 'task' AND l.name = ANY (key_tasks))
  ),
  keys AS (
    SELECT k.n, k.task, k.queue,
           least(_claim_gate.batch_size,
                 (SELECT c.cap FROM scopes c WHERE c.kind = 'task' AND c.name = k.task),
                 (SELECT c.cap FROM scopes c WHERE c.kind = 'queue' AND c.name = k.queue)) AS cap,
           EXISTS (SELECT FROM scopes c
                   WHERE c.takes AND ((c.kind = 'task' AND c.name = k.task) OR (c.kind = 'queue' AND c.name = k.queue))) AS takes
    FROM unnest(key_tasks, key_queues) WITH ORDINALITY AS k(task, queue, n)
  )
  SELECT coalesce(array_agg(k.task ORDER BY k.n) FILTER (WHERE k.cap > 0), '{}'),
         coalesce(array_agg(k.queue ORDER BY k.n) FILTER (WHERE k.cap > 0), '{}'),
         least(_claim_gate.batch_size, coalesce(sum(k.cap) FILTER (WHERE k.cap > 0), 0))::int,
         CASE WHEN bool_or(k.cap > 0 AND k.cap < _claim_gate.batch_size)
              THEN array_agg(k.cap ORDER BY k.n) FILTER (WHERE k.cap > 0) END,
         coalesce(bool_or(k.takes) FILTER (WHERE k.cap > 0), false)
  INTO tasks, queues, take, caps, limited
  FROM keys k;
END;
$$;

COMMENT ON FUNCTION idemq._claim_gate(text[], text[], int) IS
  'claim() under flow control: the keys not paused and with free slots and starts, and how many jobs to walk at most.';
