-- idemq._parse_jobs(jobs jsonb, OUT planned idemq._planned_job[], OUT keyed boolean, OUT parents boolean)
--
-- Parse and check, the first part of enqueue_many: decodes a JSON array of
-- jobs into planned jobs (in element order, each with a new job id and
-- outcome `created` unless it has a key), or raises for the first element
-- that is wrong. `keyed` / `parents`: some element has a key / parents, so
-- _enqueue_planned skips the steps with nothing to do.
-- Longer than the usual 150 lines: it is the JSON decoder, one statement with
-- each field's decoding rule; split, the rules would be read in several
-- passes over the array (each pass over 20,000 elements costs 10-20 ms).
--
-- Guarantees:
--   * Decoding rules (what the JSON form needs): each element an object whose
--     fields are _enqueue_fields() (enqueue()'s parameters); each field of its JSON type (or null, or
--     absent: _job_defaults, run_at now); priority and max_attempts whole
--     numbers that fit an int; duplicate_policy a policy's name; after an
--     array of whole numbers; timestamps and key_retention (an interval) that
--     parse; traceparent a string; timeout an interval string.
--   * At most jobs_per_call elements (idemq.settings), checked before any
--     is decoded.
--   * A payload whose stored size alone shows it is over payload_bytes
--     (_job_rule_broken's rule 4) is found before any element is decoded and
--     never decoded, copied or printed but once, for its message (an element
--     of 100 MiB refused in 4.8 s, 9.1 s when it was decoded and printed
--     three times; docs/design.md, "Limits"); the element is refused with the
--     same error, in the same order among the others, as when its text is
--     measured. A batch over 16 x payload_bytes bytes pays for the look:
--     50,000 jobs of 1 KB (53 MB), about 40 ms of 570.
--   * Then the value rules every enqueue shares: _job_rule_broken for each
--     element (worded by _job_problem for the first that breaks one), with
--     the limits read once (_enqueue_limits), _backoff_problem
--     once per distinct backoff (a batch usually shares one).
--   * The error names the first element (by position) that breaks a rule,
--     backoffs last; nothing is written and no row returned then.
--   * One statement decodes and checks the whole array (jsonb_array_elements,
--     the rules inlined); the others run only when it found a problem.
-- Concurrency: none (reads only its argument; takes job ids from the sequence).
-- Errors: 22004 jobs is NULL; 22023 jobs is not an array, has more than
--   jobs_per_call elements, or an element is wrong (_raise_bad_job:
--   "jobs[N] ..." with a HINT naming element N); messages quote excerpts
--   of the input only (_excerpt).
-- Tests: test/sql/enqueue-many.test.ts, test/sql/bad-input.test.ts, test/sql/limits.test.ts,
--   test/sql/concurrency-keys.test.ts
CREATE OR REPLACE FUNCTION idemq._parse_jobs(jobs jsonb, OUT planned idemq._planned_job[], OUT keyed boolean,
                                             OUT parents boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the jobs array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_fields text[] := idemq._enqueue_fields();
  v_policies text[] := enum_range(NULL::idemq.duplicate_policy)::text[];
  v_now timestamptz := now();
  -- The defaults, typed once: read per element (v_defaults->>'priority', then
  -- numeric_in and enum_in for each element without the field) they cost
  -- about 8 ms per 20,000 elements (backend CPU, enqueue.bulk's batch).
  v_payload jsonb := idemq._job_defaults()->'payload';
  v_queue text := idemq._job_defaults()->>'queue';
  v_priority int := (idemq._job_defaults()->>'priority')::int;
  v_max_attempts int := (idemq._job_defaults()->>'max_attempts')::int;
  v_policy idemq.duplicate_policy := (idemq._job_defaults()->>'duplicate_policy')::idemq.duplicate_policy;
  v_key_retention interval := (idemq._job_defaults()->>'key_retention')::interval;
  v_bad int;
  v_problem text;
  v_ord int;
  v_value_problem text[];
  v_hint text;
  v_limits idemq._enqueue_limits;
  v_bad_backoffs jsonb[];
  v_elem jsonb;
  v_jobs jsonb := jobs;
  v_oversized int[] := '{}';
BEGIN
  IF jobs IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'jobs must not be NULL',
      HINT = 'Pass a JSON array of job objects, e.g. [{"task": "send_email"}].';
  END IF;
  IF jsonb_typeof(jobs) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('jobs must be a JSON array of job objects, not %s', jsonb_typeof(jobs)),
      HINT = 'Pass jsonb like [{"task": "send_email", "payload": {"to": "a@example.com"}}].';
  END IF;
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  IF jsonb_array_length(jobs) > v_limits.jobs_per_call THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('jobs has %s elements, over the limit of %s jobs per call (jobs_per_call)',
                       jsonb_array_length(jobs), v_limits.jobs_per_call),
      HINT = format('Split the batch into calls of at most %s jobs (one transaction can hold several calls); '
                    'an admin can raise jobs_per_call in idemq.settings. Nothing was enqueued.', v_limits.jobs_per_call);
  END IF;

  -- Payloads surely over payload_bytes, by their stored size (rule 4 of
  -- _job_rule_broken: over 16 x payload_bytes + 8 bytes), are found before
  -- the decoding and decoded as {}: the decoding copies every element into
  -- two tuplestores (spilled to temporary files past work_mem) and every row
  -- into an array, which for one element of 100 MB cost about 2 s. Looked
  -- for only when the whole array is that big; an object stays an object, so
  -- the rules before rule 4 judge the element as they would the real one.
  -- v_jobs is what is decoded; the value rules below report rule 4 for the
  -- elements in v_oversized, worded from the real payload.
  IF pg_column_size(jobs) > 16 * v_limits.payload_bytes + 8 THEN
    -- Each element read once (OFFSET 0: not pulled up, so not read per use),
    -- its payload only when the element itself is over the bound.
    SELECT coalesce(array_agg(e.i + 1 ORDER BY e.i), '{}') INTO v_oversized
    FROM generate_series(0, jsonb_array_length(jobs) - 1) AS e(i)
    CROSS JOIN LATERAL (SELECT jobs -> e.i AS element OFFSET 0) x
    WHERE pg_column_size(x.element) > 16 * v_limits.payload_bytes + 8
      AND jsonb_typeof(x.element -> 'payload') = 'object'
      AND pg_column_size(x.element -> 'payload') > 16 * v_limits.payload_bytes + 8;
    FOREACH v_ord IN ARRAY v_oversized LOOP
      v_jobs := jsonb_set(v_jobs, ARRAY[(v_ord - 1)::text, 'payload'], '{}');
    END LOOP;
  END IF;

  BEGIN
    -- One pass in C (jsonb_to_recordset, every field as text or jsonb, which
    -- any JSON value converts to) and cheap checks that skip absent fields.
    -- OFFSET 0 keeps the subquery `d` from being pulled up: pulled up, the
    -- checks would run once per use of `shape` (three). A MATERIALIZED CTE
    -- did the same but copied every decoded row into a tuplestore first:
    -- 10 ms more per 20,000 elements (backend CPU, 46 against 36 ms).
    -- In element order (the subquery scan keeps its input's order): ids are
    -- taken in that order, and the array needs no sort.
    SELECT array_agg(CASE WHEN d.shape IS NULL THEN ROW(
               d.ord, nextval('idemq.jobs_id_seq'), 'created', NULL,
               d.task,
               coalesce(nullif(d.payload, 'null'), v_payload),
               coalesce(d.queue, v_queue),
               coalesce(d.run_at::timestamptz, v_now),
               coalesce(d.priority::numeric::int, v_priority),
               coalesce(d.max_attempts::numeric::int, v_max_attempts),
               d.idempotency_key,
               coalesce(d.duplicate_policy::idemq.duplicate_policy, v_policy),
               nullif(d.backoff, 'null'),
               d.expires_at::timestamptz,
               CASE WHEN jsonb_typeof(d.after) = 'array' AND jsonb_array_length(d.after) > 0
                    THEN ARRAY(SELECT a::numeric::bigint FROM jsonb_array_elements_text(d.after) a) END,
               coalesce(d.key_retention::interval, v_key_retention),
               d.traceparent,
               d.concurrency_key,
               d.timeout::interval
             )::idemq._planned_job END),
           coalesce(bool_or(d.idempotency_key IS NOT NULL), false),
           coalesce(bool_or(jsonb_typeof(d.after) = 'array' AND jsonb_array_length(d.after) > 0), false),
           min(d.ord) FILTER (WHERE d.shape IS NOT NULL),
           (array_agg(d.shape ORDER BY d.ord) FILTER (WHERE d.shape IS NOT NULL))[1]
    FROM (SELECT r.*, CASE
          WHEN r.v - v_fields <> '{}' THEN
            format('has an unknown field "%s" (fields: %s)',
                   idemq._excerpt((SELECT min(f) FROM jsonb_object_keys(r.v - v_fields) f)), array_to_string(v_fields, ', '))
          WHEN r.task IS NOT NULL AND jsonb_typeof(r.v->'task') <> 'string' THEN
            format('task must be a string, not %s', idemq._excerpt((r.v->'task')::text))
          WHEN r.queue IS NOT NULL AND jsonb_typeof(r.v->'queue') <> 'string' THEN
            format('queue must be a string, not %s', idemq._excerpt((r.v->'queue')::text))
          WHEN r.run_at IS NOT NULL AND jsonb_typeof(r.v->'run_at') <> 'string' THEN
            format('run_at must be a timestamp string, not %s', idemq._excerpt((r.v->'run_at')::text))
          WHEN r.expires_at IS NOT NULL AND jsonb_typeof(r.v->'expires_at') <> 'string' THEN
            format('expires_at must be a timestamp string, not %s', idemq._excerpt((r.v->'expires_at')::text))
          WHEN r.priority IS NOT NULL AND (jsonb_typeof(r.v->'priority') <> 'number'
               OR r.priority::numeric NOT BETWEEN -2147483648 AND 2147483647
               OR r.priority::numeric <> trunc(r.priority::numeric)) THEN
            format('priority must be a whole number (higher runs first), not %s', idemq._excerpt((r.v->'priority')::text))
          WHEN r.max_attempts IS NOT NULL AND (jsonb_typeof(r.v->'max_attempts') <> 'number'
               OR r.max_attempts::numeric NOT BETWEEN -2147483648 AND 2147483647
               OR r.max_attempts::numeric <> trunc(r.max_attempts::numeric)) THEN
            format('max_attempts must be a whole number >= 1, not %s', idemq._excerpt((r.v->'max_attempts')::text))
          WHEN r.idempotency_key IS NOT NULL AND jsonb_typeof(r.v->'idempotency_key') <> 'string' THEN
            format('idempotency_key must be a string or null, not %s', idemq._excerpt((r.v->'idempotency_key')::text))
          WHEN r.duplicate_policy IS NOT NULL AND (jsonb_typeof(r.v->'duplicate_policy') <> 'string'
               OR r.duplicate_policy <> ALL (v_policies)) THEN
            format('duplicate_policy must be one of %s, not %s', array_to_string(v_policies, ', '),
                   idemq._excerpt((r.v->'duplicate_policy')::text))
          WHEN r.after IS NOT NULL AND jsonb_typeof(r.after) <> 'null' AND (jsonb_typeof(r.after) <> 'array'
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(r.after) a
                          WHERE jsonb_typeof(a) NOT IN ('number', 'null')
                             OR (jsonb_typeof(a) = 'number' AND (a::numeric NOT BETWEEN 1 AND 9223372036854775807
                                                                 OR a::numeric <> trunc(a::numeric))))) THEN
            format('after must be an array of job ids, not %s', idemq._excerpt(r.after::text))
          WHEN r.key_retention IS NOT NULL AND jsonb_typeof(r.v->'key_retention') <> 'string' THEN
            format('key_retention must be an interval string such as "14 days", not %s',
                   idemq._excerpt((r.v->'key_retention')::text))
          WHEN r.traceparent IS NOT NULL AND jsonb_typeof(r.v->'traceparent') <> 'string' THEN
            format('traceparent must be a string (a W3C traceparent) or null, not %s',
                   idemq._excerpt((r.v->'traceparent')::text))
          WHEN r.concurrency_key IS NOT NULL AND jsonb_typeof(r.v->'concurrency_key') <> 'string' THEN
            format('concurrency_key must be a string or null, not %s',
                   idemq._excerpt((r.v->'concurrency_key')::text))
          WHEN r.timeout IS NOT NULL AND jsonb_typeof(r.v->'timeout') <> 'string' THEN
            format('timeout must be an interval string such as "30 seconds", or null, not %s',
                   idemq._excerpt((r.v->'timeout')::text))
        END AS shape
      FROM ROWS FROM (jsonb_array_elements(v_jobs),
                      jsonb_to_recordset(v_jobs) AS (task text, payload jsonb, queue text, run_at text, priority text,
                        max_attempts text, idempotency_key text, duplicate_policy text, backoff jsonb,
                        expires_at text, after jsonb, key_retention text, traceparent text,
                        concurrency_key text, timeout text)) WITH ORDINALITY
           AS r(v, task, payload, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy,
                backoff, expires_at, after, key_retention, traceparent, concurrency_key, timeout, ord)
          OFFSET 0) d
    INTO planned, keyed, parents, v_bad, v_problem;
  EXCEPTION WHEN data_exception THEN
    -- An element that is not an object, or a timestamp or interval that does not parse,
    -- fails the statement: find the first such element; an earlier
    -- element's problem comes first.
    FOR v_bad, v_elem IN SELECT e.ord, e.v FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(v, ord) LOOP
      v_problem := CASE WHEN jsonb_typeof(v_elem) <> 'object' THEN format('must be a JSON object, not %s', idemq._excerpt(v_elem::text)) END;
      IF v_problem IS NULL THEN
        BEGIN
          PERFORM (v_elem->>'run_at')::timestamptz, (v_elem->>'expires_at')::timestamptz,
                  (v_elem->>'key_retention')::interval, (v_elem->>'timeout')::interval;
        EXCEPTION WHEN data_exception THEN
          v_problem := format('run_at/expires_at is not a timestamp, or key_retention/timeout not an interval: %s',
                              idemq._excerpt(SQLERRM));
        END;
      END IF;
      IF v_problem IS NOT NULL THEN
        IF v_bad > 1 THEN
          -- The real elements before it (their payloads too): their problems come first.
          PERFORM idemq._parse_jobs(jsonb_path_query_array(jobs, format('$[0 to %s]', v_bad - 2)::jsonpath));
        END IF;
        PERFORM idemq._raise_bad_job(v_problem, v_bad);
      END IF;
    END LOOP;
    RAISE;
  END;
  -- The value rules, on the decoded elements before the first that did not
  -- decode (its own problem comes first otherwise). An element in
  -- v_oversized breaks rule 4 unless it breaks an earlier one (rules 1-3
  -- judge its stand-in {} as the real object).
  -- The element first, then its wording (words one element, whatever
  -- others break a rule too). planned[N] is element N (ordinal N).
  SELECT p.ordinal INTO v_ord
  FROM unnest(planned) p
  WHERE p.ordinal < coalesce(v_bad, 2147483647)
    AND (idemq._job_rule_broken(p, v_limits) IS NOT NULL OR p.ordinal = ANY (v_oversized))
  ORDER BY p.ordinal LIMIT 1;
  IF FOUND THEN
    v_bad := v_ord;
    v_value_problem := CASE
      WHEN v_ord = ANY (v_oversized) AND coalesce(idemq._job_rule_broken(planned[v_ord], v_limits), 4) >= 4
        THEN idemq._payload_problem(jobs -> (v_ord - 1) -> 'payload', v_limits.payload_bytes)
      ELSE idemq._job_problem(planned[v_ord], v_limits) END;
    v_problem := v_value_problem[1];
    v_hint := v_value_problem[2];
  END IF;
  IF v_bad IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem, v_bad, v_hint);
  END IF;

  IF jobs @? '$[*].backoff ? (@.type() != "null")' THEN
    SELECT array_agg(d.spec) INTO v_bad_backoffs
    FROM (SELECT DISTINCT p.backoff AS spec FROM unnest(planned) p WHERE p.backoff IS NOT NULL) d
    WHERE idemq._backoff_problem(d.spec) IS NOT NULL;
    IF v_bad_backoffs IS NOT NULL THEN
      SELECT p.ordinal, idemq._backoff_problem(p.backoff) INTO v_bad, v_problem
      FROM unnest(planned) p WHERE p.backoff = ANY (v_bad_backoffs)
      ORDER BY p.ordinal LIMIT 1;
      PERFORM idemq._raise_bad_job(v_problem, v_bad);
    END IF;
  END IF;
  planned := coalesce(planned, '{}');
END;
$$;

COMMENT ON FUNCTION idemq._parse_jobs(jsonb) IS
  'Parse and check enqueue_many''s JSON array into planned jobs, raising 22023 for the first bad element.';
