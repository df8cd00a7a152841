-- idemq._gone_on_success(task text, queue text, default_zero boolean, zero_tasks text[],
--   kept_tasks text[], zero_queues text[], kept_queues text[]) RETURNS boolean
--
-- Whether a job of this task and queue has retention 0 once it succeeded,
-- given what _success_retention() read: an override of its task decides,
-- else one of its queue, else the default.
--
-- Guarantees: the precedence task > queue > default, the same as
--   apply_retention()'s rules; inlined into the completing statement, so it
--   costs array probes per row and no table read.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/retention-zero.test.ts
CREATE OR REPLACE FUNCTION idemq._gone_on_success(task text, queue text, default_zero boolean, zero_tasks text[],
                                                  kept_tasks text[], zero_queues text[], kept_queues text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN task = ANY (zero_tasks) THEN true
            WHEN task = ANY (kept_tasks) THEN false
            WHEN queue = ANY (zero_queues) THEN true
            WHEN queue = ANY (kept_queues) THEN false
            ELSE default_zero END;

COMMENT ON FUNCTION idemq._gone_on_success(text, text, boolean, text[], text[], text[], text[]) IS
  'Retention 0 for a succeeded job of this task and queue? Task override, else queue override, else the default.';
