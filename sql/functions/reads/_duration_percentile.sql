-- idemq._duration_percentile(buckets jsonb, fraction float8) RETURNS bigint
--
-- The given percentile (fraction 0.5 for p50) of durations counted in
-- buckets ({"k": count} over _duration_buckets()), in milliseconds: the
-- upper bound of the bucket the fraction of the counts reaches.
--
-- Guarantees: NULL when the buckets count nothing. A bucket past the last
--   bound (5,000 s) gives the last bound (at least that long).
-- Concurrency: immutable.
-- Errors: none (buckets are written by roll_up only).
-- Tests: test/sql/history.test.ts
CREATE OR REPLACE FUNCTION idemq._duration_percentile(buckets jsonb, fraction float8)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
  SELECT (idemq._duration_buckets())[least(c.k + 1, cardinality(idemq._duration_buckets()))]::bigint
  FROM (
    SELECT b.key::int AS k,
           sum(b.value::bigint) OVER (ORDER BY b.key::int) AS below,
           sum(b.value::bigint) OVER () AS total
    FROM jsonb_each_text(buckets) b
  ) c
  WHERE c.below >= fraction * c.total AND c.total > 0
  ORDER BY c.k
  LIMIT 1;
END;

COMMENT ON FUNCTION idemq._duration_percentile(jsonb, float8) IS
  'A percentile (ms, a bucket''s upper bound) of durations counted in _duration_buckets() buckets.';
