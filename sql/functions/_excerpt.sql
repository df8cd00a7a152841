-- idemq._excerpt(value text) RETURNS text
--
-- What an error message quotes of an input: its first 60 characters, with
-- "… (N characters)" when it was longer.
--
-- Guarantees: at most 60 characters of `value` and a short suffix, so a bad
--   input of any size makes an error message of bounded size; NULL gives
--   'NULL'. The full value stays in DETAIL where the contract puts it there.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._excerpt(value text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN value IS NULL THEN 'NULL'
            WHEN length(value) <= 60 THEN value
            ELSE left(value, 60) || format('… (%s characters)', length(value)) END;

COMMENT ON FUNCTION idemq._excerpt(text) IS
  'The first 60 characters of an input, for error messages (bounded whatever the input).';
