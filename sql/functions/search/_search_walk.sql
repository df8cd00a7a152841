-- idemq._search_walk() RETURNS int
--
-- How many of the newest ids (below a search's before_id) _matching_jobs
-- walks in primary-key order before it scans the rest of the table
-- unordered: the size of a search's first pass.
--
-- Guarantees: 20000. A walk of 20,000 rows costs 5-10 ms at 1,000,000
--   jobs (bench/FINDINGS.md, "Search: the walk and the scan"), so a search
--   whose matches are common answers from it; one whose matches are rare
--   pays that much before the parallel scan, not a walk of the whole table.
--   A constant function inlines.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/find-jobs.test.ts
CREATE OR REPLACE FUNCTION idemq._search_walk()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 20000;

COMMENT ON FUNCTION idemq._search_walk() IS
  'How many of the newest ids a search walks in order before it scans the rest unordered (20,000).';
