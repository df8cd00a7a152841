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
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}')
  FROM (SELECT u.id, max(u.attempt) AS attempt
        FROM unnest(job_ids, attempts) AS u(id, attempt)
        WHERE u.id IS NOT NULL
        GROUP BY u.id) t
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[]) IS
  '(job_id, attempt) pairs sorted by id, each id once with its highest attempt, for width_bucket() lookups.';
