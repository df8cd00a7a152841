-- idemq._pairs_by_id(job_ids bigint[], attempts int[], operation text, null_hint text,
--   OUT ids bigint[], OUT attempts_by_id int[])
--
-- Checks the (job_ids[i], attempts[i]) pairs of complete_many and heartbeat,
-- and returns them sorted by id for width_bucket():
-- attempts_by_id[width_bucket(id, ids)] is the attempt given for id, found by
-- binary search.
--
-- Guarantees: the one definition of a valid pair list (both arrays given, of
--   equal length, at most 10000 ids), checked in the call that sorts it, so
--   the callers pay no second function call. Each id once, with its highest
--   attempt (attempts only grow: only the latest can hold the job); NULL ids
--   dropped; empty arrays for no pairs. Messages name `operation`, the
--   function the user called; `null_hint` is the HINT of the NULL case.
-- Concurrency: none (reads only its arguments).
-- Errors: 22004 job_ids or attempts NULL; 22023 arrays of different lengths
--   or more than 10000 ids.
-- Tests: test/sql/complete.test.ts, test/sql/heartbeat.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq._pairs_by_id(job_ids bigint[], attempts int[], operation text, null_hint text,
                                              OUT ids bigint[], OUT attempts_by_id int[])
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
  -- plpgsql, not LANGUAGE sql: a SQL function with a SET clause is never
  -- inlined, and PostgreSQL 15-17 parse and plan its body again at every
  -- call from complete_many's or heartbeat's statement (18 caches it);
  -- plpgsql keeps the plan for the session. As LANGUAGE sql, `npm run bench
  -- -- profile` (process.c10, 20,000 jobs, PG15): 180 us per call, 19.3 us
  -- per completed job.
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}')
    INTO ids, attempts_by_id
  FROM (SELECT u.id, max(u.attempt) AS attempt
        FROM unnest(job_ids, attempts) AS u(id, attempt)
        WHERE u.id IS NOT NULL
        GROUP BY u.id) t;
END;
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[], text, text) IS
  'Check (job_id, attempt) pairs and sort them by id, each id once with its highest attempt, for width_bucket() lookups.';
