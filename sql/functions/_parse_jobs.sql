-- idemq._parse_jobs(jobs jsonb, at timestamptz)
--   RETURNS TABLE(ord int, task text, payload jsonb, queue text, run_at timestamptz,
--                 priority int, max_attempts int, key text,
--                 duplicate_policy idemq.duplicate_policy, backoff jsonb,
--                 expires_at timestamptz, ok boolean)
--
-- The fast path of _enqueue_rows: parses a JSON array of jobs in one pass
-- (jsonb_to_recordset, in C), fills the defaults (_job_defaults, run_at `at`),
-- and marks each element `ok` when it passes a cheap check.
--
-- Guarantees: `ok` is false or NULL for every element the validating path of
--   _enqueue_rows would refuse (unknown fields, wrong types, empty task or
--   queue, queue over 1000 characters, max_attempts < 1, empty key, `after`),
--   so the fast path refuses at least what that path refuses. A value that
--   does not parse (a bad timestamp, a priority out of range) raises a
--   data_exception, which the fast path also hands to the validating path.
--   Backoffs are not checked here (_enqueue_rows checks each distinct one).
-- Concurrency: none (reads only its argument). Inlined into the caller's plan.
-- Errors: data_exception for a value that does not parse.
-- Tests: test/sql/enqueue-many.test.ts (both paths agree)
CREATE OR REPLACE FUNCTION idemq._parse_jobs(jobs jsonb, at timestamptz)
RETURNS TABLE(ord int, task text, payload jsonb, queue text, run_at timestamptz,
              priority int, max_attempts int, key text,
              duplicate_policy idemq.duplicate_policy, backoff jsonb,
              expires_at timestamptz, ok boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT r.ord::int, r.task,
         coalesce(r.payload, idemq._job_defaults()->'payload'),
         coalesce(r.queue, idemq._job_defaults()->>'queue'),
         coalesce(r.run_at, at),
         coalesce(r.priority, (idemq._job_defaults()->>'priority')::int),
         coalesce(r.max_attempts, (idemq._job_defaults()->>'max_attempts')::int),
         r.idempotency_key,
         coalesce(r.duplicate_policy, (idemq._job_defaults()->>'duplicate_policy')::idemq.duplicate_policy),
         r.backoff, r.expires_at,
         (r.v - ARRAY['task', 'payload', 'queue', 'run_at', 'priority', 'max_attempts',
                      'idempotency_key', 'duplicate_policy', 'backoff', 'expires_at', 'after']) = '{}'
           AND r.task <> '' AND jsonb_typeof(r.v->'task') = 'string'
           AND (r.payload IS NULL OR jsonb_typeof(r.payload) = 'object')
           AND (r.queue IS NULL OR (jsonb_typeof(r.v->'queue') = 'string'
                                    AND r.queue <> '' AND length(r.queue) <= idemq._queue_name_limit()))
           AND (r.run_at IS NULL OR jsonb_typeof(r.v->'run_at') = 'string')
           AND (r.expires_at IS NULL OR jsonb_typeof(r.v->'expires_at') = 'string')
           AND (r.priority IS NULL OR jsonb_typeof(r.v->'priority') = 'number')
           AND (r.max_attempts IS NULL OR (jsonb_typeof(r.v->'max_attempts') = 'number'
                                           AND r.max_attempts >= 1))
           AND (r.idempotency_key IS NULL OR (jsonb_typeof(r.v->'idempotency_key') = 'string'
                                              AND r.idempotency_key <> ''))
           AND r.after IS NULL
  FROM ROWS FROM (jsonb_array_elements(jobs),
                  jsonb_to_recordset(jobs) AS (task text, payload jsonb, queue text, run_at timestamptz,
                    priority int, max_attempts int, idempotency_key text,
                    duplicate_policy idemq.duplicate_policy, backoff jsonb, expires_at timestamptz,
                    after jsonb)) WITH ORDINALITY
       AS r(v, task, payload, queue, run_at, priority, max_attempts, idempotency_key,
            duplicate_policy, backoff, expires_at, after, ord)
$$;

COMMENT ON FUNCTION idemq._parse_jobs(jsonb, timestamptz) IS
  'Fast path of enqueue_many: parse a JSON array of jobs with defaults, each marked ok when it passes a cheap check.';
