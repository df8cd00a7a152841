-- idemq._duration_buckets() RETURNS float8[]
--
-- The bounds, in milliseconds, of the buckets idemq.job_minutes counts run
-- and wait times in: bucket k (width_bucket of the duration over these
-- bounds, 0 to 21) holds the durations from bound k (0 for k = 0) up to
-- bound k + 1.
--
-- Guarantees: the same array on every call, ascending. Roughly three
--   buckets per power of ten, from 1 ms to 5,000 s (83 minutes): a
--   percentile read from them (_duration_percentile) is the bucket's upper
--   bound, at most 2.5 times the true value. Fixed, so the buckets of any
--   minutes, queues and tasks add up.
-- Concurrency: immutable.
-- Errors: none.
-- Tests: test/sql/history.test.ts
CREATE OR REPLACE FUNCTION idemq._duration_buckets()
RETURNS float8[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{1,2,5,10,20,50,100,200,500,1000,2000,5000,10000,20000,50000,100000,200000,500000,1000000,2000000,5000000}'::float8[];

COMMENT ON FUNCTION idemq._duration_buckets() IS
  'Bounds (ms) of the run and wait time buckets of idemq.job_minutes.';
