// Bad input to every public function raises a clear error (SQLSTATE class 22,
// or IQ4xx) with a HINT that says the fix, and writes nothing; and no function
// is STRICT (a STRICT function answers NULL input with a silent NULL).
// Each case runs on a job zoo, in a transaction that rolls back, under a
// savepoint; the row counts of every idemq table are compared before and after.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { useTestDatabase, inRollback, expectSqlError } from "../helpers/db.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { buildZoo, type Zoo } from "../helpers/zoo.ts";

const db = useTestDatabase({ poolSize: 4 });

interface Case {
  fn: string;
  what: string;
  /** SQL; ${processing}, ${attempt}, ${failed} are replaced by zoo values. */
  sql: string;
  code: string;
  /** PostgreSQL's own errors (a failed cast, before idemq runs) carry no HINT. */
  noHint?: true;
}

const c = (fn: string, what: string, sql: string, code: string, extra: Partial<Case> = {}): Case => ({ fn, what, sql, code, ...extra });

const E = "SELECT * FROM idemq.enqueue";
const M = "SELECT * FROM idemq.enqueue_many";
const CL = "SELECT * FROM idemq.claim";

const CASES: Case[] = [
  // enqueue
  c("enqueue", "NULL task", `${E}(task => NULL)`, "22004"),
  c("enqueue", "empty task", `${E}(task => '')`, "22023"),
  c("enqueue", "NULL payload", `${E}(task => 't', payload => NULL)`, "22004"),
  c("enqueue", "payload an array", `${E}(task => 't', payload => '[1, 2]')`, "22023"),
  c("enqueue", "payload a string", `${E}(task => 't', payload => '"x"')`, "22023"),
  c("enqueue", "payload JSON null", `${E}(task => 't', payload => 'null')`, "22023"),
  c("enqueue", "NULL queue", `${E}(task => 't', queue => NULL)`, "22004"),
  c("enqueue", "empty queue", `${E}(task => 't', queue => '')`, "22023"),
  c("enqueue", "NULL priority", `${E}(task => 't', priority => NULL)`, "22004"),
  c("enqueue", "max_attempts 0", `${E}(task => 't', max_attempts => 0)`, "22023"),
  c("enqueue", "max_attempts negative", `${E}(task => 't', max_attempts => -3)`, "22023"),
  c("enqueue", "NULL max_attempts", `${E}(task => 't', max_attempts => NULL)`, "22004"),
  c("enqueue", "empty idempotency_key", `${E}(task => 't', idempotency_key => '')`, "22023"),
  c("enqueue", "NULL duplicate_policy", `${E}(task => 't', duplicate_policy => NULL)`, "22004"),
  c("enqueue", "unknown policy via a cast", `${E}(task => 't', duplicate_policy => 'reject_never'::idemq.duplicate_policy)`, "22P02", {
    noHint: true,
  }),
  c("enqueue", "unknown policy as a literal", `${E}(task => 't', duplicate_policy => 'reject_never')`, "22P02", { noHint: true }),
  c("enqueue", "backoff a string", `${E}(task => 't', backoff => '"fast"')`, "22023"),
  c("enqueue", "backoff of unknown kind", `${E}(task => 't', backoff => '{"kind": "linear"}')`, "22023"),
  c("enqueue", "backoff without kind", `${E}(task => 't', backoff => '{"delays": ["1 s"]}')`, "22023"),
  c("enqueue", "backoff with an unknown field", `${E}(task => 't', backoff => '{"kind": "polynomial", "base": 2}')`, "22023"),
  c("enqueue", "fixed backoff without delays", `${E}(task => 't', backoff => '{"kind": "fixed", "delays": []}')`, "22023"),
  c("enqueue", "fixed backoff with a non-interval", `${E}(task => 't', backoff => '{"kind": "fixed", "delays": ["soon"]}')`, "22023"),
  c("enqueue", "fixed backoff with a negative delay", `${E}(task => 't', backoff => '{"kind": "fixed", "delays": ["-1 s"]}')`, "22023"),
  c("enqueue", "exponential backoff without initial", `${E}(task => 't', backoff => '{"kind": "exponential"}')`, "22023"),
  c("enqueue", "exponential backoff, initial 0", `${E}(task => 't', backoff => '{"kind": "exponential", "initial": "0 s"}')`, "22023"),
  c("enqueue", "exponential backoff, factor < 1", `${E}(task => 't', backoff => '{"kind": "exponential", "initial": "1 s", "factor": 0.5}')`, "22023"),
  c("enqueue", "exponential backoff, jitter 1", `${E}(task => 't', backoff => '{"kind": "exponential", "initial": "1 s", "jitter": 1}')`, "22023"),
  c("enqueue", "exponential backoff, max not an interval", `${E}(task => 't', backoff => '{"kind": "exponential", "initial": "1 s", "max": 60}')`, "22023"),
  c("enqueue", "after with id 0", `${E}(task => 't', after => ARRAY[0]::bigint[])`, "22023"),
  c("enqueue", "after with a NULL id", `${E}(task => 't', after => ARRAY[NULL]::bigint[])`, "22023"),
  c("enqueue", "after naming no job", `${E}(task => 't', after => ARRAY[987654321]::bigint[])`, "IQ404"),
  c("enqueue", "timeout 0", `${E}(task => 't', timeout => '0 seconds')`, "22023"),
  c("enqueue", "timeout negative", `${E}(task => 't', timeout => '-1 minute')`, "22023"),
  c("enqueue", "timeout over duration_days", `${E}(task => 't', timeout => '36501 days')`, "22023"),
  // enqueue_many
  c("enqueue_many", "NULL", `${M}(jobs => NULL)`, "22004"),
  c("enqueue_many", "an object, not an array", `${M}(jobs => '{"task": "t"}')`, "22023"),
  c("enqueue_many", "a string", `${M}(jobs => '"t"')`, "22023"),
  c("enqueue_many", "an array of numbers", `${M}(jobs => '[1, 2]')`, "22023"),
  c("enqueue_many", "an array of strings", `${M}(jobs => '["t"]')`, "22023"),
  c("enqueue_many", "an array with a null", `${M}(jobs => '[{"task": "t"}, null]')`, "22023"),
  c("enqueue_many", "an unknown field", `${M}(jobs => '[{"task": "t", "priorty": 1}]')`, "22023"),
  c("enqueue_many", "no task", `${M}(jobs => '[{"payload": {}}]')`, "22023"),
  c("enqueue_many", "empty task", `${M}(jobs => '[{"task": ""}]')`, "22023"),
  c("enqueue_many", "task a number", `${M}(jobs => '[{"task": 7}]')`, "22023"),
  c("enqueue_many", "payload not an object", `${M}(jobs => '[{"task": "t", "payload": [1]}]')`, "22023"),
  c("enqueue_many", "empty queue", `${M}(jobs => '[{"task": "t", "queue": ""}]')`, "22023"),
  c("enqueue_many", "unknown policy string", `${M}(jobs => '[{"task": "t", "duplicate_policy": "reject_never"}]')`, "22023"),
  c("enqueue_many", "max_attempts 0", `${M}(jobs => '[{"task": "t", "max_attempts": 0}]')`, "22023"),
  c("enqueue_many", "max_attempts 1.5", `${M}(jobs => '[{"task": "t", "max_attempts": 1.5}]')`, "22023"),
  c("enqueue_many", "max_attempts a string", `${M}(jobs => '[{"task": "t", "max_attempts": "3"}]')`, "22023"),
  c("enqueue_many", "priority beyond int", `${M}(jobs => '[{"task": "t", "priority": 3000000000}]')`, "22023"),
  c("enqueue_many", "run_at not a timestamp", `${M}(jobs => '[{"task": "t", "run_at": "next tuesday-ish"}]')`, "22023"),
  c("enqueue_many", "run_at a number", `${M}(jobs => '[{"task": "t", "run_at": 1700000000}]')`, "22023"),
  c("enqueue_many", "expires_at not a timestamp", `${M}(jobs => '[{"task": "t", "expires_at": "soon"}]')`, "22023"),
  c("enqueue_many", "empty idempotency_key", `${M}(jobs => '[{"task": "t", "idempotency_key": ""}]')`, "22023"),
  c("enqueue_many", "malformed backoff", `${M}(jobs => '[{"task": "t", "backoff": {"kind": "fixed"}}]')`, "22023"),
  c("enqueue_many", "after not an array", `${M}(jobs => '[{"task": "t", "after": 5}]')`, "22023"),
  c("enqueue_many", "one bad element among good ones", `${M}(jobs => '[{"task": "ok"}, {"task": "ok", "max_attempts": 0}, {"task": "ok"}]')`, "22023"),
  c("enqueue_many", "after naming no job", `${M}(jobs => '[{"task": "t"}, {"task": "t", "after": [987654321]}]')`, "IQ404"),
  // job
  c("job", "NULL job_id", "SELECT * FROM idemq.job(job_id => NULL)", "22004"),
  // claim
  c("claim", "NULL worker_id", `${CL}(worker_id => NULL)`, "22004"),
  c("claim", "empty worker_id", `${CL}(worker_id => '')`, "22023"),
  c("claim", "batch_size 0", `${CL}(worker_id => 'w', batch_size => 0)`, "22023"),
  c("claim", "batch_size 1001", `${CL}(worker_id => 'w', batch_size => 1001)`, "22023"),
  c("claim", "batch_size negative", `${CL}(worker_id => 'w', batch_size => -1)`, "22023"),
  c("claim", "NULL batch_size", `${CL}(worker_id => 'w', batch_size => NULL)`, "22004"),
  c("claim", "queues an empty array", `${CL}(worker_id => 'w', queues => '{}')`, "22023"),
  c("claim", "queues with a NULL", `${CL}(worker_id => 'w', queues => ARRAY[NULL]::text[])`, "22023"),
  c("claim", "queues with an empty name", `${CL}(worker_id => 'w', queues => ARRAY['zoo.enqueued', ''])`, "22023"),
  c("claim", "lease 0", `${CL}(worker_id => 'w', lease => '0 seconds')`, "22023"),
  c("claim", "lease negative", `${CL}(worker_id => 'w', lease => '-30 seconds')`, "22023"),
  c("claim", "lease over a day", `${CL}(worker_id => 'w', lease => '25 hours')`, "22023"),
  c("claim", "NULL lease", `${CL}(worker_id => 'w', lease => NULL)`, "22004"),
  c("claim", "tasks an empty array", `${CL}(worker_id => 'w', tasks => '{}')`, "22023"),
  c("claim", "tasks with a NULL", `${CL}(worker_id => 'w', tasks => ARRAY[NULL]::text[])`, "22023"),
  c("claim", "tasks with an empty name", `${CL}(worker_id => 'w', tasks => ARRAY['a', ''])`, "22023"),
  c("claim", "worker_id over worker_id_bytes", `${CL}(worker_id => repeat('w', 257))`, "22023"),
  // wait_for_jobs, stop_waiting
  c("wait_for_jobs", "queues an empty array", "SELECT idemq.wait_for_jobs(queues => '{}')", "22023"),
  c("wait_for_jobs", "queues with a NULL", "SELECT idemq.wait_for_jobs(queues => ARRAY[NULL]::text[])", "22023"),
  c("wait_for_jobs", "queues with an empty name", "SELECT idemq.wait_for_jobs(queues => ARRAY['a', ''])", "22023"),
  c("stop_waiting", "queues an empty array", "SELECT idemq.stop_waiting(queues => '{}')", "22023"),
  c("stop_waiting", "queues with a NULL", "SELECT idemq.stop_waiting(queues => ARRAY['a', NULL])", "22023"),
  // complete / complete_many
  c("complete", "NULL job_id", "SELECT idemq.complete(job_id => NULL, attempt => 1)", "22004"),
  c("complete", "NULL attempt", "SELECT idemq.complete(job_id => ${processing}, attempt => NULL)", "22004"),
  c("complete", "no such job", "SELECT idemq.complete(job_id => 987654321, attempt => 1)", "IQ404"),
  c("complete_many", "NULL job_ids", "SELECT * FROM idemq.complete_many(job_ids => NULL, attempts => '{1}')", "22004"),
  c("complete_many", "NULL attempts", "SELECT * FROM idemq.complete_many(job_ids => ARRAY[${processing}]::bigint[], attempts => NULL)", "22004"),
  c("complete_many", "mismatched arrays", "SELECT * FROM idemq.complete_many(job_ids => ARRAY[${processing}]::bigint[], attempts => '{1, 2}')", "22023"),
  c("complete_many", "lease_tokens of another length", "SELECT * FROM idemq.complete_many(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease_tokens => '{}')", "22023"),
  c("complete_many", "more than 10,000 ids", "SELECT * FROM idemq.complete_many(job_ids => array_fill(1::bigint, ARRAY[10001]), attempts => array_fill(1, ARRAY[10001]))", "22023"),
  c("complete_and_take_next", "NULL worker_id", "SELECT * FROM idemq.complete_and_take_next(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease_tokens => NULL, worker_id => NULL)", "22004"),
  c("complete_and_take_next", "empty worker_id", "SELECT * FROM idemq.complete_and_take_next(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease_tokens => NULL, worker_id => '')", "22023"),
  c("complete_and_take_next", "queues with an empty name", "SELECT * FROM idemq.complete_and_take_next(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease_tokens => NULL, worker_id => 'w', queues => ARRAY[''])", "22023"),
  c("complete_and_take_next", "tasks an empty array", "SELECT * FROM idemq.complete_and_take_next(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease_tokens => NULL, worker_id => 'w', tasks => '{}')", "22023"),
  c("complete_and_take_next", "NULL lease", "SELECT * FROM idemq.complete_and_take_next(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease_tokens => NULL, worker_id => 'w', lease => NULL)", "22004"),
  c("complete_and_take_next", "mismatched arrays", "SELECT * FROM idemq.complete_and_take_next(job_ids => ARRAY[${processing}]::bigint[], attempts => '{1, 2}', lease_tokens => NULL, worker_id => 'w')", "22023"),
  // fail
  c("fail", "NULL job_id", `SELECT idemq.fail(job_id => NULL, attempt => 1, error => '"x"')`, "22004"),
  c("fail", "NULL attempt", `SELECT idemq.fail(job_id => \${processing}, attempt => NULL, error => '"x"')`, "22004"),
  c("fail", "NULL error", "SELECT idemq.fail(job_id => ${processing}, attempt => ${attempt}, error => NULL)", "22004"),
  c("fail", "error an array", "SELECT idemq.fail(job_id => ${processing}, attempt => ${attempt}, error => '[1]')", "22023"),
  c("fail", "error a number", "SELECT idemq.fail(job_id => ${processing}, attempt => ${attempt}, error => '42')", "22023"),
  c("fail", "NULL retryable", `SELECT idemq.fail(job_id => \${processing}, attempt => \${attempt}, error => '"x"', retryable => NULL)`, "22004"),
  c("fail", "no such job", `SELECT idemq.fail(job_id => 987654321, attempt => 1, error => '"x"')`, "IQ404"),
  c("fail", "backoff of an unknown kind", `SELECT idemq.fail(job_id => \${processing}, attempt => \${attempt}, error => '"x"', backoff => '{"kind": "linear"}')`, "22023"),
  c("fail", "max_attempts 0", `SELECT idemq.fail(job_id => \${processing}, attempt => \${attempt}, error => '"x"', max_attempts => 0)`, "22023"),
  c("fail", "retry_at infinity", `SELECT idemq.fail(job_id => \${processing}, attempt => \${attempt}, error => '"x"', retry_at => 'infinity')`, "22023"),
  c("fail", "retry_at -infinity", `SELECT idemq.fail(job_id => \${processing}, attempt => \${attempt}, error => '"x"', retry_at => '-infinity')`, "22023"),
  // heartbeat
  c("heartbeat", "NULL job_ids", "SELECT * FROM idemq.heartbeat(job_ids => NULL, attempts => '{1}')", "22004"),
  c("heartbeat", "NULL attempts", "SELECT * FROM idemq.heartbeat(job_ids => ARRAY[${processing}]::bigint[], attempts => NULL)", "22004"),
  c("heartbeat", "mismatched arrays", "SELECT * FROM idemq.heartbeat(job_ids => ARRAY[${processing}]::bigint[], attempts => '{}')", "22023"),
  c("heartbeat", "lease_tokens of another length", "SELECT * FROM idemq.heartbeat(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease_tokens => ARRAY[gen_random_uuid(), gen_random_uuid()])", "22023"),
  c("heartbeat", "lease 0", "SELECT * FROM idemq.heartbeat(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease => '0 s')", "22023"),
  c("progress", "NULL job_id", "SELECT idemq.progress(job_id => NULL, attempt => 1, value => 10)", "22004"),
  c("progress", "NULL value", "SELECT idemq.progress(job_id => ${processing}, attempt => ${attempt}, value => NULL)", "22004"),
  c("progress", "value 101", "SELECT idemq.progress(job_id => ${processing}, attempt => ${attempt}, value => 101)", "22023"),
  c("progress", "value -1", "SELECT idemq.progress(job_id => ${processing}, attempt => ${attempt}, value => -1)", "22023"),
  c("heartbeat", "lease negative", "SELECT * FROM idemq.heartbeat(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease => '-1 minute')", "22023"),
  c("heartbeat", "NULL lease", "SELECT * FROM idemq.heartbeat(job_ids => ARRAY[${processing}]::bigint[], attempts => ARRAY[${attempt}], lease => NULL)", "22004"),
  // snooze
  c("snooze", "NULL run_at", "SELECT idemq.snooze(job_id => ${processing}, attempt => ${attempt}, run_at => NULL)", "22004"),
  c("snooze", "NULL job_id", "SELECT idemq.snooze(job_id => NULL, attempt => 1, run_at => now())", "22004"),
  c("snooze", "NULL attempt", "SELECT idemq.snooze(job_id => ${processing}, attempt => NULL, run_at => now())", "22004"),
  c("snooze", "no such job", "SELECT idemq.snooze(job_id => 987654321, attempt => 1, run_at => now())", "IQ404"),
  c("snooze", "run_at infinity", "SELECT idemq.snooze(job_id => ${processing}, attempt => ${attempt}, run_at => 'infinity')", "22023"),
  c("snooze", "run_at -infinity", "SELECT idemq.snooze(job_id => ${processing}, attempt => ${attempt}, run_at => '-infinity')", "22023"),
  // hold
  c("hold", "NULL scope", "SELECT idemq.hold(job_id => ${processing}, attempt => ${attempt}, scope => NULL, until => now() + interval '1 minute')", "22004"),
  c("hold", "NULL until", "SELECT idemq.hold(job_id => ${processing}, attempt => ${attempt}, scope => 'queue', until => NULL)", "22004"),
  c("hold", "NULL job_id", "SELECT idemq.hold(job_id => NULL, attempt => 1, scope => 'queue', until => now())", "22004"),
  c("hold", "scope unknown", "SELECT idemq.hold(job_id => ${processing}, attempt => ${attempt}, scope => 'customer', until => now() + interval '1 minute')", "22023"),
  c("hold", "scope key, job without a concurrency_key", "SELECT idemq.hold(job_id => ${processing}, attempt => ${attempt}, scope => 'key', until => now() + interval '1 minute')", "22023"),
  c("hold", "until infinity", "SELECT idemq.hold(job_id => ${processing}, attempt => ${attempt}, scope => 'queue', until => 'infinity')", "22023"),
  c("hold", "until past duration_days", "SELECT idemq.hold(job_id => ${processing}, attempt => ${attempt}, scope => 'queue', until => now() + interval '36501 days')", "22023"),
  c("hold", "no such job", "SELECT idemq.hold(job_id => 987654321, attempt => 1, scope => 'queue', until => now() + interval '1 minute')", "IQ404"),
  // guard
  c("guard", "NULL key", "SELECT idemq.guard(key => NULL)", "22004"),
  c("guard", "empty key", "SELECT idemq.guard(key => '')", "22023"),
  c("guard", "empty task", "SELECT idemq.guard(key => 'k', task => '')", "22023"),
  c("guard", "key over key_bytes", "SELECT idemq.guard(key => repeat('k', 513))", "22023"),
  c("guard", "key over the btree entry size", "SELECT idemq.guard(key => repeat('k', 3000))", "22023"),
  // effects
  c("effect_claim", "NULL key", "SELECT * FROM idemq.effect_claim(key => NULL, owner => 'o')", "22004"),
  c("effect_claim", "empty owner", "SELECT * FROM idemq.effect_claim(key => 'k', owner => '')", "22023"),
  c("effect_claim", "stale_after 0", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', stale_after => '0 s')", "22023"),
  c("effect_claim", "stale_after negative", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', stale_after => '-10 minutes')", "22023"),
  c("effect_claim", "NULL stale_after", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', stale_after => NULL)", "22004"),
  c("effect_claim", "key over key_bytes", "SELECT * FROM idemq.effect_claim(key => repeat('k', 513), owner => 'o')", "22023"),
  c("effect_claim", "owner over key_bytes", "SELECT * FROM idemq.effect_claim(key => 'k', owner => repeat('o', 513))", "22023"),
  c("effect_claim", "lease_token without job_id and attempt", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', lease_token => gen_random_uuid())", "22023"),
  c("effect_claim", "stale_after over duration_days", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', stale_after => '2147483647 days')", "22023"),
  c("effect_done", "NULL key", "SELECT idemq.effect_done(key => NULL, owner => 'o', result => '{}')", "22004"),
  c("effect_done", "empty owner", "SELECT idemq.effect_done(key => 'k', owner => '', result => '{}')", "22023"),
  c("effect_done", "key over key_bytes", "SELECT idemq.effect_done(key => repeat('k', 513), owner => 'o', result => '{}')", "22023"),
  c("effect_release", "NULL owner", "SELECT idemq.effect_release(key => 'k', owner => NULL)", "22004"),
  c("effect_release", "empty key", "SELECT idemq.effect_release(key => '', owner => 'o')", "22023"),
  c("effect_release", "owner over key_bytes", "SELECT idemq.effect_release(key => 'k', owner => repeat('o', 513))", "22023"),
  // operator functions
  c("cancel", "NULL job_id", "SELECT idemq.cancel(job_id => NULL)", "22004"),
  c("cancel", "no such job", "SELECT idemq.cancel(job_id => 987654321)", "IQ404"),
  c("retry", "NULL job_id", "SELECT idemq.retry(job_id => NULL)", "22004"),
  c("retry", "no such job", "SELECT idemq.retry(job_id => 987654321)", "IQ404"),
  c("find_jobs", "NULL filter", "SELECT * FROM idemq.find_jobs(filter => NULL)", "22004"),
  c("find_jobs", "an unknown field", `SELECT * FROM idemq.find_jobs(filter => '{"stat": ["failed"]}')`, "22023"),
  c("find_jobs", "page_size 0", "SELECT * FROM idemq.find_jobs(page_size => 0)", "22023"),
  c("count_jobs", "an unknown action", "SELECT * FROM idemq.count_jobs(action => 'purge')", "22023"),
  c("count_jobs", "a payload without task", `SELECT * FROM idemq.count_jobs(filter => '{"payload": {"zoo": "failed"}}')`, "22023"),
  c("count_jobs", "at_most over 1,000,000", "SELECT * FROM idemq.count_jobs(at_most => 1000001)", "22023"),
  c("retry_jobs", "NULL filter", "SELECT * FROM idemq.retry_jobs(filter => NULL)", "22004"),
  c("retry_jobs", "a state that is none", `SELECT * FROM idemq.retry_jobs(filter => '{"state": ["done"]}')`, "22023"),
  c("cancel_jobs", "max_jobs 0", `SELECT * FROM idemq.cancel_jobs(filter => '{"task": "zoo_task"}', max_jobs => 0)`, "22023"),
  c("cancel_jobs", "ids not ids", `SELECT * FROM idemq.cancel_jobs(filter => '{"ids": [0]}')`, "22023"),
  c("delete_jobs", "NULL max_jobs", `SELECT * FROM idemq.delete_jobs(filter => '{}', max_jobs => NULL)`, "22004"),
  c("delete_jobs", "a time that is none", `SELECT * FROM idemq.delete_jobs(filter => '{"finished_before": "soon"}')`, "22023"),
  c("run_jobs_now", "a task that is not a string", `SELECT * FROM idemq.run_jobs_now(filter => '{"task": 1}')`, "22023"),
  c("run_jobs_now", "filter not an object", `SELECT * FROM idemq.run_jobs_now(filter => '[]')`, "22023"),
  c("reschedule", "NULL job_id", "SELECT idemq.reschedule(job_id => NULL, run_at => now())", "22004"),
  c("reschedule", "NULL run_at", "SELECT idemq.reschedule(job_id => ${failed}, run_at => NULL)", "22004"),
  c("reschedule", "no such job", "SELECT idemq.reschedule(job_id => 987654321, run_at => now())", "IQ404"),
  c("reschedule", "run_at infinity", "SELECT idemq.reschedule(job_id => ${failed}, run_at => 'infinity')", "22023"),
  c("reschedule", "run_at -infinity", "SELECT idemq.reschedule(job_id => ${failed}, run_at => '-infinity')", "22023"),
  c("purge", "NULL older_than", "SELECT idemq.purge(older_than => NULL)", "22004"),
  c("purge", "negative older_than", "SELECT idemq.purge(older_than => '-1 day')", "22023"),
  c("purge", "older_than 2147483647 days", "SELECT idemq.purge(older_than => '2147483647 days')", "22023"),
  c("purge", "NULL states", "SELECT idemq.purge(older_than => '0 s', states => NULL)", "22004"),
  c("purge", "an active state", "SELECT idemq.purge(older_than => '0 s', states => '{failed,enqueued}')", "22023"),
  c("purge", "every active state", "SELECT idemq.purge(older_than => '0 s', states => idemq.active_states())", "22023"),
  c("purge", "a NULL state", "SELECT idemq.purge(older_than => '0 s', states => ARRAY['failed', NULL]::idemq.job_state[])", "22023"),
  c("purge", "an unknown state via a cast", "SELECT idemq.purge(older_than => '0 s', states => '{finished}'::idemq.job_state[])", "22P02", {
    noHint: true,
  }),
  c("purge", "batch_size 0", "SELECT idemq.purge(older_than => '0 s', batch_size => 0)", "22023"),
  c("purge", "batch_size over 10000", "SELECT idemq.purge(older_than => '0 s', batch_size => 10001)", "22023"),
  c("apply_retention", "NULL batch_size", "SELECT idemq.apply_retention(batch_size => NULL)", "22004"),
  c("apply_retention", "batch_size 0", "SELECT idemq.apply_retention(batch_size => 0)", "22023"),
  c("apply_retention", "negative batch_size", "SELECT idemq.apply_retention(batch_size => -1)", "22023"),
  c("apply_retention", "batch_size over 10000", "SELECT idemq.apply_retention(batch_size => 10001)", "22023"),
  c("worker_seen", "NULL worker_id", "SELECT idemq.worker_seen(worker_id => NULL)", "22004"),
  c("worker_seen", "empty worker_id", "SELECT idemq.worker_seen(worker_id => '')", "22023"),
  c("worker_seen", "an empty queue list", "SELECT idemq.worker_seen(worker_id => 'w', queues => '{}')", "22023"),
  c("worker_seen", "an empty task name", "SELECT idemq.worker_seen(worker_id => 'w', tasks => '{\"\"}')", "22023"),
  c("worker_seen", "an empty host", "SELECT idemq.worker_seen(worker_id => 'w', host => '')", "22023"),
  c("worker_seen", "a pid of 0", "SELECT idemq.worker_seen(worker_id => 'w', pid => 0)", "22023"),
  c("worker_seen", "a refresh_every of 0", "SELECT idemq.worker_seen(worker_id => 'w', refresh_every => '0 seconds')", "22023"),
  c("worker_seen", "negative outages", "SELECT idemq.worker_seen(worker_id => 'w', outages => -1)", "22023"),
  c("worker_stopped", "NULL worker_id", "SELECT idemq.worker_stopped(worker_id => NULL)", "22004"),
  c("unserved_jobs", "NULL seen_within", "SELECT * FROM idemq.unserved_jobs(seen_within => NULL)", "22004"),
  c("unserved_jobs", "zero seen_within", "SELECT * FROM idemq.unserved_jobs(seen_within => '0')", "22023"),
  c("overview", "NULL recent", "SELECT * FROM idemq.overview(recent => NULL)", "22004"),
  c("overview", "NULL exact_up_to", "SELECT * FROM idemq.overview(exact_up_to => NULL)", "22004"),
  c("overview", "zero recent", "SELECT * FROM idemq.overview(recent => '0')", "22023"),
  c("overview", "recent over duration_days", "SELECT * FROM idemq.overview(recent => '36501 days')", "22023"),
  c("overview", "a negative exact_up_to", "SELECT * FROM idemq.overview(exact_up_to => -1)", "22023"),
  c("overview", "exact_up_to over 10,000,000", "SELECT * FROM idemq.overview(exact_up_to => 10000001)", "22023"),
  c("history", "NULL since", "SELECT * FROM idemq.history(since => NULL)", "22004"),
  c("history", "zero since", "SELECT * FROM idemq.history(since => '0')", "22023"),
  c("history", "since over the day kept", "SELECT * FROM idemq.history(since => '1 day 1 second')", "22023"),
  c("set_retention", "NULL state", "SELECT idemq.set_retention(state => NULL, keep => '1 day')", "22004"),
  c("set_retention", "NULL keep for a default", "SELECT idemq.set_retention(state => 'failed', keep => NULL)", "22004"),
  c("set_retention", "negative keep", "SELECT idemq.set_retention(state => 'failed', keep => '-1 day')", "22023"),
  c("set_retention", "keep over duration_days", "SELECT idemq.set_retention(state => 'failed', keep => '36501 days')", "22023"),
  c("set_retention", "an active state", "SELECT idemq.set_retention(state => 'processing', keep => '1 day', queue => 'q')", "22023"),
  c("set_retention", "a queue and a task", "SELECT idemq.set_retention(state => 'failed', keep => '1 day', queue => 'q', task => 't')", "22023"),
  c("set_retention", "empty queue", "SELECT idemq.set_retention(state => 'failed', keep => '1 day', queue => '')", "22023"),
  c("set_retention", "an unknown state via a cast", "SELECT idemq.set_retention(state => 'finished'::idemq.job_state, keep => '1 day')", "22P02", {
    noHint: true,
  }),
  c("prune_keys", "NULL older_than", "SELECT idemq.prune_keys(older_than => NULL)", "22004"),
  c("prune_keys", "negative older_than", "SELECT idemq.prune_keys(older_than => '-14 days')", "22023"),
  c("prune_keys", "older_than 2147483647 days", "SELECT idemq.prune_keys(older_than => '2147483647 days')", "22023"),
  // retry_horizon
  c("retry_horizon", "NULL counted_attempts", "SELECT idemq.retry_horizon(backoff => NULL, counted_attempts => NULL, max_attempts => 3)", "22004"),
  c("retry_horizon", "NULL max_attempts", "SELECT idemq.retry_horizon(backoff => NULL, counted_attempts => 1, max_attempts => NULL)", "22004"),
  c("retry_horizon", "backoff of an unknown kind", `SELECT idemq.retry_horizon(backoff => '{"kind": "linear"}', counted_attempts => 1, max_attempts => 3)`, "22023"),
  // schedules (more in test/sql/schedules.test.ts)
  c("schedule", "NULL name", "SELECT idemq.schedule(name => NULL, cron => '* * * * *', task => 't')", "22004"),
  c("schedule", "empty task", "SELECT idemq.schedule(name => 'n', cron => '* * * * *', task => '')", "22023"),
  c("schedule", "hour out of range", "SELECT idemq.schedule(name => 'n', cron => '0 25 * * *', task => 't')", "22023"),
  c("schedule", "unknown time zone", "SELECT idemq.schedule(name => 'n', cron => '* * * * *', task => 't', timezone => 'Mars/Olympus')", "22023"),
  c("schedule", "misfire_grace 0", "SELECT idemq.schedule(name => 'n', cron => '* * * * *', task => 't', misfire_grace => '0 seconds')", "22023"),
  c("schedule", "unknown overlap policy", "SELECT idemq.schedule(name => 'n', cron => '* * * * *', task => 't', overlap => 'never')", "22P02", {
    noHint: true,
  }),
  c("unschedule", "NULL name", "SELECT idemq.unschedule(name => NULL)", "22004"),
  c("schedule_next", "NULL cron", "SELECT * FROM idemq.schedule_next(cron => NULL)", "22004"),
  c("schedule_next", "six fields with a bad second", "SELECT * FROM idemq.schedule_next(cron => '61 * * * * *')", "22023"),
  c("schedule_next", "count 0", "SELECT * FROM idemq.schedule_next(cron => '* * * * *', count => 0)", "22023"),
  // flow control (more in test/sql/flow-control.test.ts)
  c("set_limit", "neither queue nor task", "SELECT idemq.set_limit(concurrency => 1)", "22023"),
  c("set_limit", "both queue and task", "SELECT idemq.set_limit(queue => 'q', task => 't', concurrency => 1)", "22023"),
  c("set_limit", "concurrency 0", "SELECT idemq.set_limit(queue => 'q', concurrency => 0)", "22023"),
  c("set_limit", "rate without per", "SELECT idemq.set_limit(queue => 'q', rate => 10)", "22023"),
  c("set_limit", "per under a second", "SELECT idemq.set_limit(task => 't', rate => 10, per => '500 milliseconds')", "22023"),
  c("clear_limit", "neither queue nor task", "SELECT idemq.clear_limit()", "22023"),
  c("declare_limit", "no task", "SELECT * FROM idemq.declare_limit(task => NULL, concurrency => 1)", "22023"),
  c("declare_limit", "no limit", "SELECT * FROM idemq.declare_limit(task => 't')", "22023"),
  // job_result, children, spawn, wait_for_children, enqueue_batch
  c("job_result", "NULL job_id", "SELECT * FROM idemq.job_result(job_id => NULL)", "22004"),
  c("job_result", "NULL notify", "SELECT * FROM idemq.job_result(job_id => ${processing}, notify => NULL)", "22004"),
  c("children", "NULL job_id", "SELECT * FROM idemq.children(job_id => NULL)", "22004"),
  c("spawn", "NULL children", "SELECT * FROM idemq.spawn(job_id => ${processing}, attempt => ${attempt}, children => NULL)", "22004"),
  c("spawn", "NULL job_id", `SELECT * FROM idemq.spawn(job_id => NULL, attempt => 1, children => '[]')`, "22004"),
  c("spawn", "NULL fail_fast", `SELECT * FROM idemq.spawn(job_id => \${processing}, attempt => \${attempt}, children => '[]', fail_fast => NULL)`, "22004"),
  c("spawn", "children an object", `SELECT * FROM idemq.spawn(job_id => \${processing}, attempt => \${attempt}, children => '{"name": "a"}')`, "22023"),
  c("spawn", "a child without a name", `SELECT * FROM idemq.spawn(job_id => \${processing}, attempt => \${attempt}, children => '[{"task": "t"}]')`, "22023"),
  c("spawn", "two children of one name", `SELECT * FROM idemq.spawn(job_id => \${processing}, attempt => \${attempt}, children => '[{"name": "a", "task": "t"}, {"name": "a", "task": "t"}]')`, "22023"),
  c("spawn", "a child enqueue_many refuses", `SELECT * FROM idemq.spawn(job_id => \${processing}, attempt => \${attempt}, children => '[{"name": "a", "task": ""}]')`, "22023"),
  c("spawn", "a job it does not hold", `SELECT * FROM idemq.spawn(job_id => \${failed}, attempt => 1, children => '[{"name": "a", "task": "t"}]')`, "IQ410"),
  c("spawn", "no such job", `SELECT * FROM idemq.spawn(job_id => 987654321, attempt => 1, children => '[{"name": "a", "task": "t"}]')`, "IQ404"),
  c("wait_for_children", "NULL job_id", "SELECT idemq.wait_for_children(job_id => NULL, attempt => 1)", "22004"),
  c("wait_for_children", "NULL attempt", "SELECT idemq.wait_for_children(job_id => ${processing}, attempt => NULL)", "22004"),
  c("wait_for_children", "no such job", "SELECT idemq.wait_for_children(job_id => 987654321, attempt => 1)", "IQ404"),
  c("enqueue_batch", "NULL jobs", `SELECT * FROM idemq.enqueue_batch(jobs => NULL, callback => '{"task": "t"}')`, "22004"),
  c("enqueue_batch", "NULL callback", `SELECT * FROM idemq.enqueue_batch(jobs => '[]', callback => NULL)`, "22004"),
  c("enqueue_batch", "callback an array", `SELECT * FROM idemq.enqueue_batch(jobs => '[]', callback => '[{"task": "t"}]')`, "22023"),
  c("enqueue_batch", "callback without a task", `SELECT * FROM idemq.enqueue_batch(jobs => '[]', callback => '{"payload": {}}')`, "22023"),
  c("enqueue_batch", "a bad job", `SELECT * FROM idemq.enqueue_batch(jobs => '[{"task": ""}]', callback => '{"task": "t"}')`, "22023"),
  c("declare_limit", "rate without per", "SELECT * FROM idemq.declare_limit(task => 't', rate => 10)", "22023"),
  c("declare_limit", "concurrency 0", "SELECT * FROM idemq.declare_limit(task => 't', concurrency => 0)", "22023"),
  c("declare_limit", "per under a second", "SELECT * FROM idemq.declare_limit(task => 't', rate => 10, per => '500 milliseconds')", "22023"),
  c("pause", "empty queue name", "SELECT idemq.pause(queue => '')", "22023"),
  c("resume", "both queue and task", "SELECT idemq.resume(queue => 'q', task => 't')", "22023"),
  // durable steps (more in test/sql/steps.test.ts)
  c("step_record", "NULL name", "SELECT idemq.step_record(job_id => ${processing}, attempt => ${attempt}, name => NULL)", "22004"),
  c("step_record", "empty name", "SELECT idemq.step_record(job_id => ${processing}, attempt => ${attempt}, name => '')", "22023"),
  c("step_record", "name over key_bytes", "SELECT idemq.step_record(job_id => ${processing}, attempt => ${attempt}, name => repeat('n', 513))", "22023"),
  c("step_record", "result over the limit", "SELECT idemq.step_record(job_id => ${processing}, attempt => ${attempt}, name => 's', result => to_jsonb(repeat('x', 1048576)))", "22023"),
  c("step_record", "NULL job_id", "SELECT idemq.step_record(job_id => NULL, attempt => 1, name => 's')", "22004"),
  c("steps", "NULL job_id", "SELECT * FROM idemq.steps(job_id => NULL)", "22004"),
  c("sleep", "NULL wake_at", "SELECT * FROM idemq.sleep(job_id => ${processing}, attempt => ${attempt}, name => 's', wake_at => NULL)", "22004"),
  c("sleep", "wake_at infinity", "SELECT * FROM idemq.sleep(job_id => ${processing}, attempt => ${attempt}, name => 's', wake_at => 'infinity')", "22023"),
  c("sleep", "empty name", "SELECT * FROM idemq.sleep(job_id => ${processing}, attempt => ${attempt}, name => '', wake_at => now())", "22023"),
  c("await_event", "NULL event", "SELECT * FROM idemq.await_event(job_id => ${processing}, attempt => ${attempt}, name => 'w', event => NULL, key => NULL, timeout => '1 hour')", "22004"),
  c("await_event", "empty key", "SELECT * FROM idemq.await_event(job_id => ${processing}, attempt => ${attempt}, name => 'w', event => 'e', key => '', timeout => '1 hour')", "22023"),
  c("await_event", "NULL timeout", "SELECT * FROM idemq.await_event(job_id => ${processing}, attempt => ${attempt}, name => 'w', event => 'e', key => NULL, timeout => NULL)", "22004"),
  c("await_event", "timeout 0", "SELECT * FROM idemq.await_event(job_id => ${processing}, attempt => ${attempt}, name => 'w', event => 'e', key => NULL, timeout => '0')", "22023"),
  c("await_event", "timeout over duration_days", "SELECT * FROM idemq.await_event(job_id => ${processing}, attempt => ${attempt}, name => 'w', event => 'e', key => NULL, timeout => '1000000 days')", "22023"),
  c("emit", "NULL event", "SELECT idemq.emit(event => NULL)", "22004"),
  c("emit", "empty event", "SELECT idemq.emit(event => '')", "22023"),
  c("emit", "empty key", "SELECT idemq.emit(event => 'e', key => '')", "22023"),
  c("emit", "NULL payload", "SELECT idemq.emit(event => 'e', payload => NULL)", "22004"),
  c("emit", "payload over the limit", "SELECT idemq.emit(event => 'e', payload => to_jsonb(repeat('x', 1048576)))", "22023"),
];

const TABLES = ["jobs", "keys", "processed", "effects", "counters", "job_dependencies", "job_children", "child_waits", "schedules", "workers", "limits", "limit_slots", "limit_releases", "limit_starts", "key_holds", "job_steps", "events"];

async function rowCounts(client: pg.ClientBase): Promise<Record<string, number>> {
  const { rows } = await client.query<{ counts: Record<string, number> }>(
    `SELECT jsonb_build_object(${TABLES.map((t) => `'${t}', (SELECT count(*) FROM idemq.${t})`).join(", ")}) AS counts`,
  );
  return rows[0]!.counts;
}

function fill(sql: string, zoo: Zoo): string {
  return sql
    .replaceAll("${processing}", zoo.processing.id)
    .replaceAll("${attempt}", String(zoo.processing.attempt))
    .replaceAll("${failed}", zoo.failed.id);
}

describe("bad input", () => {
  it.each(CASES.map((k) => [`${k.fn}: ${k.what} -> ${k.code}`, k] as const))("%s, nothing written", async (_name, k) => {
    await inRollback(db.pool, async (client) => {
      const zoo = await buildZoo(client);
      // Seed the other tables too, so "nothing written" covers them.
      await client.query("SELECT idemq.guard(key => 'seed', task => 'seed'), idemq.guard(key => 'seed', task => 'seed')");
      await client.query("SELECT * FROM idemq.effect_claim(key => 'seed', owner => 'seed')");
      const before = await rowCounts(client);
      const error = await expectSqlError(
        underSavepoint(client, () => client.query(fill(k.sql, zoo), [])),
        { code: k.code },
      );
      expect(k.code.startsWith("22") || /^IQ4\d\d$/.test(k.code), "class 22 or IQ4xx").toBe(true);
      if (!k.noHint) expect(error.hint ?? "", `HINT of: ${error.message}`).not.toBe("");
      expect(await rowCounts(client)).toEqual(before);
    });
  });

  it("every public function that takes arguments has bad-input cases here", async () => {
    const { rows } = await db.pool.query<{ name: string; nargs: number }>(
      `SELECT p.proname AS name, p.pronargs AS nargs FROM pg_proc p
        WHERE p.pronamespace = 'idemq'::regnamespace AND p.proname NOT LIKE '\\_%'`,
    );
    const withArgs = rows.filter((r) => r.nargs > 0).map((r) => r.name).sort();
    expect([...new Set(CASES.map((k) => k.fn))].sort()).toEqual(withArgs);
    expect(rows.filter((r) => r.nargs === 0).map((r) => r.name).sort()).toEqual([
      "active_states",
      "held_keys",
      "limits",
      "rescue",
      "roll_up",
      "schedules",
      "schema_version",
      "stats",
      "terminal_states",
      "tick",
      "workers",
    ]);
  });

  it("an error names the bad element of enqueue_many as jobs[N] and says nothing was enqueued", async () => {
    await inRollback(db.pool, async (client) => {
      await expectSqlError(
        underSavepoint(client, () => client.query(`${M}(jobs => '[{"task": "ok"}, {"task": "ok"}, {"task": ""}]')`, [])),
        {
          code: "22023",
          message: /jobs\[3\]/,
          hint: /nothing was enqueued/,
        },
      );
    });
  });
});

describe("no STRICT functions", () => {
  it("no function in schema idemq is STRICT", async () => {
    const { rows } = await db.pool.query<{ name: string; strict: boolean }>(
      "SELECT p.proname AS name, p.proisstrict AS strict FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace ORDER BY 1",
    );
    expect(rows.length).toBeGreaterThan(20);
    expect(rows.filter((r) => r.strict).map((r) => r.name)).toEqual([]);
  });
});
