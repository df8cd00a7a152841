-- idemq._claim_capped(key_tasks text[], key_queues text[], caps int[], take int,
--   OUT ids bigint[], OUT lost bigint[])
--
-- claim()'s jobs over several (task, queue) keys when flow control caps some
-- key below the batch (_claim_gate): each key's first caps[i] runnable jobs
-- in claim order, locked FOR UPDATE SKIP LOCKED, merged into claim order and
-- cut at take. _claim_merge would read the keys only as far as the global
-- order needs, but a capped key's jobs past its cap would fill the batch
-- with jobs _claim_take must then drop.
--
-- Guarantees:
--   * ids: at most take jobs, in claim order (priority desc, run_at, id);
--     lost: those whose previous attempt lost its lease.
--   * A key never gives more than its cap; no runnable job of a key that
--     this transaction could lock precedes, in claim order, a job of that
--     key in ids while the key is under its cap.
--   * Cost: one walk of jobs_runnable_by_task_queue per key, each reading
--     at most its cap (at most batch_size) jobs; the jobs read past take stay
--     locked until the claim's transaction ends.
-- Concurrency: FOR UPDATE SKIP LOCKED, as claim().
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts
CREATE OR REPLACE FUNCTION idemq._claim_capped(key_tasks text[], key_queues text[], caps int[], take int,
                                               OUT ids bigint[], OUT lost bigint[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
BEGIN
  WITH walked AS MATERIALIZED (
    SELECT w.id, w.lease_lost, w.priority, w.run_at
    FROM unnest(key_tasks, key_queues, caps) AS k(task, queue, cap)
    CROSS JOIN LATERAL (
      SELECT j.id, j.lease_lost, j.priority, j.run_at
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND idemq._name_key(j.task) = idemq._name_key(k.task)
        AND idemq._name_key(j.queue) = idemq._name_key(k.queue)
        AND j.task = k.task
        AND j.queue = k.queue
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT k.cap
      FOR UPDATE SKIP LOCKED
    ) w
  ),
  first AS (
    SELECT w.id, w.lease_lost, w.priority, w.run_at FROM walked w
    ORDER BY w.priority DESC, w.run_at, w.id
    LIMIT _claim_capped.take
  )
  SELECT coalesce(array_agg(f.id ORDER BY f.priority DESC, f.run_at, f.id), '{}'),
         coalesce(array_agg(f.id) FILTER (WHERE f.lease_lost), '{}')
  INTO ids, lost
  FROM first f;
END;
$$;

COMMENT ON FUNCTION idemq._claim_capped(text[], text[], int[], int) IS
  'claim() over several keys under flow control: each key''s first jobs up to its cap, locked SKIP LOCKED, merged into claim order.';
