-- idemq.prune_keys(older_than interval DEFAULT '14 days') RETURNS int
--
-- Releases idempotency keys whose latest job finished longer ago than both
-- the key's own retention (enqueue's key_retention, stored on the key row)
-- and older_than, and guard rows (guard) and finished effect records
-- (effect_claim) older than older_than. Returns how many keys it released.
--
-- Guarantees:
--   * The only way a key is released: a key whose job is active is never
--     pruned, and purge() never releases keys. Keep key retentions longer
--     than any retry or replay horizon: a delivery after its key is pruned
--     runs again.
--   * A key is never released before its own retention has passed since its
--     job finished, whatever older_than says: for keys older_than can only
--     lengthen the retention (a floor an operator sets for every key), so
--     apps with different retentions can share one database and either's
--     prune_keys, with any argument, releases no key of the other early.
--     older_than 0 releases every key at its own retention.
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
      AND k.finished_at < now() - k.retention
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
  'Release keys finished longer ago than their own retention and older_than (and guard rows, done effect records older than older_than); default 14 days.';
