-- idemq.set_limit(queue text DEFAULT NULL, task text DEFAULT NULL, concurrency int DEFAULT NULL,
--   rate int DEFAULT NULL, per interval DEFAULT NULL, per_key int DEFAULT NULL) RETURNS void
--
-- Sets the flow control of one queue or one task (exactly one of the two):
-- at most concurrency of its jobs processing at once, at most rate starts
-- (claims, retries included) per period per, and per_key (K: at most K jobs
-- of one concurrency key admitted at once, enqueue's concurrency_key).
-- claim() obeys it for every caller.
--
-- Guarantees:
--   * A field left NULL is not given: an existing limit keeps it, so
--     set_limit on a scope that has a limit replaces the fields it is given
--     (clear_limit removes them all). Every argument is checked before
--     anything is written.
--   * Concurrency (docs/design.md, "Flow control"): the scope gets its
--     slots in stripes (idemq.limit_slots, laid out by _size_slots). A call
--     that gives concurrency waits for the claims and releases in flight
--     (the transactions that called claim() or moved a job out of
--     processing and have not ended: it takes idemq.limits' ACCESS
--     EXCLUSIVE lock, which their ACCESS SHARE lock on the table holds off,
--     and new ones wait for its commit). A new concurrency limit so counts
--     every job of the scope processing when it commits: they hold slots
--     of its first stripe (first_slot). Raised: the new slots are free.
--     Lowered while more run: no job of the scope starts until fewer than
--     the new limit run (each slot released meanwhile is given up).
--   * Rate: the scope's ring gets rate rows (new ones never used). Lowered:
--     the rows used longest ago are deleted, so every period-long window that
--     holds a start made after the change holds at most the new rate. A new
--     rate limit counts the starts made after it is set; a changed per
--     applies to every row (a window holding only starts made before the
--     change was judged by the old per).
--   * per_key (docs/design.md, "Concurrency keys"): raised, the jobs of the
--     scope waiting for their keys are admitted as far as the new K allows
--     (_key_promote), before this returns; lowered, admitted jobs run on,
--     and no job of the key is admitted until fewer than K are.
-- Concurrency: locks the scope's stripes and start rows (in order) and then
--   its limits row: concurrent set_limit and clear_limit of the scope wait,
--   claims skip the locked rows. A call that gives concurrency
--   takes the table lock above (run it with a lock_timeout where a claim
--   transaction may stay open long).
-- Errors: 22023 both or neither of queue and task, an empty or too long name
--   (_limit_scope), no limit given, concurrency or per_key outside 1..10000,
--   rate outside 1..100000, rate without per or per without rate, per under
--   one second or over duration_days (idemq._limit).
-- Tests: test/sql/flow-control.test.ts, test/sql/flow-control-concurrency.test.ts,
--   test/sql/concurrency-keys.test.ts
CREATE OR REPLACE FUNCTION idemq.set_limit(queue text DEFAULT NULL, task text DEFAULT NULL, concurrency int DEFAULT NULL,
                                           rate int DEFAULT NULL, per interval DEFAULT NULL, per_key int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
  v_row idemq.limits;
  v_rows int;
  v_first int;
  v_created boolean := false;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('set_limit', set_limit.queue, set_limit.task) s;
  IF set_limit.concurrency IS NULL AND set_limit.rate IS NULL AND set_limit.per IS NULL AND set_limit.per_key IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'set_limit: give at least one limit: concurrency, rate with per, or per_key',
      HINT = 'e.g. set_limit(queue => ''emails'', concurrency => 5, rate => 100, per => ''1 minute''); clear_limit removes limits.';
  END IF;
  PERFORM idemq._check_limit_values('set_limit', set_limit.concurrency, set_limit.rate, set_limit.per, set_limit.per_key);

  -- A new concurrency limit must see every job of its scope that is or will
  -- be processing: wait for the claims in flight, hold off new ones. Taken
  -- before this call reads the table (so two calls never hold its ACCESS
  -- SHARE lock and wait for each other's), whenever concurrency is given.
  IF set_limit.concurrency IS NOT NULL THEN
    LOCK TABLE idemq.limits IN ACCESS EXCLUSIVE MODE;
  END IF;
  SELECT l.* INTO v_row FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name;
  IF v_row.id IS NULL THEN
    INSERT INTO idemq.limits AS l (kind, name, concurrency, rate, per, per_key)
    VALUES (v_kind, v_name, set_limit.concurrency, set_limit.rate, set_limit.per, set_limit.per_key)
    ON CONFLICT ON CONSTRAINT limits_scope DO NOTHING
    RETURNING l.* INTO v_row;
    IF v_row.id IS NOT NULL THEN
      v_created := true;
    ELSE
      SELECT l.* INTO v_row FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name;
    END IF;
  END IF;
  -- Slots and starts before the limits row: a slot's release takes them in
  -- that order too.
  PERFORM FROM idemq.limit_slots s WHERE s.limit_id = v_row.id ORDER BY s.slot FOR UPDATE;
  IF set_limit.rate IS NOT NULL THEN
    PERFORM FROM idemq.limit_starts r WHERE r.limit_id = v_row.id ORDER BY r.n FOR UPDATE;
  END IF;
  SELECT l.* INTO v_row FROM idemq.limits l WHERE l.id = v_row.id FOR UPDATE;
  IF v_created THEN
    -- Inserted above with the limits given: it has no slot or start yet.
    v_row.concurrency := NULL;
    v_row.rate := NULL;
  END IF;

  IF set_limit.concurrency IS NOT NULL THEN
    IF v_row.concurrency IS NULL THEN
      -- A new limit: the jobs of the scope processing now hold slots of its
      -- first stripe (they name none of its stripes: a job's release goes
      -- to first_slot when it names an older one or none). Releases left of
      -- an earlier limit of the scope name stripes gone with it.
      DELETE FROM idemq.limit_releases r WHERE r.limit_id = v_row.id;
      INSERT INTO idemq.limit_slots (limit_id, slot, size, held)
      SELECT v_row.id, nextval('idemq.limit_slot_numbers'), 0, count(*)
      FROM idemq.jobs j
      WHERE j.state = 'processing'
        AND ((v_kind = 'queue' AND j.queue = v_name) OR (v_kind = 'task' AND j.task = v_name))
      RETURNING slot INTO v_first;
    END IF;
    UPDATE idemq.limits AS l SET concurrency = set_limit.concurrency, first_slot = coalesce(v_first, l.first_slot)
    WHERE l.id = v_row.id;
    -- Raised: room for the new slots; lowered below what runs: no room until
    -- fewer than the new limit run (_size_slots).
    PERFORM idemq._size_slots(v_row.id, set_limit.concurrency);
    v_row.concurrency := set_limit.concurrency;
  END IF;

  IF set_limit.rate IS NOT NULL THEN
    v_rows := coalesce(v_row.rate, 0);
    IF set_limit.rate > v_rows THEN
      INSERT INTO idemq.limit_starts (limit_id, n, per)
      SELECT v_row.id, coalesce((SELECT max(r.n) FROM idemq.limit_starts r WHERE r.limit_id = v_row.id), 0) + g, set_limit.per
      FROM generate_series(1, set_limit.rate - v_rows) g;
    ELSIF set_limit.rate < v_rows THEN
      -- Keep the rows used last: a start after the change waits for one of
      -- them, and every row deleted was used before all of them.
      DELETE FROM idemq.limit_starts r
      WHERE r.limit_id = v_row.id
        AND r.n IN (SELECT o.n FROM idemq.limit_starts o WHERE o.limit_id = v_row.id
                    ORDER BY o.started_at, o.n LIMIT v_rows - set_limit.rate);
    END IF;
    UPDATE idemq.limit_starts r SET per = set_limit.per WHERE r.limit_id = v_row.id AND r.per <> set_limit.per;
    v_row.rate := set_limit.rate;
    v_row.per := set_limit.per;
  END IF;

  UPDATE idemq.limits l
  SET concurrency = v_row.concurrency, rate = v_row.rate, per = v_row.per,
      per_key = coalesce(set_limit.per_key, l.per_key), updated_at = now()
  WHERE l.id = v_row.id;
  -- A raised per_key: the scope's keys with jobs waiting get their room now.
  IF set_limit.per_key > 1 THEN
    PERFORM idemq._key_promote(ARRAY(
      SELECT DISTINCT w.concurrency_key FROM idemq.jobs w
      WHERE w.concurrency_key IS NOT NULL AND w.state = 'awaiting'
        AND CASE v_kind WHEN 'queue' THEN w.queue ELSE w.task END = v_name));
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.set_limit(text, text, int, int, interval, int) IS
  'Set the flow control of one queue or task: concurrency (at most N processing), rate per per (starts per period), per_key; fields left NULL are kept.';
