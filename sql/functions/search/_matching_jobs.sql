-- idemq._matching_jobs(operation text, filter jsonb, states idemq.job_state[], before_id bigint, max_rows int)
--   RETURNS SETOF bigint
--
-- The ids of the jobs a filter matches, newest first (id descending), below
-- before_id when given, at most max_rows: the one query behind find_jobs,
-- count_jobs and the bulk actions. `states` narrows the filter's own state
-- list further (an action's eligible states, _action_states), NULL for none.
--
-- Guarantees:
--   * Checks the filter first (_check_job_filter): a bad one raises and
--     nothing is read.
--   * Fields are ANDed; state, and states, match any state listed; error is
--     a case-insensitive substring of the last entry of the job's error
--     history ("class: message"); created_* and finished_* are half-open
--     ranges [after, before); payload is containment (jobs.payload @> payload).
--   * Which index serves which search (a page of 50 at 1,000,000 jobs, 2
--     cores under a load average of 7-11: bench/search-cost.mjs, numbers in
--     bench/FINDINGS.md, "Search and bulk actions at 1,000,000 jobs" and
--     "The jobs page without its count"):
--     ids: the primary key (3 ms). Terminal states with finished_after or
--     finished_before: jobs_by_finish (state, finished_at), the range read
--     and sorted (11-23 ms; 167-367 ms for 140,000 succeeded), as
--     `finished_at IS NOT NULL` is added for them (a CHECK implies it; the
--     planner cannot see a CHECK). error: the partial index
--     jobs_with_errors, only jobs with an error history read (9-15 ms
--     common, 36-189 ms for one among 20,000). Everything else (state,
--     task, queue, key, concurrency_key, created_*, payload) walks the
--     primary key backwards from before_id and stops at a page of matches:
--     fast when matches are common (a state, a task among 20, a queue and
--     task, created_after an hour ago: 4-23 ms), one scan of the table when
--     they are rare or none (a rare task or key, an old created_before, a
--     rare payload: 0.4-1.1 s under that load, about 150 ms on a quiet
--     machine). No index is added for those: (task, id) and a partial
--     index on idempotency_key together cost a job's life 17% more CPU and
--     49% more WAL (the key index alone, one job in ten keyed, 2% and 3%,
--     within the noise). payload is tested only on the jobs the cheaper
--     fields leave (it needs task, key or ids beside it).
-- Concurrency: a plain read (one snapshot); no locks.
-- Errors: _check_job_filter's (22004, 22023).
-- Tests: test/sql/find-jobs.test.ts, test/sql/bulk-actions.test.ts
CREATE OR REPLACE FUNCTION idemq._matching_jobs(operation text, filter jsonb, states idemq.job_state[],
                                                before_id bigint, max_rows int)
RETURNS SETOF bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
-- Planner trap: one static statement serves every filter, each unset field
-- an `x IS NULL OR ...` term. A generic plan cannot drop those terms and
-- plans for every field at once (a scan); a custom plan is made with the
-- values, folds the unset terms away and picks the index of the fields set.
-- A search is an operator's, never a hot path: planning each call is cheap.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_states idemq.job_state[];
  v_error text;
  v_unordered boolean;
BEGIN
  PERFORM idemq._check_job_filter(operation, filter);
  IF filter ? 'ids' THEN
    v_ids := ARRAY(SELECT (e #>> '{}')::bigint FROM jsonb_array_elements(filter->'ids') AS e);
  END IF;
  IF filter ? 'state' THEN
    v_states := ARRAY(SELECT (e #>> '{}')::idemq.job_state FROM jsonb_array_elements(filter->'state') AS e);
  END IF;
  IF _matching_jobs.states IS NOT NULL THEN
    v_states := ARRAY(SELECT s FROM unnest(coalesce(v_states, _matching_jobs.states)) AS s
                      WHERE s = ANY (_matching_jobs.states));
  END IF;
  v_error := lower(filter->>'error');
  v_unordered := filter ? 'created_before'
                 OR (coalesce(v_states <@ idemq.terminal_states(), false)
                     AND (filter ? 'finished_after' OR filter ? 'finished_before'));

  RETURN QUERY
  SELECT j.id
  FROM idemq.jobs j
  WHERE (v_ids IS NULL OR j.id = ANY (v_ids))
    AND (v_states IS NULL OR j.state = ANY (v_states))
    -- Finished states only: say finished_at is set, so jobs_by_finish serves them.
    AND (NOT coalesce(v_states <@ idemq.terminal_states(), false) OR j.finished_at IS NOT NULL)
    AND (filter->>'task' IS NULL OR j.task = filter->>'task')
    AND (filter->>'queue' IS NULL OR j.queue = filter->>'queue')
    AND (filter->>'key' IS NULL OR j.idempotency_key = filter->>'key')
    AND (filter->>'concurrency_key' IS NULL OR j.concurrency_key = filter->>'concurrency_key')
    AND (filter->>'created_after' IS NULL OR j.created_at >= (filter->>'created_after')::timestamptz)
    AND (filter->>'created_before' IS NULL OR j.created_at < (filter->>'created_before')::timestamptz)
    AND (filter->>'finished_after' IS NULL OR j.finished_at >= (filter->>'finished_after')::timestamptz)
    AND (filter->>'finished_before' IS NULL OR j.finished_at < (filter->>'finished_before')::timestamptz)
    -- `errors <> '[]'` is the predicate of jobs_with_errors.
    AND (v_error IS NULL OR (j.errors <> '[]'::jsonb
         AND strpos(lower(concat_ws(': ', j.errors->-1->>'class', j.errors->-1->>'message')), v_error) > 0))
    -- Planner trap: at one operator's cost each, the plan tested @> before
    -- `task =` on every row (865 ms against 494 for the task alone, at
    -- 1,000,000 jobs under load); as a CASE the match costs more, so the
    -- task's test runs first and @> only on that task's jobs.
    AND (filter->'payload' IS NULL
         OR CASE WHEN filter->>'task' IS NULL OR j.task = filter->>'task'
                 THEN j.payload @> (filter->'payload') ELSE false END)
    AND (_matching_jobs.before_id IS NULL OR j.id < _matching_jobs.before_id)
  -- Planner trap: created_at and finished_at grow with id, which the
  -- planner does not know; walking the primary key for old jobs read
  -- 778,000 rows to find 51 (finished_before: 549 ms; created_before 6 days
  -- back: 2.1 s). With a finished range (and terminal states) or a
  -- created_before, j.id + 0 takes the index order away: the range is read
  -- from jobs_by_finish and sorted (17-22 ms), or the table is scanned in
  -- parallel and the newest kept (created_before: no index serves it). A
  -- custom plan folds the CASE to one of its arms.
  ORDER BY CASE WHEN v_unordered THEN j.id + 0 ELSE j.id END DESC
  LIMIT _matching_jobs.max_rows;
END;
$$;

COMMENT ON FUNCTION idemq._matching_jobs(text, jsonb, idemq.job_state[], bigint, int) IS
  'The ids of the jobs a filter matches (checked first), newest first, below before_id, at most max_rows.';
