-- Migration 0024_runnable_index_no_dedup: jobs_runnable_by_task_queue without btree deduplication, which can never merge its entries (each ends in the job's id) and was tried at every full leaf page: about 2,200 instructions per enqueued job (callgrind, a 10,000-job enqueue_many, PostgreSQL 15), 2% of a bulk enqueue.
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ (npm run migration:check compares them). Once released (listed
-- in sql/released.sha256) this file never changes again.
-- Up Migration

-- Hand-written schema changes (tables, columns, indexes) go here, before the
-- functions that may use them. An enum value (ALTER TYPE ... ADD VALUE) goes
-- in a migration of its own: PostgreSQL refuses to use a new value before its
-- transaction commits ("unsafe use of new value"), in a CHECK, an index
-- predicate or a SQL-language function body alike, and each migration commits
-- on its own, so the next migration can use it.

-- Deduplication merges equal keys into one posting list; this index's key
-- ends in id, so no two entries are equal, and each leaf page that fills
-- paid for a pass (_bt_dedup_pass) that found nothing before the split.
-- Applies to page splits from now on; no rebuild.
ALTER INDEX idemq.jobs_runnable_by_task_queue SET (deduplicate_items = off);

-- Down Migration

-- Hand-written reversal of the schema changes above goes here, after the functions.
ALTER INDEX idemq.jobs_runnable_by_task_queue RESET (deduplicate_items);
