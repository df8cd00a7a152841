-- idemq.enqueue_batch(jobs jsonb, callback jsonb, fail_fast boolean DEFAULT false)
--   RETURNS TABLE(ordinal int, job_id bigint, outcome text)
--
-- A batch: enqueues `jobs` (enqueue_many's array) together with a callback
-- job (`callback`: one object of the same fields) that runs once, when every
-- job of the batch has finished (or, with fail_fast, when the first one did
-- not succeed), and reads their outcomes with children(): each job is the
-- callback's child named by its ordinal ("1", "2", ...).
--
-- Guarantees:
--   * Row ordinal 0 is the callback (outcome created, or deduplicated /
--     rejected / conflict by its idempotency key); rows 1..N are the jobs as
--     enqueue_many returns them. A callback deduplicated onto an existing job
--     means the batch was enqueued before: nothing else is enqueued (one
--     row); rejected or conflict: nothing is enqueued either. So a key on the
--     callback makes the whole batch idempotent.
--   * The callback waits `awaiting` (waiting_for 'children', as
--     wait_for_children parks a job) and becomes runnable in the transaction
--     of the job that ends the batch; a batch with nothing to wait for (every
--     job rejected, deduplicated onto jobs that finished meanwhile, or
--     cancelled at once because a parent in its `after` had not succeeded)
--     leaves it runnable at once. Jobs refused by their key (rejected, conflict) are not part of
--     the batch; jobs deduplicated onto an existing job wait for that job.
--   * Linear in the number of jobs, as spawn; nothing is written when any
--     element is refused by the value rules (22023, naming jobs[N] or
--     callback).
-- Concurrency: as enqueue_many, and spawn for the jobs deduplicated onto
--   existing ones (locked before their state is read).
-- Errors: 22004 jobs, callback or fail_fast NULL; 22023 an element or the
--   callback refused by enqueue_many's rules (the callback's message starts
--   "callback:"), or a callback that is not an object.
-- Tests: test/sql/batches.test.ts, test/sql/bad-input.test.ts, test/sql/roles.test.ts
CREATE OR REPLACE FUNCTION idemq.enqueue_batch(jobs jsonb, callback jsonb, fail_fast boolean DEFAULT false)
RETURNS TABLE(ordinal int, job_id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_parsed record;
  v_callback idemq._planned_job[];
  v_cb idemq._planned_job;
  v_planned idemq._planned_job[];
  v_message text;
  v_wait record;
BEGIN
  IF enqueue_batch.jobs IS NULL OR enqueue_batch.callback IS NULL OR enqueue_batch.fail_fast IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('enqueue_batch: %s must not be NULL',
                       CASE WHEN enqueue_batch.jobs IS NULL THEN 'jobs' WHEN enqueue_batch.callback IS NULL THEN 'callback'
                            ELSE 'fail_fast' END),
      HINT = 'Pass jobs as enqueue_many takes them and callback as one such job, e.g. {"task": "report"}.';
  END IF;
  IF jsonb_typeof(enqueue_batch.callback) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('enqueue_batch: callback must be a JSON object, not %s', jsonb_typeof(enqueue_batch.callback)),
      HINT = 'Pass the callback as one job object, e.g. {"task": "report", "payload": {}}.';
  END IF;
  -- Both checked before anything is written.
  BEGIN
    v_parsed := idemq._parse_jobs(jsonb_build_array(enqueue_batch.callback));
  EXCEPTION WHEN SQLSTATE '22023' THEN
    GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'enqueue_batch: callback: ' || regexp_replace(v_message, '^jobs\[1\]:? ?', ''),
      HINT = 'The callback takes enqueue_many''s fields.';
  END;
  v_callback := v_parsed.planned;
  v_parsed := idemq._parse_jobs(enqueue_batch.jobs);

  v_callback := idemq._enqueue_planned(v_callback, v_callback[1].idempotency_key IS NOT NULL, v_callback[1].after IS NOT NULL);
  v_cb := v_callback[1];
  ordinal := 0;
  job_id := v_cb.job_id;
  outcome := v_cb.outcome;
  RETURN NEXT;
  IF v_cb.outcome <> 'created' THEN
    RETURN;
  END IF;
  -- Park the callback: its gate first (as wait_for_children: the UPDATE's
  -- trigger may promote jobs of its concurrency key, not this one).
  INSERT INTO idemq.job_dependencies (parent_id, child_id) VALUES (v_cb.job_id, v_cb.job_id);
  UPDATE idemq.jobs AS j SET state = 'awaiting', has_children = true
  WHERE j.id = v_cb.job_id AND j.state IN ('enqueued', 'scheduled', 'awaiting');

  v_planned := idemq._enqueue_planned(v_parsed.planned, v_parsed.keyed, v_parsed.parents, as_children => true);
  -- Each job is the callback's child named by its ordinal.
  v_wait := idemq._link_children(v_cb.job_id, v_planned, ARRAY(SELECT p.ordinal::text FROM unnest(v_planned) p ORDER BY p.ordinal),
                                 enqueue_batch.fail_fast);
  IF v_wait.pending = 0 OR (enqueue_batch.fail_fast AND v_wait.failed > 0) THEN
    PERFORM idemq._release_waiting(v_cb.job_id);
  END IF;

  RETURN QUERY SELECT p.ordinal, p.job_id, p.outcome FROM unnest(v_planned) p ORDER BY p.ordinal;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue_batch(jsonb, jsonb, boolean) IS
  'A batch: enqueue jobs and a callback job that runs once when all of them have finished (their outcomes: children()).';
