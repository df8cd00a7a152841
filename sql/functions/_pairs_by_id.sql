-- idemq._pairs_by_id(job_ids bigint[], attempts int[], OUT ids bigint[], OUT attempts_by_id int[])
--
-- The (job_ids[i], attempts[i]) pairs of complete_many and heartbeat, sorted
-- by id for width_bucket(): attempts_by_id[width_bucket(id, ids)] is the
-- attempt given for id, found by binary search.
--
-- Guarantees: each id once, with its highest attempt (attempts only grow: only
--   the latest can hold the job); NULL ids dropped; empty arrays for no pairs.
-- Concurrency: none (reads only its arguments).
-- Errors: none (callers check lengths).
-- Tests: test/sql/complete.test.ts, test/sql/heartbeat.test.ts
CREATE OR REPLACE FUNCTION idemq._pairs_by_id(job_ids bigint[], attempts int[],
                                              OUT ids bigint[], OUT attempts_by_id int[])
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
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

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[]) IS
  '(job_id, attempt) pairs sorted by id, each id once with its highest attempt, for width_bucket() lookups.';
