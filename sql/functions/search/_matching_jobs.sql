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
--   * Which index serves which search (a page of 50 at 1,000,000 jobs:
--     bench/search-cost.mjs, numbers in bench/FINDINGS.md, "Search: the
--     walk and the scan"): ids: the primary key (1-2 ms). Terminal states
--     with finished_after or finished_before: jobs_by_finish (state,
--     finished_at), the range read and sorted (4-20 ms; 60-120 ms for
--     140,000 succeeded), as `finished_at IS NOT NULL` is added for them (a
--     CHECK implies it; the planner cannot see a CHECK). error: the partial
--     index jobs_with_errors, only jobs with an error history read (4-8 ms
--     common, 30-75 ms for one among 20,000). created_before: a parallel
--     scan of the table, the newest kept (155 ms quiet, 240-300 at a load of
--     6-8). Everything else (state, task, queue, key, concurrency_key,
--     created_after, payload) in two passes: the primary key walked
--     backwards over the newest _search_walk() ids, stopping at a page of
--     matches (common matches: 2-10 ms), then, when the page is not full,
--     the rest of the table scanned in parallel and the newest kept (rare
--     or no matches: a key, a task matching nothing, a rare payload:
--     125-255 ms at that load). No index is added for those: (task, id)
--     and a partial index on idempotency_key together cost a job's life 17%
--     more CPU and 49% more WAL. payload is tested only on the jobs the
--     cheaper fields leave (it needs task, key or ids beside it).
--   * The passes' id ranges are disjoint and in order: the rows come out
--     newest first, at most max_rows in all.
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
  v_created_after timestamptz;
  v_created_before timestamptz;
  v_finished_after timestamptz;
  v_finished_before timestamptz;
  v_unordered boolean;
  -- The pass: its id range [v_from, v_below) and how many it may still return.
  v_from bigint;
  v_below bigint := _matching_jobs.before_id;
  v_left int := _matching_jobs.max_rows;
  v_found int;
BEGIN
  PERFORM idemq._check_job_filter(operation, filter);
  v_created_after := (filter->>'created_after')::timestamptz;
  v_created_before := (filter->>'created_before')::timestamptz;
  v_finished_after := (filter->>'finished_after')::timestamptz;
  v_finished_before := (filter->>'finished_before')::timestamptz;
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

  -- Planner trap: a search whose matches are rare or none (a key, a task
  -- matching nothing, a payload) walked the primary key newest first to the
  -- end of the table, testing each row in its heap order (task + payload
  -- matching nothing: 288-449 ms at 1,000,000 jobs), where a parallel scan
  -- keeping the newest reads it in 150-190. Common matches are found at the
  -- top of the walk (2-10 ms). So an ordered search runs in two passes: the
  -- walk over the newest _search_walk() ids, then, if the page is not full,
  -- the rest unordered (scanned and the newest kept). The passes' id ranges
  -- are disjoint and in order, so their rows come out newest first.
  IF NOT v_unordered AND v_ids IS NULL THEN
    v_from := coalesce(v_below, (SELECT max(j.id) + 1 FROM idemq.jobs j)) - idemq._search_walk();
  END IF;

  LOOP
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
    -- Planner trap: text -> timestamptz is a stable cast, never folded into
    -- a constant, so `(filter->>'created_before')::timestamptz` in the query
    -- parsed the text again for every row scanned (created_before 6 days
    -- back: 545 ms against 155, at 1,000,000 jobs); the locals are parsed once.
    AND (v_created_after IS NULL OR j.created_at >= v_created_after)
    AND (v_created_before IS NULL OR j.created_at < v_created_before)
    AND (v_finished_after IS NULL OR j.finished_at >= v_finished_after)
    AND (v_finished_before IS NULL OR j.finished_at < v_finished_before)
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
    AND (v_below IS NULL OR j.id < v_below)
    AND (v_from IS NULL OR j.id >= v_from)
  -- Planner trap: created_at and finished_at grow with id, which the
  -- planner does not know; walking the primary key for old jobs read
  -- 778,000 rows to find 51 (finished_before: 549 ms; created_before 6 days
  -- back: 2.1 s). With a finished range (and terminal states) or a
  -- created_before, j.id + 0 takes the index order away: the range is read
  -- from jobs_by_finish and sorted (17-22 ms), or the table is scanned in
  -- parallel and the newest kept (created_before: no index serves it). A
  -- custom plan folds the CASE to one of its arms.
  ORDER BY CASE WHEN v_unordered THEN j.id + 0 ELSE j.id END DESC
  LIMIT v_left;
  GET DIAGNOSTICS v_found = ROW_COUNT;
  v_left := v_left - v_found;
  EXIT WHEN v_from IS NULL OR v_left = 0;
  -- The second pass: below the walk, unordered.
  v_below := v_from;
  v_from := NULL;
  v_unordered := true;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._matching_jobs(text, jsonb, idemq.job_state[], bigint, int) IS
  'The ids of the jobs a filter matches (checked first), newest first, below before_id, at most max_rows.';
