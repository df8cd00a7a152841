-- idemq._pairs_by_id(job_ids bigint[], attempts int[], lease_tokens uuid[], operation text,
--   null_hint text, OUT ids bigint[], OUT attempts_by_id int[], OUT tokens_by_id uuid[])
--
-- Checks the (job_ids[i], attempts[i], lease_tokens[i]) entries of
-- complete_many and heartbeat, and returns them sorted by id for
-- width_bucket(): attempts_by_id[width_bucket(id, ids)] is the attempt given
-- for id, tokens_by_id[...] its lease token, found by binary search.
--
-- Guarantees: the one definition of a valid entry list (job_ids and attempts
--   given, lease_tokens given or NULL, all of equal length, at most 10000
--   ids), checked in the call that sorts it, so the callers pay no second
--   function call. lease_tokens NULL is a NULL token for every id (attempts
--   claimed before 0.2.0 have none). Each id once, with its highest attempt
--   and that entry's token (attempts only grow: only the latest can hold the
--   job); NULL ids dropped; empty arrays for no entries. Messages name
--   `operation`, the function the user called; `null_hint` is the HINT of
--   the NULL case.
-- Concurrency: none (reads only its arguments).
-- Errors: 22004 job_ids or attempts NULL; 22023 arrays of different lengths
--   or more than 10000 ids.
-- Tests: test/sql/complete.test.ts, test/sql/heartbeat.test.ts, test/sql/bad-input.test.ts,
--   test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq._pairs_by_id(job_ids bigint[], attempts int[], lease_tokens uuid[],
                                              operation text, null_hint text,
                                              OUT ids bigint[], OUT attempts_by_id int[], OUT tokens_by_id uuid[])
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF job_ids IS NULL OR attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_ids and attempts must not be NULL', operation),
      HINT = null_hint;
  END IF;
  IF cardinality(job_ids) <> cardinality(attempts) OR cardinality(job_ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: job_ids (%s) and attempts (%s) must have the same length, at most 10000',
                       operation, cardinality(job_ids), cardinality(attempts)),
      HINT = 'attempts[i] is the attempt that claimed job_ids[i].';
  END IF;
  IF cardinality(lease_tokens) <> cardinality(job_ids) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: job_ids (%s) and lease_tokens (%s) must have the same length',
                       operation, cardinality(job_ids), cardinality(lease_tokens)),
      HINT = 'lease_tokens[i] is the lease_token claim() returned with job_ids[i].';
  END IF;
  -- plpgsql, not LANGUAGE sql: a SQL function with a SET clause is never
  -- inlined, and PostgreSQL 15-17 parse and plan its body again at every
  -- call from complete_many's or heartbeat's statement (18 caches it);
  -- plpgsql keeps the plan for the session. As LANGUAGE sql, `npm run bench
  -- -- profile` (process.c10, 20,000 jobs, PG15): 180 us per call, 19.3 us
  -- per completed job.
  -- unnest pads a NULL lease_tokens with NULLs: a NULL token for each id.
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}'),
         coalesce(array_agg(t.token ORDER BY t.id), '{}')
    INTO ids, attempts_by_id, tokens_by_id
  FROM (SELECT DISTINCT ON (u.id) u.id, u.attempt, u.token
        FROM unnest(job_ids, attempts, lease_tokens) AS u(id, attempt, token)
        WHERE u.id IS NOT NULL
        ORDER BY u.id, u.attempt DESC NULLS LAST, u.token) t;
END;
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[], uuid[], text, text) IS
  'Check (job_id, attempt, lease_token) entries and sort them by id, each id once with its highest attempt, for width_bucket() lookups.';
