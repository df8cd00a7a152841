-- idemq._queue_name_limit() RETURNS int
--
-- The longest queue name enqueue accepts, in characters.
--
-- Guarantees: 1000. The queue name is the NOTIFY payload (limit 8000 bytes,
--   and 1000 characters are at most 4000 bytes of UTF-8): a longer one would
--   make every later notify for the job fail (rescue included). A constant
--   function inlines, so callers compare with a literal.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/enqueue.test.ts, test/sql/predicates.test.ts
CREATE OR REPLACE FUNCTION idemq._queue_name_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1000;

COMMENT ON FUNCTION idemq._queue_name_limit() IS
  'The longest queue name enqueue accepts (1000 characters): it travels as the NOTIFY payload.';
