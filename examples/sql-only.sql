-- idemq from plain SQL: any client that speaks SQL can enqueue, claim,
-- complete and fail jobs. Run it with psql on a migrated database
-- (`npx idemq migrate` first, as the schema's owner), logged in as a role
-- that is a member of this database's producer and worker roles and of nothing else
-- (`npx idemq roles grant app --producer --worker`; the roles are this
-- database's own): it needs no table
-- privilege, and reads jobs through idemq.job(), not idemq.jobs.
--
--   psql -v ON_ERROR_STOP=1 -f node_modules/idemq/examples/sql-only.sql "postgres://app:...@host/db"   # in an app that installed idemq
--   psql -v ON_ERROR_STOP=1 -f examples/sql-only.sql "postgres://app:...@host/db"                      # in a clone of the repository
--
-- test/contract/examples.test.ts runs this file as such a login on a fresh
-- database and checks its output.

\pset footer off

\echo '== 1. Enqueue with an idempotency key'
SELECT job_id AS invoice_job, deduplicated
FROM idemq.enqueue(task => 'send_invoice', payload => '{"order_id": 42}',
                   queue => 'example', idempotency_key => 'invoice:42') \gset
\echo 'enqueued job' :invoice_job

\echo '== 2. The same key again: the same job, deduplicated'
SELECT job_id = :invoice_job AS same_job, deduplicated
FROM idemq.enqueue(task => 'send_invoice', payload => '{"order_id": 42}',
                   queue => 'example', idempotency_key => 'invoice:42');

\echo '== 3. A worker claims it under a 30-second lease; (job_id, attempt, lease_token) is the fencing token'
-- token => true: the claim hands out a lease token, this claim's secret:
-- complete, fail, snooze and heartbeat then need it, so no other worker can
-- finish the job by guessing its attempt number.
SELECT job_id AS claimed_id, attempt AS claimed_attempt, lease_token AS claimed_token
FROM idemq.claim(worker_id => 'psql-worker', queues => ARRAY['example'], token => true) \gset
-- idemq.job(): a job's state and outcome, for producers and workers alike (no payload: see docs/sql-api.md).
SELECT job_id, task, state, attempt, locked_by FROM idemq.job(:claimed_id);

\echo '== 4. Complete it in the transaction that writes its effect (guarded: once per key)'
BEGIN;
SELECT idemq.guard(key => 'invoice-email:42', task => 'send_invoice') AS go_ahead;
-- ... the job's own writes go here, in the same transaction ...
SELECT idemq.complete(job_id => :claimed_id, attempt => :claimed_attempt, lease_token => :'claimed_token',
                      result => '{"sent": true}');
COMMIT;
SELECT job_id, state, result FROM idemq.job(:claimed_id);

\echo '== 5. A job that fails, is retried, then succeeds'
SELECT job_id AS charge_job
FROM idemq.enqueue(task => 'charge_card', payload => '{"order_id": 42, "amount": 1000}',
                   queue => 'example', max_attempts => 3,
                   backoff => '{"kind": "fixed", "delays": ["5 seconds"]}') \gset
SELECT job_id AS charge_id, attempt AS charge_attempt, lease_token AS charge_token
FROM idemq.claim(worker_id => 'psql-worker', queues => ARRAY['example'], token => true) \gset
-- retry_at => now() retries at once; leave it out to wait for the backoff (5 seconds here).
-- fail() returns the new state and the run_at it chose (NULL when the job failed for good).
SELECT state AS state_after_failure
FROM idemq.fail(job_id => :charge_id, attempt => :charge_attempt, lease_token => :'charge_token',
                error => '{"class": "CardDeclined", "message": "try again"}',
                retryable => true, retry_at => now());
SELECT job_id AS charge_id, attempt AS charge_attempt, lease_token AS charge_token
FROM idemq.claim(worker_id => 'psql-worker', queues => ARRAY['example'], token => true) \gset
\echo 'claimed again: attempt' :charge_attempt
SELECT idemq.complete(job_id => :charge_id, attempt => :charge_attempt, lease_token => :'charge_token');
SELECT job_id, state, attempt, jsonb_array_length(errors) AS errors, errors->0->>'class' AS first_error
FROM idemq.job(:charge_id);

\echo '== 6. stats(): jobs per queue, task and state; events per task'
SELECT * FROM idemq.stats() WHERE metric <> 'oldest_runnable_seconds';
