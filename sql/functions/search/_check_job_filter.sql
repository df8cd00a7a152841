-- idemq._check_job_filter(operation text, filter jsonb) RETURNS void
--
-- Refuses a job filter (find_jobs, count_jobs and the bulk actions) that is
-- not a JSON object of known fields, each of its type: the one definition of
-- what a filter may say (docs/sql-api.md, "Job filters").
--
-- Guarantees: returns only for an object whose fields are among
--   ids (array of 1..10000 job ids, numbers or digit strings), state (array
--   of 1..8 state names), task, queue, key (the idempotency key),
--   concurrency_key, error (non-empty strings, each at most 1000
--   characters), created_after, created_before, finished_after,
--   finished_before (strings PostgreSQL reads as a finite timestamptz) and
--   payload (a JSON object, with task, key or ids beside it).
--   Every problem names the field; the first one (by field name) is raised.
-- Concurrency: none.
-- Errors: 22004 NULL filter; 22023 not an object, an unknown field, a field
--   of the wrong type or value, payload without task, key or ids.
-- Tests: test/sql/find-jobs.test.ts
CREATE OR REPLACE FUNCTION idemq._check_job_filter(operation text, filter jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  c_fields constant text[] := ARRAY['ids', 'state', 'task', 'queue', 'key', 'concurrency_key', 'error',
                                    'created_after', 'created_before', 'finished_after', 'finished_before', 'payload'];
  v_field text;
  v_value jsonb;
  v_type text;
  v_problem text;
  v_hint text;
  v_at timestamptz;
BEGIN
  IF filter IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: filter must not be NULL', operation),
      HINT = 'Pass ''{}'' to match every job, or e.g. ''{"state": ["failed"], "task": "send_email"}''.';
  END IF;
  IF jsonb_typeof(filter) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: filter must be a JSON object, not %s', operation, idemq._excerpt(filter::text)),
      HINT = format('e.g. ''{"state": ["failed"], "task": "send_email"}''; the fields are %s.', array_to_string(c_fields, ', '));
  END IF;

  FOR v_field, v_value IN SELECT e.key, e.value FROM jsonb_each(filter) AS e ORDER BY e.key LOOP
    v_type := jsonb_typeof(v_value);
    v_problem := NULL;
    IF NOT v_field = ANY (c_fields) THEN
      v_problem := 'is not a filter field';
      v_hint := format('The fields are %s.', array_to_string(c_fields, ', '));
    ELSIF v_field = 'ids' THEN
      v_hint := 'ids is an array of job ids, e.g. {"ids": [42, "43"]}, at most 10000 of them.';
      IF v_type <> 'array' OR jsonb_array_length(v_value) NOT BETWEEN 1 AND 10000 THEN
        v_problem := 'must be an array of 1 to 10000 job ids';
      ELSIF EXISTS (SELECT FROM jsonb_array_elements(v_value) AS e
                    WHERE jsonb_typeof(e) NOT IN ('number', 'string')
                       OR (e #>> '{}') !~ '^[1-9][0-9]{0,18}$'
                       OR (e #>> '{}')::numeric > 9223372036854775807) THEN
        v_problem := 'must hold only job ids (positive whole numbers)';
      END IF;
    ELSIF v_field = 'state' THEN
      v_hint := format('state is an array of states, e.g. {"state": ["failed", "expired"]}; the states are %s.',
                       array_to_string(enum_range(NULL::idemq.job_state)::text[], ', '));
      IF v_type <> 'array' OR jsonb_array_length(v_value) = 0 THEN
        v_problem := 'must be a non-empty array of states';
      ELSIF EXISTS (SELECT FROM jsonb_array_elements(v_value) AS e
                    WHERE jsonb_typeof(e) <> 'string'
                       OR NOT (e #>> '{}') = ANY (enum_range(NULL::idemq.job_state)::text[])) THEN
        v_problem := 'holds something that is not a state';
      END IF;
    ELSIF v_field IN ('task', 'queue', 'key', 'concurrency_key', 'error') THEN
      v_hint := format('%s is one string, e.g. {"%s": "%s"}.', v_field, v_field,
                       CASE v_field WHEN 'task' THEN 'send_email' WHEN 'queue' THEN 'default'
                                    WHEN 'key' THEN 'invoice:42' WHEN 'concurrency_key' THEN 'customer:7'
                                    ELSE 'timeout' END);
      IF v_type <> 'string' OR v_value #>> '{}' = '' OR length(v_value #>> '{}') > 1000 THEN
        v_problem := 'must be a non-empty string of at most 1000 characters';
      END IF;
    ELSIF v_field IN ('created_after', 'created_before', 'finished_after', 'finished_before') THEN
      v_hint := format('%s is a time, e.g. {"%s": "2026-12-01T09:00:00Z"}.', v_field, v_field);
      IF v_type <> 'string' THEN
        v_problem := 'must be a time as a string';
      ELSE
        BEGIN
          v_at := (v_value #>> '{}')::timestamptz;
          IF NOT isfinite(v_at) THEN
            v_problem := 'must be a finite time';
          END IF;
        EXCEPTION WHEN data_exception THEN
          v_problem := 'is not a time';
        END;
      END IF;
    ELSIF v_field = 'payload' THEN
      v_hint := 'payload is a JSON object the job''s payload must contain (@>), with the task named: '
                || 'e.g. {"task": "send_email", "payload": {"customer": 42}}.';
      IF v_type <> 'object' THEN
        v_problem := 'must be a JSON object';
      -- The payload match is tested on every job the other fields leave: a
      -- task's jobs, not the whole table (bench/FINDINGS.md, "Search").
      ELSIF NOT (filter ? 'task' OR filter ? 'key' OR filter ? 'ids') THEN
        v_problem := 'needs task (or key, or ids) beside it';
      END IF;
    END IF;
    IF v_problem IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('%s: filter field "%s" %s; got %s', operation, idemq._excerpt(v_field), v_problem,
                         idemq._excerpt(v_value::text)),
        HINT = v_hint;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._check_job_filter(text, jsonb) IS
  'Raise 22023 (22004 for NULL) naming the field when a job filter has an unknown field or a bad value.';
