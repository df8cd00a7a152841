-- idemq.enqueue(task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
--   run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, max_attempts int DEFAULT 10,
--   idempotency_key text DEFAULT NULL,
--   duplicate_policy idemq.duplicate_policy DEFAULT 'allow_after_failed',
--   backoff jsonb DEFAULT NULL, expires_at timestamptz DEFAULT NULL, after bigint[] DEFAULT NULL)
--   RETURNS TABLE(job_id bigint, deduplicated boolean)
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
--   * expires_at may already be past: the job is never claimed, and rescue()
--     marks it expired.
-- Concurrency: N concurrent calls with one key create exactly one job and all
--   get its id; if the first inserter rolls back, a waiter creates it (the key
--   row's primary key serialises them; see _enqueue_rows).
-- Errors: 22004 a required argument is NULL; 22023 bad argument (empty task,
--   payload not an object, max_attempts < 1, malformed backoff, a queue name
--   over 1000 characters...);
--   IQ409 the policy rejects (DETAIL {"key","existing_job_id","existing_state","policy"});
--   IQ422 the key is held by an active job for a different task or payload
--   (DETAIL {"key","existing_job_id"}); IQ404 a parent in `after` does not exist.
-- Tests: test/sql/enqueue.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts, test/sql/continuations.test.ts,
--   test/sql/bad-input.test.ts
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
  after bigint[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, deduplicated boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_null text;
  v_result record;
  v_state idemq.job_state;
  v_id bigint;
BEGIN
  v_null := CASE
    WHEN enqueue.task IS NULL THEN 'task'
    WHEN enqueue.payload IS NULL THEN 'payload'
    WHEN enqueue.queue IS NULL THEN 'queue'
    WHEN enqueue.priority IS NULL THEN 'priority'
    WHEN enqueue.max_attempts IS NULL THEN 'max_attempts'
    WHEN enqueue.duplicate_policy IS NULL THEN 'duplicate_policy'
  END;
  IF v_null IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('enqueue: %s must not be NULL', v_null),
      HINT = format('Pass a value for %s, or leave the argument out to use its default.', v_null);
  END IF;
  IF jsonb_typeof(enqueue.payload) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('enqueue: payload must be a JSON object, not %s', enqueue.payload),
      HINT = 'Wrap the value in an object, e.g. {"value": ...}.';
  END IF;

  -- The common cases are one or two INSERTs: no key, or a key nobody holds,
  -- without parents and with valid arguments. The shared bulk path costs about
  -- 0.5 ms per call in JSON round trips. Everything else, including every
  -- argument the bulk path would reject and every key already in the ledger,
  -- goes there, so errors and outcomes read the same whichever path a call takes.
  IF enqueue.after IS NULL AND coalesce(enqueue.idempotency_key <> '', true)
     AND enqueue.task <> '' AND enqueue.queue <> '' AND length(enqueue.queue) <= idemq._queue_name_limit()
     AND enqueue.max_attempts >= 1
     AND (enqueue.backoff IS NULL OR idemq._backoff_problem(enqueue.backoff) IS NULL) THEN
    IF enqueue.idempotency_key IS NOT NULL THEN
      -- A new key: the key row's primary key serialises concurrent callers
      -- (ON CONFLICT waits for an inserter's transaction); a key that exists
      -- (or a concurrent inserter that committed) is left to the shared path.
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5)
      VALUES (enqueue.idempotency_key, nextval('idemq.jobs_id_seq'), enqueue.task, md5(enqueue.payload::text))
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.job_id INTO v_id;
    END IF;
    IF enqueue.idempotency_key IS NULL OR v_id IS NOT NULL THEN
      v_state := idemq._initial_state(enqueue.run_at);
      INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                   idempotency_key, backoff, expires_at)
      VALUES (coalesce(v_id, nextval('idemq.jobs_id_seq')), enqueue.task, enqueue.queue, enqueue.payload,
              v_state, enqueue.priority, coalesce(enqueue.run_at, now()), enqueue.max_attempts,
              enqueue.idempotency_key, nullif(enqueue.backoff, 'null'), enqueue.expires_at)
      RETURNING j.id INTO job_id;
      IF v_state = 'enqueued' THEN
        PERFORM idemq._notify_waiting(enqueue.queue);
      END IF;
      deduplicated := false;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;

  SELECT r.r_job_id, r.r_outcome, r.r_existing_state, r.r_policy INTO v_result
  FROM idemq._enqueue_rows(jsonb_build_array(jsonb_build_object(
         'task', enqueue.task, 'payload', enqueue.payload, 'queue', enqueue.queue,
         'run_at', enqueue.run_at, 'priority', enqueue.priority,
         'max_attempts', enqueue.max_attempts, 'idempotency_key', enqueue.idempotency_key,
         'duplicate_policy', enqueue.duplicate_policy, 'backoff', enqueue.backoff,
         'expires_at', enqueue.expires_at, 'after', enqueue.after)), true) r;

  IF v_result.r_outcome = 'rejected' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ409',
      MESSAGE = format('idempotency key "%s" was used by job %s, which %s; duplicate_policy %s rejects a new job',
                       enqueue.idempotency_key, v_result.r_job_id, v_result.r_existing_state, v_result.r_policy),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_result.r_job_id,
                                  'existing_state', v_result.r_existing_state, 'policy', v_result.r_policy)::text,
      HINT = format('Read job %s for its outcome; to run the work again, enqueue with a policy that allows it '
                    '(allow_after_failed) or retry job %s.', v_result.r_job_id, v_result.r_job_id);
  ELSIF v_result.r_outcome = 'conflict' THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ422',
      MESSAGE = format('idempotency key "%s" is held by active job %s for different work (task or payload differ)',
                       enqueue.idempotency_key, v_result.r_job_id),
      DETAIL = jsonb_build_object('key', enqueue.idempotency_key, 'existing_job_id', v_result.r_job_id)::text,
      HINT = 'A key must name one piece of work: derive it from the task and the payload''s identity, '
             'or wait until the existing job finishes.';
  END IF;

  job_id := v_result.r_job_id;
  deduplicated := v_result.r_outcome = 'deduplicated';
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue(text, jsonb, text, timestamptz, int, int, text, idemq.duplicate_policy, jsonb, timestamptz, bigint[]) IS
  'Add a job, or return the active job holding its idempotency key; the duplicate policy decides after a terminal job.';
