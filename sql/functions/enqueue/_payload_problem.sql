-- idemq._payload_problem(payload jsonb, payload_bytes bigint) RETURNS text[]
--
-- The wording of rule 4 of _job_rule_broken (a payload over payload_bytes
-- bytes of JSON text), for _job_problem: ARRAY[problem, hint].
--
-- Why a function of its own: the problem names the JSON text's exact size
-- and quotes its start, and each `payload::text` prints the whole payload
-- again. Written inline, _job_problem printed it twice (its size, its
-- excerpt) after _job_rule_broken had printed it once: three copies of a
-- refused 100 MB payload's text. Here it is printed once, into a variable
-- (a PL/pgSQL function, so no inlining puts the expression back in twice).
--
-- Guarantees:
--   * ARRAY['payload is <N> bytes of JSON text, over the limit of <payload_bytes>
--     bytes (payload_bytes): <excerpt>', <hint>], N the bytes of the JSON text
--     as PostgreSQL prints it (what claim hands a worker), the excerpt
--     _excerpt's.
--   * Called only for a payload _job_rule_broken found over the limit.
-- Concurrency: none (reads only its arguments).
-- Errors: none.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._payload_problem(payload jsonb, payload_bytes bigint)
RETURNS text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_text text := _payload_problem.payload::text;
BEGIN
  RETURN ARRAY[format('payload is %s bytes of JSON text, over the limit of %s bytes (payload_bytes): %s',
                      octet_length(v_text), _payload_problem.payload_bytes, idemq._excerpt(v_text)),
               'Store large data elsewhere (a table, object storage) and put its id in the payload; '
               'an admin can raise payload_bytes in idemq.settings.'];
END;
$$;

COMMENT ON FUNCTION idemq._payload_problem(jsonb, bigint) IS
  'The problem and hint of a payload over payload_bytes, its JSON text printed once.';
