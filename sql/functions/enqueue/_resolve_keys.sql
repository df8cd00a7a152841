-- idemq._resolve_keys(jobs idemq._planned_job[]) RETURNS idemq._planned_job[]
--
-- Resolve keys, the second part of an enqueue: decides the outcome of every
-- element with an idempotency key against the key ledger, writing the key
-- rows this call wins.
--
-- Guarantees:
--   * Per key, its leader (_key_leaders) decides: a new key is inserted
--     (`created`, with the leader's planned id and key_retention); a key whose latest job is
--     terminal is taken over when _policy_rejects allows (`created`), else
--     `rejected` (existing_state: how that job ended); a key held by an
--     active job yields that job: `deduplicated`, or `conflict` when the task
--     or payload differ (jsonb equality: the md5 of the jsonb text is only a
--     fast path, since numbers equal as jsonb can print differently, 1 and
--     1.0).
--   * Later elements with the key follow: `deduplicated` against the job the
--     key then holds (or `conflict`), or the leader's rejection.
--   * Usually one round; another only when a key row changed between two
--     statements (pruned, or finished, concurrently). All keys new and none
--     repeated, the common bulk case, is one statement: for a batch of 64
--     elements or more a plain INSERT in a subtransaction (any key that
--     exists rolls it back, and the round with ON CONFLICT decides), else
--     INSERT ... ON CONFLICT DO NOTHING.
--   * job_id of a decided element: its own planned id when `created`, else
--     the key's job; traceparent likewise: its own when `created`, else the
--     trace context stored on the active job holding the key (NULL when it
--     has none, or for a rejection), so a duplicate's enqueue span can link
--     to the trace that created the job.
-- Concurrency: key rows are inserted in key order; N concurrent callers with
--   one new key create exactly one job: the key row's primary key serialises
--   them (ON CONFLICT waits for the inserter's transaction); if the inserter
--   rolls back, a waiter inserts (the plain INSERT of a batch waits alike,
--   then fails and leaves the key to ON CONFLICT). A batch's attempt holds
--   one subtransaction id until the caller's transaction ends. A takeover locks the key row, so a
--   concurrent taker waits, then sees the key active. Under REPEATABLE READ a
--   concurrent committed duplicate raises 40001: retry.
-- Errors: 40001 if keys keep changing under the call (pruned and re-created repeatedly).
-- Tests: test/sql/enqueue-many.test.ts, test/sql/enqueue-policies.test.ts,
--   test/sql/enqueue-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._resolve_keys(jobs idemq._planned_job[])
RETURNS idemq._planned_job[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_round int := 0;
  v_undecided bigint;
  v_leaders bigint;
  v_inserted bigint;
BEGIN
  -- A batch whose keys are all new, the common bulk case, first tries a
  -- plain INSERT of its leaders in a subtransaction: ON CONFLICT DO NOTHING
  -- checks the index before each insert and confirms each speculative
  -- insertion in the WAL, which cost 25 ms per 20,000 new keys (backend CPU)
  -- and 26 bytes of WAL per key (enqueue.bulk-keyed: 536 B/job with the plain
  -- insert, 562 with ON CONFLICT). A key that exists, or that a concurrent
  -- inserter commits first (the insert waits for its transaction, as ON
  -- CONFLICT does), raises unique_violation: the subtransaction rolls back
  -- and the round below decides with ON CONFLICT. A first key that exists
  -- (a resubmitted batch) skips the attempt. Only for batches of 64 elements
  -- or more: each attempt holds a subtransaction id until the caller's
  -- transaction ends, and a transaction with more than 64 of them slows every
  -- session's snapshots; below that ON CONFLICT's cost is a few microseconds.
  IF cardinality(jobs) >= 64
     AND NOT EXISTS (SELECT 1 FROM idemq.keys k WHERE k.key = (jobs[1]).idempotency_key) THEN
    BEGIN
      INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
      SELECT l.key, l.job_id, l.task, l.payload_md5, l.retention FROM idemq._key_leaders(jobs, true) l ORDER BY l.key;
      GET DIAGNOSTICS v_inserted = ROW_COUNT;
      v_leaders := v_inserted;
      SELECT count(*) INTO v_undecided FROM unnest(jobs) p WHERE p.idempotency_key IS NOT NULL;
    EXCEPTION WHEN unique_violation THEN
      v_inserted := NULL;
    END;
  END IF;

  LOOP
    -- The plan's outcomes start as `created`: in the first round every keyed
    -- element is undecided, later only those left NULL by the round before.
    IF v_round > 0 OR v_inserted IS NULL THEN
      WITH leader AS MATERIALIZED (
        SELECT * FROM idemq._key_leaders(jobs, v_round = 0)
      ), ins AS (
        INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
        SELECT l.key, l.job_id, l.task, l.payload_md5, l.retention FROM leader l ORDER BY l.key
        ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
        RETURNING 1
      )
      SELECT (SELECT coalesce(sum(l.elements), 0) FROM leader l), (SELECT count(*) FROM leader),
             (SELECT count(*) FROM ins)
      INTO v_undecided, v_leaders, v_inserted;
    END IF;
    -- Every undecided element led a new key: all stay created.
    EXIT WHEN v_inserted = v_undecided;

    v_round := v_round + 1;
    IF v_round > 10 THEN
      RAISE EXCEPTION USING ERRCODE = '40001',
        MESSAGE = 'idempotency keys kept changing during enqueue (pruned and re-created concurrently)',
        HINT = 'Retry the call.';
    END IF;

    IF v_inserted < v_leaders THEN
      UPDATE idemq.keys AS k
      SET job_id = l.job_id, task = l.task, payload_md5 = l.payload_md5, retention = l.retention,
          finished_state = NULL, finished_at = NULL, created_at = now()
      FROM idemq._key_leaders(jobs, v_round = 1) l
      WHERE k.key = l.key
        AND k.finished_state IS NOT NULL
        AND NOT idemq._policy_rejects(l.duplicate_policy, k.finished_state);
    END IF;

    -- Decide from the key rows as they now stand (this call's writes
    -- included). A key held by this call's leader has no job row yet: its
    -- payload is the leader's. An active key's job exists (purge deletes only
    -- terminal jobs) and committed with the key row, so its payload settles
    -- jsonb equality. A key that vanished (pruned) or turned terminal in
    -- between stays undecided (outcome NULL) for the next round. Named
    -- fields replace the decided ones (jsonb_populate_record on the row).
    jobs := ARRAY(
      SELECT CASE WHEN w.undecided
                  THEN jsonb_populate_record(w.p, jsonb_build_object(
                         'outcome', d.outcome,
                         'job_id', CASE WHEN coalesce(d.outcome, 'created') = 'created' THEN (w.p).job_id
                                        ELSE w.holder_id END,
                         'existing_state', CASE WHEN d.outcome = 'rejected' THEN w.holder_finished END,
                         'traceparent', CASE WHEN coalesce(d.outcome, 'created') = 'created' THEN (w.p).traceparent
                                             WHEN w.holder_id = w.lead_job_id THEN w.lead_traceparent
                                             ELSE w.holder_traceparent END))
                  ELSE w.p END
      FROM (SELECT p, p.idempotency_key IS NOT NULL AND (v_round = 1 OR p.outcome IS NULL) AS undecided,
                   h.job_id AS holder_id, h.task AS holder_task, h.payload_md5 AS holder_md5,
                   h.finished_state AS holder_finished, h.payload AS holder_payload,
                   h.traceparent AS holder_traceparent, first_value(p.traceparent) OVER k AS lead_traceparent,
                   first_value(p.ordinal) OVER k AS lead_ordinal, first_value(p.job_id) OVER k AS lead_job_id,
                   first_value(p.payload) OVER k AS lead_payload,
                   first_value(p.duplicate_policy) OVER k AS lead_policy
            FROM unnest(jobs) p
            LEFT JOIN LATERAL (
              SELECT hk.job_id, hk.task, hk.payload_md5, hk.finished_state, hj.payload, hj.traceparent
              FROM idemq.keys hk
              LEFT JOIN idemq.jobs hj ON hj.id = hk.job_id AND hk.finished_state IS NULL
              WHERE hk.key = p.idempotency_key) h ON true
            WINDOW k AS (PARTITION BY p.idempotency_key ORDER BY p.ordinal)) w
      CROSS JOIN LATERAL (SELECT CASE
          WHEN w.holder_id IS NULL THEN NULL
          WHEN w.holder_id = w.lead_job_id AND (w.p).ordinal = w.lead_ordinal THEN 'created'
          WHEN w.holder_id = w.lead_job_id OR w.holder_finished IS NULL THEN
            CASE WHEN (w.p).task = w.holder_task
                      AND (md5((w.p).payload::text) = w.holder_md5
                           OR (w.p).payload = coalesce(w.holder_payload, w.lead_payload))
                 THEN 'deduplicated' ELSE 'conflict' END
          WHEN idemq._policy_rejects(w.lead_policy, w.holder_finished) THEN 'rejected'
        END AS outcome) d
      ORDER BY (w.p).ordinal);
  END LOOP;
  RETURN jobs;
END;
$$;

COMMENT ON FUNCTION idemq._resolve_keys(idemq._planned_job[]) IS
  'Decide every keyed element of a plan against the key ledger (created, deduplicated, rejected, conflict), writing the key rows it wins.';
