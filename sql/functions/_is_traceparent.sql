-- idemq._is_traceparent(value text) RETURNS boolean
--
-- Whether `value` is a W3C Trace Context traceparent of version 00, the
-- shape idemq stores in idemq.jobs.traceparent: the one definition that the
-- table's CHECK (jobs_traceparent_w3c) and enqueue's value rules
-- (_job_problem) share.
--
-- Guarantees:
--   * true for `00-<trace-id>-<parent-id>-<flags>`: 32, 16 and 2 lower-case
--     hex digits (55 characters in all), trace-id and parent-id not all zeros
--     (W3C Trace Context, "traceparent Header": such ids are invalid).
--   * Other versions are refused: version 00 is the only one defined, and the
--     one every OpenTelemetry SDK writes; a stored value must parse in any
--     worker.
--   * NULL for NULL (a job without a trace context), so the CHECK accepts it
--     and _job_problem finds no problem.
--   * A SQL-standard body of one expression, IMMUTABLE: the planner inlines
--     it into _job_problem and so into _parse_jobs' statement.
-- Concurrency: none (reads only its argument).
-- Errors: none.
-- Tests: test/sql/traceparent.test.ts
CREATE OR REPLACE FUNCTION idemq._is_traceparent(value text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN value ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
   AND substr(value, 4, 32) <> '00000000000000000000000000000000'
   AND substr(value, 37, 16) <> '0000000000000000';

COMMENT ON FUNCTION idemq._is_traceparent(text) IS
  'Whether a value is a W3C traceparent of version 00 (the shape of idemq.jobs.traceparent); NULL for NULL.';
