-- idemq._job_problem(job idemq._planned_job) RETURNS text
--
-- Says what is wrong with one job an enqueue asks for, or NULL when nothing
-- is: the value rules of enqueue and enqueue_many, written once.
--
-- Guarantees:
--   * The one definition of a valid job, applied to typed values: enqueue()
--     checks its arguments with it, _parse_jobs every decoded element of
--     enqueue_many, so a job is refused for the same reason whichever
--     function, or whichever path inside them, it takes.
--   * Rules: task non-empty; payload a JSON object; queue non-empty and at
--     most _queue_name_limit() characters; max_attempts >= 1;
--     idempotency_key non-empty when given; parents in `after` positive ids.
--     The backoff is _backoff_problem's (a batch checks each distinct
--     backoff once instead of once per job, so it is not repeated here);
--     NULL arguments are the callers' (enqueue raises 22004, enqueue_many
--     fills defaults), except a NULL task, refused here.
--   * A SQL function of one expression, neither STRICT nor plpgsql, without
--     a sub-SELECT and STABLE like format(), so the planner inlines it into
--     _parse_jobs' statement: called per element instead, it cost 15 us each,
--     more than decoding (EXPLAIN VERBOSE shows the call when it is not inlined).
-- Concurrency: none (reads only its argument).
-- Errors: none (callers raise through _raise_bad_job).
-- Tests: test/sql/bad-input.test.ts, test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts
CREATE OR REPLACE FUNCTION idemq._job_problem(job idemq._planned_job)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
  WHEN job.task IS NULL OR job.task = '' THEN
    'task must be a non-empty string: the name of a task your workers handle'
  WHEN jsonb_typeof(job.payload) IS DISTINCT FROM 'object' THEN
    format('payload must be a JSON object, not %s', coalesce(job.payload::text, 'NULL'))
  WHEN job.queue = '' THEN
    'queue must be a non-empty string'
  WHEN length(job.queue) > idemq._queue_name_limit() THEN
    format('queue must be at most %s characters, not %s', idemq._queue_name_limit(), length(job.queue))
  WHEN job.max_attempts < 1 THEN
    format('max_attempts must be at least 1, not %s', job.max_attempts)
  WHEN job.idempotency_key = '' THEN
    'idempotency_key must be a non-empty string or null'
  WHEN array_position(job.after, NULL) IS NOT NULL OR 0 >= ANY (job.after) THEN
    format('after must be an array of job ids, not %s', job.after)
END;

COMMENT ON FUNCTION idemq._job_problem(idemq._planned_job) IS
  'What is wrong with one job to enqueue (NULL: nothing): the value rules of enqueue and enqueue_many, once.';
