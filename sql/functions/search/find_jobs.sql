-- idemq.find_jobs(filter jsonb DEFAULT '{}', before_id bigint DEFAULT NULL, page_size int DEFAULT 50)
--   RETURNS SETOF idemq.job_row
--
-- One page of the jobs a filter matches, newest first: the search of the
-- dashboard, the CLI and psql. The next page is the call with before_id =
-- the last row's job_id (keyset paging: a page costs the same however deep).
--
-- Guarantees:
--   * The filter is a JSON object of fields, ANDed (_check_job_filter lists
--     them; docs/sql-api.md, "Job filters"); '{}' matches every job.
--   * Each row is what job() returns for that job (the same columns, the
--     payload only for a login that may read idemq.jobs).
--   * Which index serves which field, and what a page costs at 1,000,000
--     jobs: _matching_jobs.
-- Concurrency: a plain read; no locks.
-- Errors: 22004 NULL filter or page_size; 22023 a bad filter (the HINT
--   names the field) or page_size outside 1..1000.
-- Tests: test/sql/find-jobs.test.ts, test/sql/bad-input.test.ts
CREATE OR REPLACE FUNCTION idemq.find_jobs(filter jsonb DEFAULT '{}', before_id bigint DEFAULT NULL,
                                           page_size int DEFAULT 50)
RETURNS SETOF idemq.job_row
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN page_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('find_jobs: page_size must be between 1 and 1000, not %s', coalesce(page_size::text, 'NULL')),
      HINT = 'Ask for the next page with before_id => the last job_id of this one.';
  END IF;
  RETURN QUERY
  SELECT r.*
  FROM idemq._matching_jobs('find_jobs', filter, NULL, before_id, page_size) WITH ORDINALITY AS m(id, n)
  CROSS JOIN LATERAL idemq.job(m.id) AS r
  ORDER BY m.n;
END;
$$;

COMMENT ON FUNCTION idemq.find_jobs(jsonb, bigint, int) IS
  'One page of the jobs a filter matches, newest first; the next page starts below before_id.';
