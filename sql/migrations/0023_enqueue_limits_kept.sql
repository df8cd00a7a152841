-- Migration 0023_enqueue_limits_kept: the limits an enqueue checks kept in one row (idemq.enqueue_limits), rewritten by a trigger on idemq.settings, so an enqueue reads one row instead of aggregating six settings rows (about 95,000 instructions a call, a sixth of a single enqueue, to about 5,000).
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

-- The row _enqueue_limits reads: typed by idemq._enqueue_limits, so a limit
-- added later (ALTER TYPE ... ADD ATTRIBUTE ... CASCADE) reaches it, and
-- unique on a constant, so it holds one row at most; _keep_enqueue_limits,
-- the trigger below, is its only writer and leaves exactly one.
CREATE TABLE idemq.enqueue_limits OF idemq._enqueue_limits (
  payload_bytes WITH OPTIONS NOT NULL,
  key_bytes WITH OPTIONS NOT NULL,
  task_bytes WITH OPTIONS NOT NULL,
  parents_per_job WITH OPTIONS NOT NULL,
  jobs_per_call WITH OPTIONS NOT NULL,
  duration_days WITH OPTIONS NOT NULL
);
CREATE UNIQUE INDEX enqueue_limits_one_row ON idemq.enqueue_limits ((true));
COMMENT ON TABLE idemq.enqueue_limits IS
  'The limits an enqueue checks, one row kept from idemq.settings by the trigger settings_keep_enqueue_limits; change idemq.settings, not this.';

-- ---- sql/functions/_enqueue_limits.sql ----
-- idemq._enqueue_limits() RETURNS SETOF idemq._enqueue_limits
--
-- The limits an enqueue checks, once per enqueue or enqueue_many call:
-- payload_bytes, key_bytes (the idempotency key), task_bytes,
-- parents_per_job (after), jobs_per_call and duration_days (key_retention).
-- Read from idemq.enqueue_limits, the one row that the trigger
-- _keep_enqueue_limits rewrites from idemq.settings whenever settings change
-- (reading the six settings rows here cost about 95,000 instructions a call,
-- a sixth of a single enqueue; the kept row about 5,000).
--
-- Guarantees: exactly one row, whose every field is the value of the
--   settings row of its name (_keep_enqueue_limits keeps it so; a test
--   compares them after each kind of change). _job_problem takes the row as
--   an argument, so a batch reads each limit once, not once per element.
--   * Called in FROM (SELECT * INTO v_limits FROM idemq._enqueue_limits()):
--     a SQL-standard body, SETOF so that the planner inlines it into the
--     caller's query.
-- Concurrency: a plain read; a changed limit applies to statements that
--   start after its settings change commits.
-- Errors: none (a missing settings row is refused when it is deleted).
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_limits()
RETURNS SETOF idemq._enqueue_limits
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT l.payload_bytes, l.key_bytes, l.task_bytes, l.parents_per_job, l.jobs_per_call, l.duration_days
  FROM idemq.enqueue_limits l;
END;

COMMENT ON FUNCTION idemq._enqueue_limits() IS
  'The limits an enqueue checks (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days): the row idemq.enqueue_limits keeps.';

-- ---- sql/functions/_keep_enqueue_limits.sql ----
-- idemq._keep_enqueue_limits() RETURNS trigger
--
-- Trigger (AFTER INSERT OR UPDATE OR DELETE ON idemq.settings, FOR EACH
-- STATEMENT): rewrites idemq.enqueue_limits, the one row of limits every
-- enqueue reads (_enqueue_limits), from the settings rows of their names.
-- Reading those six rows from idemq.settings in each enqueue cost about
-- 95,000 instructions a call (an aggregate's setup and a scan; callgrind,
-- PostgreSQL 15), a sixth of a single enqueue; reading the kept row costs
-- about 5,000.
--
-- Guarantees:
--   * After every statement that writes idemq.settings, idemq.enqueue_limits
--     holds exactly one row whose every field is the value of the settings
--     row of its name, as _limit() reads it; so a limit keeps one definition,
--     its settings row, and this is the only place its name maps to a field.
--   * The row changes in the writer's transaction: an enqueue sees the new
--     limit once the change commits, as it saw the settings row before.
--   * A limit row deleted raises 42704 through _limit(), so the DELETE fails
--     and the kept row stays whole.
--   * SECURITY DEFINER: idemq_admin may UPDATE settings.value but holds no
--     privilege on idemq.enqueue_limits.
-- Concurrency: the kept row is locked first, then the settings are read by
--   the next statement, whose snapshot (READ COMMITTED) includes any change
--   committed by a writer it waited for; so two admins changing two limits
--   at once leave both in the row. Enqueues read the row without a lock and
--   never wait for this.
-- Errors: 42704 a limit row is missing.
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._keep_enqueue_limits()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM 1 FROM idemq.enqueue_limits FOR UPDATE;
  DELETE FROM idemq.enqueue_limits;
  INSERT INTO idemq.enqueue_limits (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days)
  SELECT coalesce(max(s.value) FILTER (WHERE s.name = 'payload_bytes'), idemq._limit('payload_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'key_bytes'), idemq._limit('key_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'task_bytes'), idemq._limit('task_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'parents_per_job'), idemq._limit('parents_per_job')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'jobs_per_call'), idemq._limit('jobs_per_call')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'duration_days'), idemq._limit('duration_days'))
  FROM idemq.settings s;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._keep_enqueue_limits() IS
  'Trigger on idemq.settings: rewrites the one row of idemq.enqueue_limits from the settings rows of its fields.';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._keep_enqueue_limits FROM PUBLIC;

CREATE TRIGGER settings_keep_enqueue_limits
  AFTER INSERT OR UPDATE OR DELETE ON idemq.settings
  FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_enqueue_limits();
-- The first row: a statement trigger fires for a statement that writes no row.
UPDATE idemq.settings SET value = value WHERE false;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- Down Migration

-- Before its function is dropped below.
DROP TRIGGER settings_keep_enqueue_limits ON idemq.settings;

-- sql/functions/_enqueue_limits.sql as of 0011_enqueue_limits
-- idemq._enqueue_limits() RETURNS SETOF idemq._enqueue_limits
--
-- The limits an enqueue checks, read from idemq.settings in one query, once
-- per enqueue or enqueue_many call: payload_bytes, key_bytes (the
-- idempotency key), task_bytes, parents_per_job (after), jobs_per_call and
-- duration_days (key_retention).
--
-- Guarantees: exactly one row; every field is the value of the settings row
--   of its name, as _limit() reads it (so a limit still has one definition:
--   its row); a row missing raises through _limit(). _job_problem takes the
--   row as an argument, so a batch reads each limit once, not once per
--   element.
--   * Called in FROM (SELECT * INTO v_limits FROM idemq._enqueue_limits()):
--     a SQL-standard body, SETOF so that the planner inlines it into the
--     caller's query. As a plpgsql function it cost 10 us per call (5,000
--     calls, backend CPU), as much as a quarter of a single enqueue; inlined,
--     5 us.
-- Concurrency: a plain read of idemq.settings; a changed value applies to
--   statements that start after it commits.
-- Errors: 42704 a limit row is missing (a schema older than its caller: run
--   idemq migrate).
-- Tests: test/sql/limits.test.ts
CREATE OR REPLACE FUNCTION idemq._enqueue_limits()
RETURNS SETOF idemq._enqueue_limits
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT coalesce(max(s.value) FILTER (WHERE s.name = 'payload_bytes'), idemq._limit('payload_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'key_bytes'), idemq._limit('key_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'task_bytes'), idemq._limit('task_bytes')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'parents_per_job'), idemq._limit('parents_per_job')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'jobs_per_call'), idemq._limit('jobs_per_call')),
         coalesce(max(s.value) FILTER (WHERE s.name = 'duration_days'), idemq._limit('duration_days'))
  FROM idemq.settings s;
END;

COMMENT ON FUNCTION idemq._enqueue_limits() IS
  'The limits an enqueue checks (payload_bytes, key_bytes, task_bytes, parents_per_job, jobs_per_call, duration_days), read once per call.';

DROP FUNCTION idemq._keep_enqueue_limits;

-- Hand-written reversal of the schema changes above goes here, after the functions.
-- After _enqueue_limits, restored above, stopped reading it.
DROP TABLE idemq.enqueue_limits;
