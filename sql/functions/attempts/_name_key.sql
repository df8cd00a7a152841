-- idemq._name_key(name text) RETURNS bigint
--
-- The fixed-width key of a task or queue name in the runnable index
-- jobs_runnable_by_task_queue (_name_key(task), _name_key(queue), priority
-- DESC, run_at, id): a 64-bit hash of the name.
--
-- Why: with the names themselves as its first columns, every comparison of
-- an index insertion walked the variable-width names to reach priority,
-- run_at and id (nocache_index_getattr) and compared text, a sixth of a
-- bulk-enqueued job's cost (measured: bench/FINDINGS.md, "Why the SQL is
-- written as it is"). Fixed-width keys are compared in place.
--
-- Guarantees:
--   * The same key for the same name in every session and on every server of
--     one PostgreSQL major version (hashtextextended, the hash PostgreSQL's
--     hash partitioning relies on). The index is an expression index on it:
--     a major-version upgrade that changed the hash would need it rebuilt
--     (REINDEX), as hash-partitioned tables would.
--   * Every walk of the index compares the names as well as their keys, so
--     two names with one key (about one chance in 10^11 among 10,000
--     names) never mix their jobs. What such a collision costs: a walk reads
--     the other name's jobs and passes over them, and the loose scans that
--     list the names present (claim without a task or queue list) see one
--     of the two names per key, so the other's jobs wait for claims that
--     name it, or for the first name's runnable jobs to run out.
-- Concurrency: none (immutable).
-- Errors: none.
-- Tests: test/sql/claim-keys.test.ts, test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq._name_key(name text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(name, 0);

COMMENT ON FUNCTION idemq._name_key(text) IS
  'The 64-bit key of a task or queue name in the runnable index jobs_runnable_by_task_queue (its names are compared too).';
