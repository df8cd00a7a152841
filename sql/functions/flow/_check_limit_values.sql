-- idemq._check_limit_values(operation text, concurrency int, rate int, per interval, per_key int) RETURNS void
--
-- The value rules of a flow-control limit, written once for the calls that
-- take one (set_limit, declare_limit). The table's CHECKs
-- (limits_concurrency_range, limits_rate_range, limits_per_at_least_a_second,
-- limits_rate_has_per, limits_per_key_range) hold the same bounds on the
-- rows; this words a refusal before anything is written.
--
-- Guarantees: returns only when each value given is in range: concurrency
--   and per_key 1..10000, rate 1..100000, per at least 1 second and within
--   duration_days (_check_duration), rate and per both or neither. NULL
--   means not given and is not checked.
-- Concurrency: none (reads the settings).
-- Errors: 22023 a value out of range, rate without per or per without rate;
--   each naming `operation` with a HINT.
-- Tests: test/sql/flow-control.test.ts, test/worker/declared-limits.test.ts
CREATE OR REPLACE FUNCTION idemq._check_limit_values(operation text, concurrency int, rate int, per interval, per_key int)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_limit_values.concurrency NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: concurrency must be between 1 and 10000, not %s', operation, _check_limit_values.concurrency),
      HINT = 'concurrency is how many jobs of the scope may process at once; pause() stops them all.';
  END IF;
  IF _check_limit_values.rate NOT BETWEEN 1 AND 100000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: rate must be between 1 and 100000, not %s', operation, _check_limit_values.rate),
      HINT = 'rate is how many jobs of the scope may start per period (per); pause() stops them all.';
  END IF;
  IF (_check_limit_values.rate IS NULL) <> (_check_limit_values.per IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: rate and per go together, got %s without %s', operation,
                       CASE WHEN _check_limit_values.rate IS NULL THEN 'per' ELSE 'rate' END,
                       CASE WHEN _check_limit_values.rate IS NULL THEN 'rate' ELSE 'per' END),
      HINT = 'A rate limit is rate starts per period, e.g. rate => 100, per => ''1 minute''.';
  END IF;
  IF _check_limit_values.per < interval '1 second' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: per must be at least 1 second, not %s', operation, _check_limit_values.per),
      HINT = 'Scale both: 10 per 100 milliseconds is rate => 100, per => ''1 second''.';
  END IF;
  PERFORM idemq._check_duration(operation, 'per', _check_limit_values.per);
  IF _check_limit_values.per_key NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: per_key must be between 1 and 10000, not %s', operation, _check_limit_values.per_key),
      HINT = 'per_key is how many jobs with one concurrency key may process at once (1: one at a time).';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_limit_values(text, int, int, interval, int) IS
  'The value rules of a flow-control limit (set_limit, declare_limit): 22023 with a HINT for a value out of range.';
