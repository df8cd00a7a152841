-- idemq._key_leaders(jobs idemq._planned_job[], first_round boolean)
--   RETURNS TABLE(key text, job_id bigint, task text, payload jsonb, payload_md5 text,
--                 duplicate_policy idemq.duplicate_policy, elements bigint, retention interval)
--
-- The leader of each idempotency key still undecided in a plan: its first
-- element (by ordinal) with that key, among those `undecided` (all keyed
-- elements in the first round, then those whose outcome is NULL). Within one
-- call the leader decides for the key; later elements with it follow
-- (_resolve_keys).
--
-- Guarantees: one row per undecided key, in key order (the order key rows
--   are written in, so overlapping batches lock them alike); job_id is the
--   id the plan gave the leader, which its key row names when it wins;
--   elements: how many undecided elements have the key (the leader included);
--   retention: the leader's key_retention, which its key row keeps.
-- Concurrency: none (reads only its argument). Inlined into the statements
--   of _resolve_keys that insert and take over key rows: a SQL-standard body
--   (BEGIN ATOMIC) without SET, since the planner never inlines a function
--   with a SET clause. As `AS $$` with SET search_path it ran as a function
--   scan: its rows went through a tuplestore and were sorted again for the
--   insert's ORDER BY (EXPLAIN VERBOSE shows "Function Scan on _key_leaders"
--   then; inlined, one Sort on the key under the Insert), about 10 ms per
--   20,000 keys. It lists the columns it reads (not p.*): an inlined query
--   only computes those its caller uses.
-- Errors: none.
-- Tests: test/sql/enqueue-many.test.ts, test/sql/enqueue-policies.test.ts
CREATE OR REPLACE FUNCTION idemq._key_leaders(jobs idemq._planned_job[], first_round boolean)
RETURNS TABLE(key text, job_id bigint, task text, payload jsonb, payload_md5 text,
              duplicate_policy idemq.duplicate_policy, elements bigint, retention interval)
LANGUAGE sql IMMUTABLE
BEGIN ATOMIC
  -- A BEGIN ATOMIC body keeps the columns of idemq._planned_job it was
  -- created with: created again by 0002, which adds timeout to the type.
  SELECT l.idempotency_key, l.job_id, l.task, l.payload, md5(l.payload::text), l.duplicate_policy, l.elements,
         l.key_retention
  FROM (SELECT DISTINCT ON (p.idempotency_key) p.idempotency_key, p.job_id, p.task, p.payload, p.duplicate_policy,
               count(*) OVER (PARTITION BY p.idempotency_key) AS elements, p.key_retention
        FROM unnest(jobs) AS p
        WHERE p.idempotency_key IS NOT NULL AND (first_round OR p.outcome IS NULL)
        ORDER BY p.idempotency_key, p.ordinal) l
  ORDER BY l.idempotency_key;
END;

COMMENT ON FUNCTION idemq._key_leaders(idemq._planned_job[], boolean) IS
  'The first undecided element of each idempotency key in a plan, in key order: the one that decides for the key.';
