-- idemq._excerpt(value text) RETURNS text
--
-- What an error message quotes of an input: its first 60 characters, with
-- "… (N characters)" when it was longer, control characters escaped.
--
-- Guarantees: at most 60 characters of `value` and a short suffix, so a bad
--   input of any size makes an error message of bounded size; NULL gives
--   'NULL'. A control character (U+0001-U+001F, U+007F-U+009F: newline, ESC,
--   CSI...) comes out as \n, \r, \t or \u00XX, so an input can neither
--   forge a log line nor drive a terminal; every other character, quotes and
--   backslashes included, is quoted as it is (an input that is JSON text, as
--   _backoff_problem quotes, reads as written). The full value stays in
--   DETAIL where the contract puts it there.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._excerpt(value text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN value IS NULL THEN 'NULL'
            -- Cut first, then escape: a cut never splits an escape sequence.
            WHEN left(value, 60) !~ '[\u0001-\u001f\u007f-\u009f]' THEN left(value, 60)
            ELSE (SELECT string_agg(CASE WHEN s.c !~ '[\u0001-\u001f\u007f-\u009f]' THEN s.c
                                         WHEN s.c = E'\n' THEN '\n' WHEN s.c = E'\r' THEN '\r' WHEN s.c = E'\t' THEN '\t'
                                         ELSE format('\u%s', lpad(to_hex(ascii(s.c)), 4, '0')) END, '' ORDER BY s.n)
                    FROM regexp_split_to_table(left(value, 60), '') WITH ORDINALITY AS s(c, n))
       END || CASE WHEN length(value) > 60 THEN format('… (%s characters)', length(value)) ELSE '' END;

COMMENT ON FUNCTION idemq._excerpt(text) IS
  'The first 60 characters of an input, control characters escaped, for error messages (bounded and inert whatever the input).';
