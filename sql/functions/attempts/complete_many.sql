-- idemq.complete_many(job_ids bigint[], attempts int[], lease_tokens uuid[] DEFAULT NULL)
--   RETURNS SETOF bigint
--
-- Marks many jobs succeeded in one statement; returns the ids it completed.
--
-- Guarantees:
--   * locked_by keeps the worker whose attempt succeeded (for the job's timeline).
--   * Pairs job_ids[i] with attempts[i] and lease_tokens[i] (the token
--     claim() returned with that attempt; NULL, or lease_tokens NULL, only
--     for attempts claimed before 0.2.0, which have none); completes each
--     entry whose attempt, with that token, still holds its job, and skips
--     the others (lease lost, a token that is not the attempt's, unknown id)
--     without raising: for batched completion of jobs whose effects are
--     already committed (or idempotent). A caller that needs all-or-nothing
--     uses complete() in its transaction.
--   * Keys, continuations and retention 0 as complete(): with retention 0
--     the completed rows are deleted (jobs with children are updated and
--     left to apply_retention); retention is read once per call.
--   * An id given more than once counts once, with its highest attempt and
--     that entry's token (attempts only grow: only the latest can hold the job).
--   * Reads jobs by primary key only: the cost follows the batch, not the
--     rows the table keeps.
-- Concurrency: updates the rows in id order (no deadlock between two batches).
-- Errors: 22004 NULL job_ids or attempts; 22023 arrays of different lengths or more
--   than 10,000 ids (both checked by _pairs_by_id).
-- Tests: test/sql/complete.test.ts, test/sql/claim.test.ts (no sequential scan),
--   test/sql/retention-zero.test.ts, test/sql/fencing.test.ts
CREATE OR REPLACE FUNCTION idemq.complete_many(job_ids bigint[], attempts int[], lease_tokens uuid[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_attempts int[];
  v_tokens uuid[];
  v_r record;
  v_gone bigint[];
BEGIN
  -- The pairs checked and sorted by id (_pairs_by_id), so width_bucket() finds an id's
  -- attempt by binary search. The UPDATE itself selects by "id = ANY (ids)", a primary-key probe
  -- per job whatever the table holds: joined to the arrays instead, the planner
  -- hashed or scanned the whole table for batches of a few hundred (seen in
  -- EXPLAIN). The held-check and the attempt sit in the UPDATE's own WHERE, so
  -- a row changed concurrently (rescue, a new claim) is re-checked on its newest
  -- version and skipped if no longer held by that attempt. No row lock first:
  -- that wrote a WAL record per job for nothing. "Held" is _held(), the lease
  -- columns, not "state = 'processing'", which matches the jobs_leases partial
  -- index: the planner then scanned every job in flight once per pair.
  SELECT p.ids, p.attempts_by_id, p.tokens_by_id INTO v_ids, v_attempts, v_tokens
  FROM idemq._pairs_by_id(job_ids, attempts, lease_tokens, 'complete_many',
                          'Pass arrays of equal length: the ids, attempts and lease tokens claim() returned.') p;

  SELECT * INTO v_r FROM idemq._success_retention() z;
  IF v_r.any_zero THEN
    -- Retention 0: delete instead of update, with the ledger write the
    -- trigger would make (as in complete()). The ids left (children, another
    -- retention, lost leases) take the UPDATE below in a statement of its
    -- own, so a row changed meanwhile (an enqueue setting has_children) is
    -- judged on its newest version; when every id went, it is skipped.
    WITH gone AS (
      DELETE FROM idemq.jobs AS j
      WHERE j.id = ANY (v_ids)
        AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
        AND j.lease_token IS NOT DISTINCT FROM v_tokens[width_bucket(j.id, v_ids)]
        AND idemq._held(j.lease_expires_at, j.locked_by)
        AND NOT j.has_children
        AND idemq._gone_on_success(j.task, j.queue, v_r.default_zero, v_r.zero_tasks, v_r.kept_tasks,
                                   v_r.zero_queues, v_r.kept_queues)
      RETURNING j.id, j.idempotency_key
    ), ledger AS (
      UPDATE idemq.keys AS k SET finished_state = 'succeeded', finished_at = now()
      FROM gone g WHERE k.key = g.idempotency_key AND k.job_id = g.id
    )
    SELECT coalesce(array_agg(g.id), '{}') INTO v_gone FROM gone g;
    RETURN QUERY SELECT unnest(v_gone);
    IF cardinality(v_gone) = cardinality(v_ids) THEN
      RETURN;
    END IF;
    -- What is left, still sorted by id (width_bucket needs the order).
    SELECT array_agg(p.id ORDER BY p.id), array_agg(p.attempt ORDER BY p.id), array_agg(p.token ORDER BY p.id)
      INTO v_ids, v_attempts, v_tokens
    FROM unnest(v_ids, v_attempts, v_tokens) p(id, attempt, token) WHERE NOT p.id = ANY (v_gone);
  END IF;

  RETURN QUERY
  UPDATE idemq.jobs AS j
  SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
  WHERE j.id = ANY (v_ids)
    AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
    AND j.lease_token IS NOT DISTINCT FROM v_tokens[width_bucket(j.id, v_ids)]
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.complete_many(bigint[], int[], uuid[]) IS
  'Mark many (job_id, attempt, lease_token) entries succeeded; returns the ids completed, skipping lost leases.';
