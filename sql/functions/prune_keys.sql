-- idemq.prune_keys(older_than interval DEFAULT '14 days') RETURNS int
--
-- Releases idempotency keys whose latest job finished more than older_than
-- ago, and guard rows (guard) and finished effect records (effect_claim)
-- older than that. Returns how many keys it released.
--
-- Guarantees:
--   * The only way a key is released: a key whose job is active is never
--     pruned, and purge() never releases keys. Keep older_than longer than
--     any retry or replay horizon: a delivery after its key is pruned runs again.
--   * Claim records still `claimed` are never pruned (their effect may be in flight).
--   * Folds the append-only event counters (stats() sums are unchanged).
-- Concurrency: SKIP LOCKED on key rows; an enqueue taking a key over holds it
--   and keeps it.
-- Errors: 22004 NULL; 22023 negative older_than, or over duration_days (idemq._limit).
-- Tests: test/sql/retention.test.ts
CREATE OR REPLACE FUNCTION idemq.prune_keys(older_than interval DEFAULT '14 days')
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  IF older_than IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'prune_keys: older_than must not be NULL',
      HINT = 'Leave it out for the default key retention (14 days).';
  END IF;
  IF older_than < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('prune_keys: older_than must not be negative, not %s', older_than),
      HINT = 'older_than is the key retention, e.g. ''14 days''.';
  END IF;
  PERFORM idemq._check_duration('prune_keys', 'older_than', older_than);

  WITH doomed AS MATERIALIZED (
    SELECT k.key FROM idemq.keys k
    WHERE k.finished_at < now() - older_than
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM idemq.keys AS k USING doomed d WHERE k.key = d.key RETURNING k.key
  )
  SELECT count(*) INTO v_count FROM gone;

  DELETE FROM idemq.processed AS p WHERE p.created_at < now() - older_than;

  -- Fold the append-only event counters into one row per (task, event). Rows
  -- another transaction inserts meanwhile are not seen and stay for next time.
  WITH folded AS (
    DELETE FROM idemq.counters AS c RETURNING c.task, c.event, c.n
  )
  INSERT INTO idemq.counters (task, event, n)
  SELECT f.task, f.event, sum(f.n) FROM folded f GROUP BY f.task, f.event;
  DELETE FROM idemq.effects AS e WHERE e.status = 'done' AND e.done_at < now() - older_than;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq.prune_keys(interval) IS
  'Release keys (and guard rows, done effect records) finished more than older_than ago; default 14 days.';
