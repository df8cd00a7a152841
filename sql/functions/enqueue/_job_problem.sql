-- idemq._job_problem(job idemq._planned_job, limits idemq._enqueue_limits) RETURNS text[]
--
-- Says what is wrong with one job an enqueue asks for, and how to fix it, or
-- NULL when nothing is: the value rules of enqueue and enqueue_many, written
-- once.
--
-- Guarantees:
--   * The rules are _job_rule_broken's (the one definition of a valid job,
--     applied to typed values); this words the first one broken. enqueue()
--     and _parse_jobs (every decoded element of enqueue_many) test
--     _job_rule_broken and call this only for a job that breaks one, so a
--     job is refused for the same reason whichever function, or whichever
--     path inside them, it takes, and a valid job never compiles the
--     wording (_job_rule_broken says what that costs).
--   * Returns ARRAY[problem, hint] (hint NULL where the problem says it all),
--     NULL when no rule is broken: _raise_bad_job words the 22023 from them.
--   * Problems quote at most an excerpt of the input (_excerpt).
--   * `limits` comes from _enqueue_limits(), read once per call by the
--     caller: a limit read here would be a query per element.
--   * A SQL function of one expression, neither STRICT nor plpgsql, without
--     a sub-SELECT and STABLE like format(), so the planner inlines it (and
--     _job_rule_broken) into its callers: called per element instead, it
--     cost 15 us each, more than decoding (EXPLAIN VERBOSE shows the call
--     when it is not inlined). The payload's JSON text is made only for an
--     object (the cost of the payload_bytes rule: about 2 ms per 20,000
--     small payloads), and rule 4's wording prints it once more, in
--     _payload_problem.
-- Concurrency: none (reads only its arguments).
-- Errors: none (callers raise through _raise_bad_job).
-- Tests: test/sql/bad-input.test.ts, test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/limits.test.ts, test/sql/traceparent.test.ts, test/sql/concurrency-keys.test.ts,
--   test/sql/timeout.test.ts
CREATE OR REPLACE FUNCTION idemq._job_problem(job idemq._planned_job, limits idemq._enqueue_limits)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE idemq._job_rule_broken(job, limits)
  WHEN 1 THEN
    ARRAY['task must be a non-empty string: the name of a task your workers handle', NULL]
  WHEN 2 THEN
    ARRAY[format('task is %s bytes, over the limit of %s bytes (task_bytes): %s',
                 octet_length(job.task), limits.task_bytes, idemq._excerpt(job.task)),
          'Name tasks briefly, e.g. ''send_email''; an admin can raise task_bytes in idemq.settings.']
  WHEN 3 THEN
    ARRAY[format('payload must be a JSON object, not %s', idemq._excerpt(coalesce(job.payload::text, 'NULL'))),
          'Wrap the value in an object, e.g. {"value": ...}.']
  WHEN 4 THEN
    idemq._payload_problem(job.payload, limits.payload_bytes)
  WHEN 5 THEN
    ARRAY['queue must be a non-empty string', 'Leave queue out for the default queue.']
  WHEN 6 THEN
    ARRAY[format('queue must be at most %s characters, not %s: %s', idemq._queue_name_limit(), length(job.queue),
                 idemq._excerpt(job.queue)),
          'Use a short queue name: it travels as the NOTIFY payload.']
  WHEN 7 THEN
    ARRAY[format('run_at must be a finite time, not %s', job.run_at),
          'Pass a real time, e.g. now() + interval ''1 hour'', or leave run_at out to run at once.']
  WHEN 8 THEN
    ARRAY[format('max_attempts must be at least 1, not %s', job.max_attempts), NULL]
  WHEN 9 THEN
    ARRAY['idempotency_key must be a non-empty string or null', NULL]
  WHEN 10 THEN
    ARRAY[format('idempotency_key is %s bytes, over the limit of %s bytes (key_bytes): %s',
                 octet_length(job.idempotency_key), limits.key_bytes, idemq._excerpt(job.idempotency_key)),
          'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''order:'' || md5(...).']
  WHEN 11 THEN
    ARRAY[format('after names %s parents, over the limit of %s (parents_per_job)', cardinality(job.after),
                 limits.parents_per_job),
          'Wait for fewer jobs: chain through an intermediate job that waits for a part of them; '
          'an admin can raise parents_per_job in idemq.settings.']
  WHEN 12 THEN
    ARRAY[format('after must be an array of job ids, not %s', idemq._excerpt(job.after::text)), NULL]
  WHEN 13 THEN
    ARRAY[format('key_retention must not be negative, not %s', job.key_retention),
          'key_retention is how long a finished job''s key stays held, e.g. ''14 days''.']
  WHEN 14 THEN
    ARRAY[format('key_retention must be at most %s days (duration_days), not %s', limits.duration_days, job.key_retention),
          format('Use a retention of at most %s days (duration_days in idemq.settings).', limits.duration_days)]
  WHEN 15 THEN
    ARRAY[format('traceparent must be a W3C traceparent (00-<32 hex digits>-<16 hex digits>-<2 hex digits>, '
                 'lower case, ids not all zeros), not %s', idemq._excerpt(job.traceparent)),
          'Pass the traceparent of the producer''s span as OpenTelemetry formats it, '
          'e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01, or leave traceparent out.']
  WHEN 16 THEN
    ARRAY['concurrency_key must be a non-empty string or null',
          'Name what must not run twice at once, e.g. ''customer:42'', or leave concurrency_key out.']
  WHEN 17 THEN
    ARRAY[format('concurrency_key is %s bytes, over the limit of %s bytes (key_bytes): %s',
                 octet_length(job.concurrency_key), limits.key_bytes, idemq._excerpt(job.concurrency_key)),
          'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''customer:'' || md5(...).']
  WHEN 18 THEN
    ARRAY[format('timeout must be more than 0, not %s', job.timeout),
          'timeout is how long one attempt may run, e.g. ''30 seconds''; leave it out for no limit.']
  WHEN 19 THEN
    ARRAY[format('timeout must be at most %s days (duration_days), not %s', limits.duration_days, job.timeout),
          format('Use a time limit of at most %s days (duration_days in idemq.settings), or none.', limits.duration_days)]
END;

COMMENT ON FUNCTION idemq._job_problem(idemq._planned_job, idemq._enqueue_limits) IS
  'What is wrong with one job to enqueue, and the fix (NULL: nothing): the value rules of enqueue and enqueue_many, once.';
