-- idemq._is_traceparent(value text) RETURNS boolean
--
-- Whether `value` is a W3C Trace Context traceparent of version 00, the
-- shape idemq stores in idemq.jobs.traceparent: the one definition of the
-- rule that enqueue's value rules (_job_problem) call and the table's CHECK
-- (jobs_traceparent_w3c) spells with the same regular expression, which a
-- contract test holds equal (test/contract/checks.test.ts). The CHECK does
-- not call this function: PostgreSQL prepares a table's CHECKs at every
-- statement and inlines a SQL function anew each time, six times the cost of
-- the regular expression spelt out (measured: bench/FINDINGS.md, "Why the
-- SQL is written as it is").
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
--   * A SQL-standard body of one regular expression, IMMUTABLE: the planner
--     inlines it into _job_problem and so into _parse_jobs' statement. The
--     lookaheads (?!0{32}) and (?!0{16}) refuse the all-zero ids.
-- Concurrency: none (reads only its argument).
-- Errors: none.
-- Tests: test/sql/traceparent.test.ts, test/contract/checks.test.ts
CREATE OR REPLACE FUNCTION idemq._is_traceparent(value text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN value ~ '^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$';

COMMENT ON FUNCTION idemq._is_traceparent(text) IS
  'Whether a value is a W3C traceparent of version 00 (the shape of idemq.jobs.traceparent); NULL for NULL.';
