-- idemq._job_rule_broken(job idemq._planned_job, limits idemq._enqueue_limits) RETURNS int
--
-- The value rules of enqueue and enqueue_many, written once: the number of
-- the first rule a job breaks, or NULL when it breaks none. _job_problem
-- words rule N's problem and its fix.
--
-- Why apart from the wording: a caller compiles every branch of an
-- expression it evaluates (PL/pgSQL once per transaction), so the rules
-- with their messages cost a single enqueue() an eighth of its work
-- (measured: bench/FINDINGS.md, "Why the SQL is written as it is"); the
-- rules alone are what every call needs, and the messages only a refused
-- job.
--
-- Guarantees:
--   * Rules, in this order: 1 task non-empty (a NULL task too); 2 task at
--     most limits.task_bytes bytes (UTF-8); 3 payload a JSON object; 4
--     payload at most limits.payload_bytes bytes of JSON text; 5 queue
--     non-empty; 6 queue at most _queue_name_limit() characters; 7 run_at
--     finite; 8 max_attempts >= 1; 9 idempotency_key non-empty when given;
--     10 idempotency_key at most limits.key_bytes bytes; 11 after at most
--     limits.parents_per_job parents; 12 each parent a positive id; 13
--     key_retention not negative; 14 key_retention at most
--     limits.duration_days days; 15 traceparent a W3C traceparent of version
--     00 (_is_traceparent); 16 concurrency_key non-empty when given; 17
--     concurrency_key at most limits.key_bytes bytes; 18 timeout more than
--     0; 19 timeout at most limits.duration_days days (an infinite one too).
--     The backoff is _backoff_problem's.
--   * Rule 4 reads the payload's stored size first (pg_column_size, no work):
--     its JSON text is at least (size - 8) / 15 bytes, so a payload stored in
--     more than 16 x payload_bytes + 8 bytes breaks the rule without being
--     printed. Why 15: the binary form (jsonb) spends at most 8 bytes on its
--     headers, and per value at most 13 bytes (a 4-byte entry, 3 of
--     alignment, a 6-byte numeric header) plus 2 per 4-digit numeric word
--     plus its string bytes, while the text spends at least 1 byte per value,
--     1 per numeric word and its string bytes (the worst ratio measured, an
--     array of zeros or nested empty arrays, is 4). A stored size that is
--     compressed is smaller, so the bound never refuses a payload that fits.
--     Under the bound the text is printed and measured, as before.
--   * NULL arguments other than task are the callers' (enqueue raises 22004,
--     enqueue_many fills defaults).
--   * A SQL function of one expression, inlined into its callers.
-- Concurrency: none (reads only its arguments).
-- Errors: none.
-- Tests: test/sql/bad-input.test.ts, test/sql/enqueue.test.ts, test/sql/enqueue-many.test.ts,
--   test/sql/limits.test.ts, test/sql/traceparent.test.ts, test/contract/contract.test.ts,
--   test/sql/concurrency-keys.test.ts, test/sql/timeout.test.ts
CREATE OR REPLACE FUNCTION idemq._job_rule_broken(job idemq._planned_job, limits idemq._enqueue_limits)
RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
  WHEN job.task IS NULL OR job.task = '' THEN 1
  WHEN octet_length(job.task) > limits.task_bytes THEN 2
  WHEN jsonb_typeof(job.payload) IS DISTINCT FROM 'object' THEN 3
  -- The stored size first: over 16 x payload_bytes + 8 the JSON text is surely
  -- over payload_bytes (see the header), and printing a payload of 100 MB,
  -- only to refuse it, cost seconds and the memory of its text.
  WHEN pg_column_size(job.payload) > 16 * limits.payload_bytes + 8
       OR octet_length(job.payload::text) > limits.payload_bytes THEN 4
  WHEN job.queue = '' THEN 5
  WHEN length(job.queue) > idemq._queue_name_limit() THEN 6
  WHEN NOT isfinite(job.run_at) THEN 7
  WHEN job.max_attempts < 1 THEN 8
  WHEN job.idempotency_key = '' THEN 9
  WHEN octet_length(job.idempotency_key) > limits.key_bytes THEN 10
  WHEN cardinality(job.after) > limits.parents_per_job THEN 11
  WHEN array_position(job.after, NULL) IS NOT NULL OR 0 >= ANY (job.after) THEN 12
  WHEN job.key_retention < interval '0' THEN 13
  WHEN job.key_retention > make_interval(days => limits.duration_days::int) THEN 14
  WHEN NOT idemq._is_traceparent(job.traceparent) THEN 15
  WHEN job.concurrency_key = '' THEN 16
  WHEN octet_length(job.concurrency_key) > limits.key_bytes THEN 17
  WHEN job.timeout <= interval '0' THEN 18
  WHEN job.timeout > make_interval(days => limits.duration_days::int) THEN 19
END;

COMMENT ON FUNCTION idemq._job_rule_broken(idemq._planned_job, idemq._enqueue_limits) IS
  'The number of the first value rule of enqueue a job breaks (NULL: none); _job_problem words it.';
