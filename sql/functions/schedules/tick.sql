-- idemq.tick() RETURNS int
--
-- Enqueues every due slot of every schedule once (see _tick for the
-- overlap and misfire rules), on the database clock. Returns how many jobs
-- it created.
--
-- Guarantees:
--   * Each slot gets at most one job, with idempotency key
--     schedule:<name>:<slot instant in UTC, YYYY-MM-DDTHH:MI:SSZ>.
--   * Idempotent: any number of workers, or pg_cron, may call it at any
--     time; no leader is needed. Call it more often than misfire_grace
--     (default 1 minute), or on-time slots count as missed.
--   * A schedule whose job enqueue refuses (a limit lowered after schedule()
--     accepted it) is skipped, its error recorded in schedules().last_error,
--     and stays due; the others fire (see _tick).
-- Concurrency: schedule rows are locked FOR UPDATE SKIP LOCKED until
--   commit: concurrent callers split the due schedules between them, and a
--   slot gets exactly one job however many call at once.
-- Errors: none of its own; a schedule's refused job is recorded, not raised
--   (see _tick).
-- Tests: test/sql/schedules-tick.test.ts, test/sql/schedules-concurrency.test.ts,
--   test/worker/ticker.test.ts
CREATE OR REPLACE FUNCTION idemq.tick()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN idemq._tick(now());
END;
$$;

COMMENT ON FUNCTION idemq.tick() IS
  'Enqueue every due schedule slot once; safe to call from any number of workers or pg_cron.';
