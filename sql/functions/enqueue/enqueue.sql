-- idemq.enqueue(task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
--   run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, max_attempts int DEFAULT 10,
--   idempotency_key text DEFAULT NULL,
--   duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
--   backoff jsonb DEFAULT NULL, expires_at timestamptz DEFAULT NULL, after bigint[] DEFAULT NULL,
--   key_retention interval DEFAULT '14 days', traceparent text DEFAULT NULL,
--   concurrency_key text DEFAULT NULL, timeout interval DEFAULT NULL)
--   RETURNS TABLE(job_id bigint, deduplicated boolean, job_traceparent text)
--
-- Adds a job, or returns the active job that already holds its idempotency key.
--
-- Guarantees:
--   * Without a key: always a new job.
--   * A key held by an active job (scheduled, enqueued, processing, awaiting)
--     returns that job with deduplicated = true, whatever the policy.
--   * A key whose latest job is terminal: duplicate_policy decides
--     (idemq._policy_rejects): a new job, or IQ409.
--   * run_at NULL means now; a job runnable now NOTIFYs idemq_jobs at commit
--     when a listener waits for its queue (wait_for_jobs; _notify_waiting),
--     so enqueueing inside the caller's transaction works like an outbox.
--   * after: the job waits in `awaiting` until every parent succeeded.
--   * key_retention (with a key): how long the key ledger keeps the key after
--     its job finished; prune_keys() never releases it sooner, whatever its
--     own older_than (which can only make it longer). Stored on the key row,
--     so apps with different retentions share one database. A later job
--     that takes the key over sets its own.
--   * expires_at may already be past: the job is never claimed, and rescue()
--     marks it expired.
--   * traceparent: the W3C trace context of the producer's span (version 00,
--     _is_traceparent), stored on a new job and handed to its worker by
--     claim(), which continues the trace. A duplicate stores nothing: the job
--     keeps the context of the enqueue that created it.
--   * concurrency_key: at most K jobs of the key are admitted (enqueued,
--     scheduled or processing) at once, K the lower per_key of the job's
--     queue and task (set_limit), else 1; a job beyond them waits in
--     `awaiting` (job() says waiting_for 'concurrency_key') and is admitted
--     when an admitted job of the key finishes (_key_promote), the best
--     first (priority desc, run_at, id). A job with parents waits for them
--     first, then for its key. docs/design.md, "Concurrency keys".
--   * timeout: how long one attempt may run (NULL: no limit), stored on a
--     new job (a duplicate keeps its own): claim() and heartbeat() never
--     extend its lease past locked_at + timeout, so rescue() takes the job
--     back after it, and claim() returns it so a worker aborts the handler
--     then (docs/design.md, "Time limit per job").
--   * job_traceparent: the trace context stored on the job returned: the
--     caller's own for a new job; for a duplicate (deduplicated = true) the
--     existing job's (NULL when it has none), so the duplicate's enqueue span
--     can link to the trace that created the job.
-- Concurrency: N concurrent calls with one key create exactly one job and all
--   get its id; if the first inserter rolls back, a waiter creates it (the key
--   row's primary key serialises them; see _resolve_keys).
-- Errors: 22004 a required argument is NULL; 22023 bad argument (empty task,
--   payload not an object, max_attempts < 1, malformed backoff, a queue name
--   over 1000 characters, run_at infinite, traceparent not a W3C
--   traceparent..., an empty concurrency_key, timeout not positive...) or
--   over a limit of idemq.settings (task_bytes, payload_bytes, key_bytes for
--   the idempotency and the concurrency key, parents_per_job:
--   _enqueue_limits, read once per call);
--   IQ409 the policy rejects (DETAIL {"key","existing_job_id","existing_state","policy"};
--   the message quotes the key through _excerpt, escaped, DETAIL has it whole);
--   IQ422 the key is held by an active job for a different task or payload
--   (DETAIL {"key","existing_job_id"}); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts, test/sql/continuations.test.ts,
--   test/sql/bad-input.test.ts, test/sql/limits.test.ts, test/sql/traceparent.test.ts,
--   test/sql/concurrency-keys.test.ts, test/sql/concurrency-keys-concurrency.test.ts,
--   test/sql/timeout.test.ts
CREATE OR REPLACE FUNCTION idemq.enqueue(
  task text,
  payload jsonb DEFAULT '{}',
  queue text DEFAULT 'default',
  run_at timestamptz DEFAULT NULL,
  priority int DEFAULT 0,
  max_attempts int DEFAULT 10,
  idempotency_key text DEFAULT NULL,
  duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
  backoff jsonb DEFAULT NULL,
  expires_at timestamptz DEFAULT NULL,
  after bigint[] DEFAULT NULL,
  key_retention interval DEFAULT '14 days',
  traceparent text DEFAULT NULL,
  concurrency_key text DEFAULT NULL,
  timeout interval DEFAULT NULL)
RETURNS TABLE(job_id bigint, deduplicated boolean, job_traceparent text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_null text;
  v_job idemq._planned_job;
  v_problem text[];
  v_limits idemq._enqueue_limits;
  v_key_job bigint;
  v_state idemq.job_state;
BEGIN
  v_null := CASE
    WHEN enqueue.task IS NULL THEN 'task'
    WHEN enqueue.payload IS NULL THEN 'payload'
    WHEN enqueue.queue IS NULL THEN 'queue'
    WHEN enqueue.priority IS NULL THEN 'priority'
    WHEN enqueue.max_attempts IS NULL THEN 'max_attempts'
    WHEN enqueue.duplicate_policy IS NULL THEN 'duplicate_policy'
    WHEN enqueue.key_retention IS NULL THEN 'key_retention'
  END;
  IF v_null IS NOT NULL THEN
    PERFORM idemq._raise_null_argument('enqueue', v_null);
  END IF;

  -- Parse and check: the arguments are typed already; the rules are the
  -- ones every enqueue_many element meets.
  v_job.ordinal := 1;
  v_job.outcome := 'created';
  v_job.task := enqueue.task;
  v_job.payload := enqueue.payload;
  v_job.queue := enqueue.queue;
  v_job.run_at := coalesce(enqueue.run_at, now());
  v_job.priority := enqueue.priority;
  v_job.max_attempts := enqueue.max_attempts;
  v_job.idempotency_key := enqueue.idempotency_key;
  v_job.duplicate_policy := enqueue.duplicate_policy;
  v_job.backoff := nullif(enqueue.backoff, 'null');
  v_job.expires_at := enqueue.expires_at;
  v_job.after := CASE WHEN cardinality(enqueue.after) > 0 THEN enqueue.after END;
  v_job.key_retention := enqueue.key_retention;
  v_job.traceparent := enqueue.traceparent;
  v_job.concurrency_key := enqueue.concurrency_key;
  v_job.timeout := enqueue.timeout;
  -- The limits in a variable first (one query, _enqueue_limits inlined):
  -- passed as _job_rule_broken(v_job, idemq._enqueue_limits()), a function call
  -- as an argument its body uses more than once, the planner would not
  -- inline _job_rule_broken, and a SQL function called per enqueue costs about
  -- 20 us (5,000 calls: 55 against 35 us each, backend CPU).
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  -- The rules, and their wording only for a job that breaks one: PL/pgSQL
  -- compiles an expression whole, once per transaction (_job_rule_broken).
  IF idemq._job_rule_broken(v_job, v_limits) IS NOT NULL THEN
    v_problem := idemq._job_problem(v_job, v_limits);
  ELSIF v_job.backoff IS NOT NULL THEN
    v_problem := ARRAY[idemq._backoff_problem(v_job.backoff), NULL];
  END IF;
  IF v_problem[1] IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem[1], NULL, v_problem[2]);
  END IF;
  v_job.job_id := nextval('idemq.jobs_id_seq');

  -- The fast path: no parents, and no key or a key nobody holds: one or two
  -- INSERTs. The pipeline's parts (_enqueue_planned) cost about 15 us more per
  -- call for a job without key and 70 us more with a new key (backend CPU, 5,000
  -- calls), which single-enqueue throughput shows. A key that exists, or a
  -- concurrent inserter that committed it, goes to the pipeline, which decides;
  -- the test "writes the same row as enqueue_many" keeps the two INSERTs alike.
  IF v_job.after IS NULL THEN
    IF v_job.idempotency_key IS NOT NULL THEN
      -- A new key: the key row's primary key serialises concurrent callers
      -- (ON CONFLICT waits for an inserter's transaction).
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
      VALUES (v_job.idempotency_key, v_job.job_id, v_job.task, md5(v_job.payload::text), v_job.key_retention)
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.job_id INTO v_key_job;
    END IF;
    IF v_job.idempotency_key IS NULL OR v_key_job IS NOT NULL THEN
      -- A concurrency key: admitted at once, or waiting for its key
      -- (_key_admits takes the key's lock until commit).
      v_state := CASE WHEN v_job.concurrency_key IS NULL
                        OR idemq._key_admits(v_job.concurrency_key, v_job.queue, v_job.task)
                      THEN idemq._initial_state(v_job.run_at) ELSE 'awaiting' END;
      INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                   idempotency_key, backoff, expires_at, traceparent, concurrency_key, timeout)
      VALUES (v_job.job_id, v_job.task, v_job.queue, v_job.payload, v_state, v_job.priority, v_job.run_at,
              v_job.max_attempts, v_job.idempotency_key, v_job.backoff, v_job.expires_at, v_job.traceparent,
              v_job.concurrency_key, v_job.timeout);
      IF v_state = 'enqueued' THEN
        PERFORM idemq._notify_waiting(v_job.queue);
      END IF;
      job_id := v_job.job_id;
      deduplicated := false;
      job_traceparent := v_job.traceparent;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;

  v_job := (idemq._enqueue_planned(ARRAY[v_job], v_job.idempotency_key IS NOT NULL, v_job.after IS NOT NULL))[1];

  IF v_job.outcome = 'rejected' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ409',
      MESSAGE = format('idempotency key "%s" was used by job %s, which %s; duplicate_policy %s rejects a new job',
                       idemq._excerpt(enqueue.idempotency_key), v_job.job_id, v_job.existing_state, v_job.duplicate_policy),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id,
                                  'existing_state', v_job.existing_state, 'policy', v_job.duplicate_policy)::text,
      HINT = format('Read job %s for its outcome; to run the work again, enqueue with a policy that allows it '
                    '(allow_after_failed) or retry job %s.', v_job.job_id, v_job.job_id);
  ELSIF v_job.outcome = 'conflict' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ422',
      MESSAGE = format('idempotency key "%s" is held by active job %s for different work (task or payload differ)',
                       idemq._excerpt(enqueue.idempotency_key), v_job.job_id),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_job.job_id)::text,
      HINT = 'A key must name one piece of work: derive it from the task and the payload''s identity, '
             'or wait until the existing job finishes.';
  END IF;

  job_id := v_job.job_id;
  deduplicated := v_job.outcome = 'deduplicated';
  job_traceparent := v_job.traceparent;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue(text, jsonb, text, timestamptz, int, int, text, idemq.duplicate_policy, jsonb, timestamptz, bigint[], interval, text, text, interval) IS
  'Add a job, or return the active job holding its idempotency key; the duplicate policy decides after a terminal job.';
