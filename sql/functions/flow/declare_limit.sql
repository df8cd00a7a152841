-- idemq.declare_limit(task text, concurrency int DEFAULT NULL, rate int DEFAULT NULL, per interval DEFAULT NULL)
--   RETURNS TABLE(stored_concurrency int, stored_rate int, stored_per interval, applied boolean)
--
-- A worker's declared limits of one task (the task config's concurrencyLimit
-- and rateLimit), applied at its start: each is set when the task has none
-- stored or a higher one, never raised.
--
-- Guarantees:
--   * Lower only: concurrency is set when none is stored or the stored one is
--     higher; rate with per when none is stored or the declared one allows
--     fewer starts per second (rate / per below the stored one's). Whatever
--     it writes goes through set_limit, so its guarantees hold (a lowered
--     limit drains). It never raises a limit and never clears one: workers
--     that disagree during a rolling deploy leave the lowest declared (or an
--     operator's lower) limit stored, so nothing runs over the lower one.
--     Raising a declared limit is an operator's act (set_limit, the CLI, the
--     dashboard), and a worker declaring less lowers it again at its start.
--   * It touches only the task's concurrency, rate and per: per_key, a pause
--     and the task's queue are left as they are.
--   * Returns the task's concurrency, rate and per stored after the call
--     (NULL when not set), and applied: true when it wrote something.
--   * The worker role may call it (a member cannot otherwise change a limit):
--     it can only lower the limits of a task it names.
-- Concurrency: declarers of one task take a transaction-scoped advisory lock
--   on its name, so two workers starting at once are applied one after the
--   other and the lower stands; set_limit's locks follow.
-- Errors: 22023 an empty or too long task name (_limit_scope), no limit
--   given, rate without per or per without rate, a value outside set_limit's
--   ranges or per over duration_days (_check_limit_values, whether or not it
--   would be applied).
-- Tests: test/worker/declared-limits.test.ts
CREATE OR REPLACE FUNCTION idemq.declare_limit(task text, concurrency int DEFAULT NULL, rate int DEFAULT NULL,
                                               per interval DEFAULT NULL)
RETURNS TABLE(stored_concurrency int, stored_rate int, stored_per interval, applied boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
  v_row idemq.limits;
  v_concurrency int;
  v_rate int;
  v_per interval;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('declare_limit', NULL, declare_limit.task) s;
  IF declare_limit.concurrency IS NULL AND declare_limit.rate IS NULL AND declare_limit.per IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'declare_limit: give concurrency, or rate with per',
      HINT = 'e.g. declare_limit(task => ''send-email'', concurrency => 5, rate => 100, per => ''1 minute'').';
  END IF;
  -- set_limit's rules: a declared value is refused even where a lower
  -- stored one means it would not be applied.
  PERFORM idemq._check_limit_values('declare_limit', declare_limit.concurrency, declare_limit.rate, declare_limit.per, NULL);

  PERFORM pg_advisory_xact_lock(hashtextextended('idemq.declare_limit ' || v_name, 0));
  SELECT l.* INTO v_row FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name;
  IF declare_limit.concurrency IS NOT NULL
     AND (v_row.concurrency IS NULL OR declare_limit.concurrency < v_row.concurrency) THEN
    v_concurrency := declare_limit.concurrency;
  END IF;
  -- Fewer starts per second: rate / per < stored rate / stored per, compared
  -- without division.
  IF declare_limit.rate IS NOT NULL
     AND (v_row.rate IS NULL
          OR declare_limit.rate::numeric * extract(epoch FROM v_row.per)
             < v_row.rate::numeric * extract(epoch FROM declare_limit.per)) THEN
    v_rate := declare_limit.rate;
    v_per := declare_limit.per;
  END IF;
  IF v_concurrency IS NOT NULL OR v_rate IS NOT NULL THEN
    PERFORM idemq.set_limit(task => v_name, concurrency => v_concurrency, rate => v_rate, per => v_per);
  END IF;
  RETURN QUERY
  SELECT l.concurrency, l.rate, l.per, v_concurrency IS NOT NULL OR v_rate IS NOT NULL
  FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name
  UNION ALL
  SELECT NULL::int, NULL::int, NULL::interval, false
  WHERE NOT EXISTS (SELECT FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name);
END;
$$;

COMMENT ON FUNCTION idemq.declare_limit(text, int, int, interval) IS
  'A worker''s declared limits of one task: set when none is stored or the stored one is higher, never raised; returns what is stored and whether it wrote.';
