-- idemq.spawn(job_id bigint, attempt int, children jsonb, lease_token uuid DEFAULT NULL,
--   fail_fast boolean DEFAULT false)
--   RETURNS TABLE(name text, child_job_id bigint, state idemq.job_state, result jsonb,
--                 last_error jsonb, outcome text)
--
-- Fan-out: the job this attempt holds enqueues child jobs, each named, and
-- links them to itself (job_children), so that its wait_for_children parks
-- it until they have finished and children() then hands it their outcomes.
-- `children` is a JSON array of objects: a "name" (unique among the job's
-- children, 1 to 200 characters) and enqueue_many's fields (task, payload,
-- queue, ...), checked by the same rules.
--
-- Guarantees:
--   * Idempotent by name: a child whose name the job has linked already (an
--     earlier call, or an earlier attempt: a replay after a crash or a park)
--     is not enqueued again; its row says `existing`. The others are
--     enqueued in one enqueue_many pipeline (`created`, or `deduplicated`
--     onto the active job of their idempotency key, which is
--     linked then); a child its key's duplicate policy rejects, or whose key
--     is held for different work, raises IQ409 and nothing is spawned.
--   * Returns one row per element of `children`, in their order: the child's
--     id, its state now (its terminal state once it finished), its result
--     (succeeded) or latest error entry (failed, expired, cancelled), and
--     the outcome of this call for it.
--   * Counts the job's unfinished children (child_waits) in the same
--     transaction as their links; `fail_fast` (the latest call's) says
--     whether the first unsuccessful child ends the wait. A child that
--     finished before its link was written (deduplicated onto a job that
--     finished meanwhile, or cancelled at once because a parent in its
--     `after` had not succeeded) counts as finished.
--   * Linear in the number of children: one pipeline that writes each new
--     child once (has_children set at insert, so its finish runs the jobs
--     trigger), one INSERT of links, one upsert of the count
--     (_link_children); only children deduplicated onto existing jobs are
--     updated. Measured (bench/fanout-cost.mjs; bench/FINDINGS.md, "Fan-out
--     and fan-in at 20,000 children"): 2,000 children 40 ms of backend CPU,
--     20,000 410 ms (about 20 us a child, 2x a plain enqueue_many's), wall
--     0.6-2.3 s at load average 10-16 on 2 cores.
--   * Fenced by (job_id, attempt, lease_token) as complete(): IQ410 and
--     nothing written when the attempt no longer holds the job.
-- Concurrency: locks the job's row, then the deduplicated children's rows
--   (in id order) before it reads their state, so a child finishing at
--   the same time either finished before (read so) or finds the link.
--   Children enqueued here are visible, and may run, once the caller
--   commits; call it outside a handler's transaction to let them start
--   while the handler goes on.
-- Errors: 22004 job_id, attempt, children or fail_fast NULL; 22023 children
--   not an array of objects, a name missing, not a string, empty, over 200
--   characters or given twice, or an element enqueue_many refuses (its
--   message names it as jobs[N]: the N-th child of the call not linked
--   before); IQ409 a child rejected by its key (DETAIL: key,
--   existing_job_id, existing_state, name); IQ404 no such job; IQ410 lease lost.
-- Tests: test/sql/children.test.ts, test/worker/fan-out.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts,
--   test/worker/workflow-faults.test.ts
CREATE OR REPLACE FUNCTION idemq.spawn(job_id bigint, attempt int, children jsonb, lease_token uuid DEFAULT NULL,
                                       fail_fast boolean DEFAULT false)
RETURNS TABLE(name text, child_job_id bigint, state idemq.job_state, result jsonb, last_error jsonb, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_problem text;
  v_new jsonb;
  v_new_names text[];
  v_parsed record;
  v_planned idemq._planned_job[];
  v_refused record;
  v_message text;
BEGIN
  IF spawn.children IS NULL OR spawn.fail_fast IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('spawn: %s must not be NULL', CASE WHEN spawn.children IS NULL THEN 'children' ELSE 'fail_fast' END),
      HINT = 'Pass children as a JSON array like [{"name": "a", "task": "resize", "payload": {}}].';
  END IF;
  IF jsonb_typeof(spawn.children) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('spawn: children must be a JSON array of objects, not %s', jsonb_typeof(spawn.children)),
      HINT = 'Pass children as a JSON array like [{"name": "a", "task": "resize", "payload": {}}].';
  END IF;
  -- One pass over the elements (a hash of the names); only a call that
  -- fails it looks for its first bad element, in order.
  IF EXISTS (SELECT FROM jsonb_array_elements(spawn.children) AS x(e)
             WHERE jsonb_typeof(x.e) <> 'object' OR jsonb_typeof(x.e -> 'name') IS DISTINCT FROM 'string'
                OR x.e ->> 'name' = '' OR length(x.e ->> 'name') > 200)
     OR EXISTS (SELECT FROM jsonb_array_elements(spawn.children) AS x(e)
                GROUP BY x.e ->> 'name' HAVING count(*) > 1) THEN
    SELECT format('children[%s] %s', x.ord, CASE
             WHEN jsonb_typeof(x.e) <> 'object' THEN format('must be an object, not %s', jsonb_typeof(x.e))
             WHEN NOT x.e ? 'name' THEN 'has no "name"'
             WHEN jsonb_typeof(x.e -> 'name') <> 'string' THEN format('has a name that is not a string: %s', idemq._excerpt((x.e -> 'name')::text))
             WHEN x.e ->> 'name' = '' THEN 'has an empty name'
             WHEN length(x.e ->> 'name') > 200 THEN format('has a name of %s characters, over 200', length(x.e ->> 'name'))
             ELSE format('has the name "%s" of an earlier element', idemq._excerpt(x.e ->> 'name')) END)
    INTO v_problem
    FROM (SELECT y.e, y.ord, row_number() OVER (PARTITION BY y.e -> 'name' ORDER BY y.ord) AS nth
          FROM jsonb_array_elements(spawn.children) WITH ORDINALITY AS y(e, ord)) x
    WHERE jsonb_typeof(x.e) <> 'object' OR jsonb_typeof(x.e -> 'name') IS DISTINCT FROM 'string'
       OR x.e ->> 'name' = '' OR length(x.e ->> 'name') > 200 OR x.nth > 1
    ORDER BY x.ord
    LIMIT 1;
  END IF;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'spawn: ' || v_problem,
      HINT = 'Each child is an object with a unique "name" (1 to 200 characters; a replay finds the child by it) and enqueue_many''s fields.';
  END IF;

  PERFORM idemq._lock_held('spawn', spawn.job_id, spawn.attempt, spawn.lease_token);
  UPDATE idemq.jobs AS j SET has_children = true WHERE j.id = spawn.job_id AND NOT j.has_children;

  -- The children not linked yet, without their names, in the call's order.
  SELECT jsonb_agg(x.e - 'name' ORDER BY x.ord), array_agg(x.e ->> 'name' ORDER BY x.ord)
  INTO v_new, v_new_names
  FROM jsonb_array_elements(spawn.children) WITH ORDINALITY AS x(e, ord)
  WHERE NOT EXISTS (SELECT FROM idemq.job_children c WHERE c.parent_id = spawn.job_id AND c.name = x.e ->> 'name');

  IF v_new IS NOT NULL THEN
    BEGIN
      v_parsed := idemq._parse_jobs(v_new);
    EXCEPTION WHEN SQLSTATE '22023' OR SQLSTATE '22004' THEN
      GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'spawn: ' || v_message,
        HINT = 'jobs[N] is the N-th child of this call not spawned before; each child takes enqueue_many''s fields besides its name.';
    END;
    v_planned := idemq._enqueue_planned(v_parsed.planned, v_parsed.keyed, v_parsed.parents, as_children => true);
    SELECT p.ordinal, p.idempotency_key, p.outcome, p.job_id, p.existing_state INTO v_refused
    FROM unnest(v_planned) p
    WHERE p.outcome NOT IN ('created', 'deduplicated')
    ORDER BY p.ordinal
    LIMIT 1;
    IF FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'IQ409',
        MESSAGE = format('spawn: child "%s" of job %s was not enqueued: its idempotency key "%s" %s',
                         idemq._excerpt(v_new_names[v_refused.ordinal]), spawn.job_id, idemq._excerpt(v_refused.idempotency_key),
                         CASE WHEN v_refused.outcome = 'conflict' THEN 'is held by an active job doing different work'
                              ELSE 'is refused by its duplicate policy' END),
        DETAIL = jsonb_build_object('key', v_refused.idempotency_key, 'existing_job_id', v_refused.job_id,
                                    'existing_state', v_refused.existing_state, 'name', v_new_names[v_refused.ordinal])::text,
        HINT = 'Give the child another key, or none (its name already makes the spawn idempotent); nothing was spawned.';
    END IF;

  END IF;
  -- With nothing new (a replay) it links nothing and only sets fail_fast.
  PERFORM idemq._link_children(spawn.job_id, v_planned, v_new_names, spawn.fail_fast);

  RETURN QUERY
  SELECT c.name, c.child_id, coalesce(c.state, j.state), c.result, c.last_error, coalesce(p.outcome, 'existing')
  FROM jsonb_array_elements(spawn.children) WITH ORDINALITY AS x(e, ord)
  JOIN idemq.job_children c ON c.parent_id = spawn.job_id AND c.name = x.e ->> 'name'
  LEFT JOIN idemq.jobs j ON j.id = c.child_id
  LEFT JOIN (SELECT v_new_names[q.ordinal] AS name, q.outcome FROM unnest(v_planned) q) p ON p.name = c.name
  ORDER BY x.ord;
END;
$$;

COMMENT ON FUNCTION idemq.spawn(bigint, int, jsonb, uuid, boolean) IS
  'Fan-out: enqueue named child jobs of the held job (idempotent by name) and count them for its wait_for_children.';
