-- Migration 0015_pairs_plpgsql (issue 15): _pairs_by_id in plpgsql, whose plan is kept per session (as a SQL function with SET, PostgreSQL 15 planned it at every complete_many and heartbeat call: 19 us per completed job).
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ (npm run migration:check compares them). Once released (listed
-- in sql/released.sha256) this file never changes again.
-- Up Migration

-- Hand-written schema changes (tables, columns, indexes) go here, before the
-- functions that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes
-- in a migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration commits
-- on its own, so the next migration can use it.

-- ---- sql/functions/_pairs_by_id.sql ----
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

-- Down Migration

-- sql/functions/_pairs_by_id.sql as of 0005_least_privilege
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

-- Hand-written reversal of the schema changes above goes here, after the functions.
