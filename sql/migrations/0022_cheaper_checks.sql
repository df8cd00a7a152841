-- Migration 0022_cheaper_checks: the CHECKs of idemq.jobs and idemq.keys spelt so PostgreSQL prepares them cheaply: it parses and plans a table's CHECK expressions at every statement that writes the table, so a single-row write (enqueue, a transactional complete, fail) paid 413,000 instructions for the 8 CHECKs of jobs as 0018 left them and pays about 245,000 now (callgrind, PostgreSQL 15); the rules are unchanged.
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ (npm run migration:check compares them). Once released (listed
-- in sql/released.sha256) this file never changes again.
-- Up Migration

-- Hand-written schema changes (tables, columns, indexes) go here, before the
-- functions that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes
-- in a migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration commits
-- on its own, so the next migration can use it.

-- Why: ExecConstraints reads each CHECK's stored expression (stringToNode)
-- and runs the expression planner over it once per statement, cached plan or
-- not. A single-row INSERT into a copy of idemq.jobs costs 53,000
-- instructions without CHECKs and 413,000 with 0018's eight; the cost follows
-- each expression's size, and a SQL function in one is inlined anew every
-- time. The new spellings accept exactly the rows the old ones accepted
-- (test/contract/checks.test.ts compares them over a grid of values), so NOT
-- VALID skips a scan that could find nothing while this transaction holds
-- idemq.jobs exclusively; new and updated rows are checked as before.
--   * jobs_traceparent_w3c: one regular expression, the one _is_traceparent
--     holds (154,000 -> 26,000 instructions a statement).
--   * jobs_attempt_in_range: three comparisons instead of BETWEEN over a
--     difference (70,000 -> 47,000); 0 <= uncounted <= attempt <=
--     max_attempts + uncounted is attempt >= 0, uncounted >= 0 and
--     0 <= attempt - uncounted <= max_attempts.
--   * jobs_finished_iff_terminal, keys_finished_state_terminal: the terminal
--     states as one array constant instead of an IN list (46,000 -> 30,000);
--     a NULL finished_state passes either way (NULL = ANY is NULL).
ALTER TABLE idemq.jobs
  DROP CONSTRAINT jobs_traceparent_w3c,
  DROP CONSTRAINT jobs_attempt_in_range,
  DROP CONSTRAINT jobs_finished_iff_terminal,
  ADD CONSTRAINT jobs_traceparent_w3c
    CHECK (traceparent ~ '^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID,
  ADD CONSTRAINT jobs_attempt_in_range
    CHECK (0 <= uncounted AND uncounted <= attempt AND attempt <= max_attempts + uncounted) NOT VALID,
  ADD CONSTRAINT jobs_finished_iff_terminal
    CHECK ((state = ANY ('{succeeded,failed,expired,cancelled}'::idemq.job_state[])) = (finished_at IS NOT NULL)) NOT VALID;

ALTER TABLE idemq.keys
  DROP CONSTRAINT keys_finished_state_terminal,
  ADD CONSTRAINT keys_finished_state_terminal
    CHECK (finished_state = ANY ('{succeeded,failed,expired,cancelled}'::idemq.job_state[])) NOT VALID;

-- ---- sql/functions/_is_traceparent.sql ----
-- idemq._is_traceparent(value text) RETURNS boolean
--
-- Whether `value` is a W3C Trace Context traceparent of version 00, the
-- shape idemq stores in idemq.jobs.traceparent: the one definition of the
-- rule that enqueue's value rules (_job_problem) call and the table's CHECK
-- (jobs_traceparent_w3c) spells with the same regular expression, which a
-- contract test holds equal (test/contract/checks.test.ts). The CHECK does
-- not call this function: PostgreSQL prepares a table's CHECKs at every
-- statement and inlines a SQL function anew each time, 154,000 instructions
-- a statement against 26,000 for the regular expression spelt out (0022).
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

-- Down Migration

-- sql/functions/_is_traceparent.sql as of 0018_traces
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

-- Hand-written reversal of the schema changes above goes here, after the functions.
-- The spellings of 0001_init and 0018 (0018's calls _is_traceparent, restored
-- above), validated as 0001 left them (a scan of each table).
ALTER TABLE idemq.jobs
  DROP CONSTRAINT jobs_traceparent_w3c,
  DROP CONSTRAINT jobs_attempt_in_range,
  DROP CONSTRAINT jobs_finished_iff_terminal,
  ADD CONSTRAINT jobs_traceparent_w3c CHECK (idemq._is_traceparent(traceparent)) NOT VALID,
  ADD CONSTRAINT jobs_attempt_in_range
    CHECK (attempt >= 0 AND uncounted >= 0 AND attempt - uncounted BETWEEN 0 AND max_attempts),
  ADD CONSTRAINT jobs_finished_iff_terminal
    CHECK ((state IN ('succeeded', 'failed', 'expired', 'cancelled')) = (finished_at IS NOT NULL));
ALTER TABLE idemq.keys
  DROP CONSTRAINT keys_finished_state_terminal,
  ADD CONSTRAINT keys_finished_state_terminal
    CHECK (finished_state IS NULL OR finished_state IN ('succeeded', 'failed', 'expired', 'cancelled'));
