-- Migration 0002_release_0_2_0: the upgrade from 0.1.0 to 0.2.0 (its changes: CHANGELOG.md, "0.2.0").
-- Written by `npm run migration:new`; the function texts below are copies of
-- sql/functions/ from CREATE on (npm run migration:check compares them). Until
-- it is released (listed in sql/released.sha256), migration:new amends it;
-- after that it never changes again. Forward-only: no Down section (the way
-- back from an upgrade is the backup taken before it).
-- Up Migration

-- ==== hand-written: schema changes (kept when migration:new amends this file) ====
-- Each installation's own roles: the cluster-wide idemq_producer, idemq_worker
-- and idemq_admin of 0.1.0 gave a login made a member for one database the
-- same rights in every database of the server with idemq. _grant_roles()
-- (called after the functions) fills this row once, creates the roles and
-- moves the rights to them.
CREATE TABLE idemq.installation (
  one_row boolean PRIMARY KEY DEFAULT true CONSTRAINT installation_one_row CHECK (one_row),
  producer_role name NOT NULL,
  worker_role name NOT NULL,
  admin_role name NOT NULL,
  shared_members_pending boolean NOT NULL,
  -- The read-only operator (the dashboard's viewer): no 0.1.0 counterpart.
  viewer_role name NOT NULL,
  CONSTRAINT installation_roles_distinct CHECK (producer_role <> worker_role AND worker_role <> admin_role AND producer_role <> admin_role
                                                     AND viewer_role <> producer_role AND viewer_role <> worker_role AND viewer_role <> admin_role),
  CONSTRAINT installation_roles_not_shared CHECK (NOT (ARRAY[producer_role, worker_role, admin_role, viewer_role]::text[]
                                                       && ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin']))
);
COMMENT ON TABLE idemq.installation IS
  'This installation''s role names, chosen once at install (_grant_roles); shared_members_pending: upgraded from 0.1.0, the cluster-wide roles'' members not yet moved to these roles.';

-- Why a job that is not running waits (job()'s and stats()'s waiting_for):
-- awaiting ('parents', 'concurrency_key', 'children') or runnable and held back by its
-- queue or task ('paused', 'held', 'concurrency', 'rate', in precedence order).
CREATE TYPE idemq.waiting_reason AS ENUM ('parents', 'concurrency_key', 'children', 'paused', 'held', 'concurrency', 'rate');

-- What idemq.job() returns: a type, not RETURNS TABLE, because a TABLE column
-- may not share its name with the parameter job_id.
CREATE TYPE idemq.job_row AS (
  job_id bigint,
  task text,
  queue text,
  payload jsonb,
  state idemq.job_state,
  priority integer,
  run_at timestamptz,
  attempt integer,
  uncounted integer,
  max_attempts integer,
  idempotency_key text,
  locked_by text,
  locked_at timestamptz,
  lease_expires_at timestamptz,
  errors jsonb,
  result jsonb,
  created_at timestamptz,
  finished_at timestamptz,
  expires_at timestamptz,
  concurrency_key text,
  waiting_for idemq.waiting_reason,
  -- The attempt's progress (0..100) as its handler last reported it (progress()).
  progress smallint
);

-- The lease token: a random value claim(..., token => true) sets on each job
-- it hands out and returns with it, which complete, complete_many, fail,
-- heartbeat, snooze and effect_claim's job binding then require besides the
-- attempt, so a member of the worker role cannot finish a job another worker
-- holds by guessing its attempt number. NULL on a job claimed without it (as
-- 0.1.0's workers and claims made before this migration do): a NULL token
-- matches only those, so 0.1.0 workers keep working through an upgrade.
-- (The column idemq.jobs.lease_token is added after the functions: its ALTER
-- TABLE locks the jobs until this migration commits, so it comes last.)
-- A job's id is job_id in every row a function returns. claim's rows named it
-- id in 0.1.0, and a 0.1.0 worker reads that name while an upgrade runs: id
-- stays where it is (deprecated, the same value) and job_id is appended, as
-- a release appends columns (docs/design.md, "Migrations and releases").
ALTER TYPE idemq.claimed_job ADD ATTRIBUTE lease_token uuid, ADD ATTRIBUTE job_id bigint;
-- A job's time limit (enqueue(..., timeout)), handed to its worker by claim().
ALTER TYPE idemq.claimed_job ADD ATTRIBUTE timeout interval;
-- A job's concurrency key (enqueue(..., concurrency_key)), so a worker knows
-- which completions can hand it a key's next job (complete_and_take_next).
ALTER TYPE idemq.claimed_job ADD ATTRIBUTE concurrency_key text;

-- Job counts per (queue, task, state), for stats() and overview(): rows the
-- trigger function _count_jobs appends (its triggers come after the
-- functions, below), summed by _job_counts(), folded by apply_retention().
CREATE TABLE idemq.job_counts (
    queue text NOT NULL,
    task text NOT NULL,
    state idemq.job_state NOT NULL,
    n bigint NOT NULL,
    -- When the statement that appended the row began (its transaction's
    -- now()); NULL on the rows apply_retention's fold writes. The fold
    -- carries the stamped rows' counts into their minute of
    -- idemq.job_minutes (the dashboard's history) as it deletes them.
    at timestamp with time zone DEFAULT now()
);

COMMENT ON TABLE idemq.job_counts IS 'Jobs per (queue, task, state): the sum of n per group. Appended by the triggers jobs_count_* on idemq.jobs in the writer''s transaction, folded by apply_retention(); never written otherwise.';

-- Why tick() could not enqueue a schedule's job (a limit lowered after
-- schedule() accepted it): _tick records it and goes on with the others.
ALTER TABLE idemq.schedules
    ADD COLUMN last_error text,
    ADD COLUMN last_error_at timestamp with time zone,
    ADD CONSTRAINT schedules_error_has_time CHECK (((last_error IS NULL) = (last_error_at IS NULL)));
-- Flow control (issue 26; docs/design.md, "Flow control"): one row per queue
-- or task with a limit or a pause, its concurrency as slot rows, its rate as
-- a ring of start rows. Written by set_limit, clear_limit, pause and resume;
-- claim() takes slots and starts in its own transaction, and the trigger
-- function _count_jobs frees a slot when its job leaves processing.
CREATE TABLE idemq.limits (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL,
    name text NOT NULL,
    concurrency integer,
    rate integer,
    per interval,
    per_key integer,
    paused boolean DEFAULT false NOT NULL,
    held_until timestamp with time zone,
    slot_rows integer DEFAULT 0 NOT NULL,
    first_slot integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT limits_scope UNIQUE (kind, name),
    CONSTRAINT limits_kind CHECK ((kind = ANY (ARRAY['queue'::text, 'task'::text]))),
    CONSTRAINT limits_concurrency_range CHECK (((concurrency >= 1) AND (concurrency <= 10000))),
    CONSTRAINT limits_rate_range CHECK (((rate >= 1) AND (rate <= 100000))),
    CONSTRAINT limits_per_at_least_a_second CHECK ((per >= '00:00:01'::interval)),
    CONSTRAINT limits_rate_has_per CHECK (((rate IS NULL) = (per IS NULL))),
    CONSTRAINT limits_per_key_range CHECK (((per_key >= 1) AND (per_key <= 10000))),
    CONSTRAINT limits_slot_rows CHECK (((slot_rows >= 0) AND ((concurrency IS NOT NULL) OR (slot_rows = 0)))),
    CONSTRAINT limits_not_empty CHECK ((paused OR (held_until IS NOT NULL) OR (concurrency IS NOT NULL) OR (rate IS NOT NULL) OR (per_key IS NOT NULL)))
);

COMMENT ON TABLE idemq.limits IS 'Flow control per queue or task: concurrency, rate per period, per_key, paused; held_until: no claim before it (hold(), a 429''s Retry-After); slot_rows is how many slots the scope has (the sum of its stripes'' sizes in idemq.limit_slots: over concurrency while a lowered limit drains), first_slot the number of its first stripe (a job naming an older one was running when the limit was set). Written by set_limit, clear_limit, pause, resume, hold, and by claims while a lowered limit drains.';

-- A concurrency limit of N: its slots in at most 8 rows (stripes), whose
-- sizes sum to N (limits.slot_rows; more while a lowered limit drains). A
-- stripe's held is how many of its slots claims took, less the releases
-- folded into it: claim() locks a stripe with room FOR UPDATE SKIP LOCKED,
-- folds the stripe's committed releases (idemq.limit_releases) and adds the
-- jobs it takes; the jobs trigger appends a release row when a job leaves
-- processing, taking no lock. A claim so writes one row per stripe it uses,
-- not one per job, and a completion never waits for a claim. Room is judged
-- on the locked row's newest version and the releases committed before the
-- fold: never more than its size. Stripe numbers come from
-- idemq.limit_slot_numbers, so a number names one stripe for good (a job's
-- queue_slot or task_slot from an earlier limit of the scope names none of
-- today's).
CREATE TABLE idemq.limit_slots (
    limit_id bigint NOT NULL,
    slot integer NOT NULL,
    size integer NOT NULL,
    held integer DEFAULT 0 NOT NULL,
    CONSTRAINT limit_slots_pkey PRIMARY KEY (limit_id, slot),
    CONSTRAINT limit_slots_size_not_negative CHECK ((size >= 0)),
    CONSTRAINT limit_slots_held_not_negative CHECK ((held >= 0))
) WITH (fillfactor = 50);

COMMENT ON TABLE idemq.limit_slots IS 'The stripes of each concurrency limit: size slots each, held of them taken by claims (less the releases folded in); at most 8 per limit.';

CREATE SEQUENCE idemq.limit_slot_numbers AS integer;

-- A job's attempt that left processing gives its slot back here: one row
-- per (stripe, statement), n the jobs it released; folded into the stripe
-- (deleted, held less n) by the next claim that locks it, by set_limit and
-- by apply_retention's repair. Appended, so releases never wait for each
-- other or for a claim.
CREATE TABLE idemq.limit_releases (
    limit_id bigint NOT NULL,
    slot integer NOT NULL,
    n integer NOT NULL,
    CONSTRAINT limit_releases_n_positive CHECK ((n > 0))
);

CREATE INDEX limit_releases_by_slot ON idemq.limit_releases USING btree (limit_id, slot);

COMMENT ON TABLE idemq.limit_releases IS 'Slots given back by attempts that left processing, not yet folded into their stripe (idemq.limit_slots).';

-- A rate limit of `rate` per `per`: `rate` rows, each the time of the start
-- that used it last; a start takes a row whose time is more than `per` ago
-- (the row's own per) and sets it to the claim's now().
CREATE TABLE idemq.limit_starts (
    limit_id bigint NOT NULL,
    n integer NOT NULL,
    per interval NOT NULL,
    started_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    CONSTRAINT limit_starts_pkey PRIMARY KEY (limit_id, n)
) WITH (fillfactor = 50);

COMMENT ON TABLE idemq.limit_starts IS 'The ring of each rate limit: rate rows, each the start time that used it last; a start needs a row older than per.';

-- A concurrency key held back (hold(..., scope => 'key'): a 429's
-- Retry-After for one customer's API key): no job of the key runs before
-- held_until. Read by the jobs trigger (_count_jobs) on each keyed job it
-- sees written runnable; a row whose hold has passed is deleted by the next
-- hold (held_until's index keeps the trigger's probe cheap meanwhile).
CREATE TABLE idemq.key_holds (
    concurrency_key text PRIMARY KEY,
    held_until timestamp with time zone NOT NULL,
    CONSTRAINT key_holds_key_not_empty CHECK ((concurrency_key <> ''::text)),
    CONSTRAINT key_holds_finite CHECK ((held_until < 'infinity'::timestamp with time zone))
);

COMMENT ON TABLE idemq.key_holds IS 'Concurrency keys held back by hold(..., scope => ''key''): no job of the key runs before held_until (the jobs trigger _count_jobs moves a keyed job written runnable to it). Written by hold only.';
CREATE INDEX key_holds_held_until ON idemq.key_holds USING btree (held_until);
-- Concurrency keys (issue 26; docs/design.md, "Concurrency keys"): enqueue's
-- new last field. The column idemq.jobs.concurrency_key and its indexes are
-- added after the functions (the ALTER TABLE locks the jobs).
ALTER TYPE idemq._planned_job ADD ATTRIBUTE concurrency_key text;
-- A job's time limit (enqueue(..., timeout)), carried through the enqueue
-- pipeline like enqueue()'s other fields; its column comes after the functions.
ALTER TYPE idemq._planned_job ADD ATTRIBUTE timeout interval;
-- The dashboard's history (issue 27; roll_up, history): one row per minute,
-- queue and task, kept a day. Written by roll_up() on the workers'
-- maintenance timer from the jobs finished since its last call (never a
-- write per job): attempts started and retried, jobs succeeded and failed,
-- run and wait times as counts per fixed bucket (_duration_buckets), and
-- the waiting jobs and the oldest one's age sampled when it ran.
CREATE TABLE idemq.job_minutes (
    minute timestamp with time zone NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    started bigint DEFAULT 0 NOT NULL,
    succeeded bigint DEFAULT 0 NOT NULL,
    failed bigint DEFAULT 0 NOT NULL,
    retried bigint DEFAULT 0 NOT NULL,
    run_buckets jsonb DEFAULT '{}'::jsonb NOT NULL,
    wait_buckets jsonb DEFAULT '{}'::jsonb NOT NULL,
    waiting bigint,
    oldest_waiting_seconds bigint,
    CONSTRAINT job_minutes_pkey PRIMARY KEY (minute, queue, task)
);

COMMENT ON TABLE idemq.job_minutes IS 'Per minute, queue and task, for a day: attempts started and retried, jobs succeeded and failed, run and wait time buckets, waiting jobs and oldest age sampled (roll_up).';

-- Where roll_up() got to; its one row, locked FOR UPDATE SKIP LOCKED, also
-- makes concurrent callers take turns (the one that finds it locked returns).
CREATE TABLE idemq.job_minutes_mark (
    one_row boolean PRIMARY KEY DEFAULT true CONSTRAINT job_minutes_mark_one_row CHECK (one_row),
    rolled_at timestamp with time zone NOT NULL
);

COMMENT ON TABLE idemq.job_minutes_mark IS 'When roll_up() last ran (its one row is also its lock).';
-- Presence: where a worker runs, its concurrency, its refresh interval and
-- the outages it lived through (worker_seen sets them; workers() and the
-- dashboard's workers page read them). A small table: the rewrite-free ADD
-- COLUMNs (defaults are constants) take its lock for a moment.
ALTER TABLE idemq.workers
    ADD COLUMN host text,
    ADD COLUMN pid integer,
    ADD COLUMN concurrency integer,
    ADD COLUMN refresh_every interval,
    ADD COLUMN outages integer DEFAULT 0 NOT NULL,
    ADD COLUMN outage_ms bigint DEFAULT 0 NOT NULL,
    ADD COLUMN last_outage_at timestamp with time zone,
    ADD CONSTRAINT workers_pid_positive CHECK ((pid > 0)),
    ADD CONSTRAINT workers_concurrency_positive CHECK ((concurrency > 0)),
    ADD CONSTRAINT workers_refresh_every_positive CHECK ((refresh_every > '00:00:00'::interval)),
    ADD CONSTRAINT workers_outages_not_negative CHECK (((outages >= 0) AND (outage_ms >= 0)));
-- A clean stop keeps the worker's row, stopped, for stopped_worker_seconds
-- (worker_stopped; apply_retention deletes it then): the dashboard lists
-- recently stopped workers.
ALTER TABLE idemq.workers ADD COLUMN stopped_at timestamp with time zone;
INSERT INTO idemq.settings (name, value, min_value, max_value, description) VALUES
  ('stopped_worker_seconds', 3600, 60, 3153600000, 'how long the row of a cleanly stopped worker is kept in idemq.workers, in seconds (default an hour)');
-- Durable steps (issue 28; docs/design.md, "Durable steps"): a job's ledger
-- of completed steps, sleeps and event waits, one row per (job, step name).
-- Written by the attempt that holds the job (step_record, sleep,
-- await_event, fenced like complete()) and by emit(); read by steps().
-- Deleted with its job by the foreign key (retention, purge, delete_jobs,
-- a completion with retention 0): a TRUNCATE of idemq.jobs needs CASCADE.
CREATE TABLE idemq.job_steps (
    job_id bigint NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    status text NOT NULL,
    result jsonb,
    attempt integer NOT NULL,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    wake_at timestamp with time zone,
    event text,
    event_key text,
    event_id bigint,
    CONSTRAINT job_steps_pkey PRIMARY KEY (job_id, name),
    CONSTRAINT job_steps_job_id_fkey FOREIGN KEY (job_id) REFERENCES idemq.jobs(id) ON DELETE CASCADE,
    CONSTRAINT job_steps_kind_known CHECK ((kind = ANY (ARRAY['step'::text, 'sleep'::text, 'wait'::text]))),
    CONSTRAINT job_steps_status_of_kind CHECK ((((kind = 'step'::text) AND (status = 'done'::text)) OR ((kind = 'sleep'::text) AND (status = 'sleeping'::text) AND (wake_at IS NOT NULL)) OR ((kind = 'wait'::text) AND (status = ANY (ARRAY['waiting'::text, 'received'::text, 'timed_out'::text])) AND (wake_at IS NOT NULL) AND (event IS NOT NULL)))),
    CONSTRAINT job_steps_name_not_empty CHECK ((name <> ''::text))
);
COMMENT ON TABLE idemq.job_steps IS 'Each job''s recorded steps, sleeps and event waits (step_record, sleep, await_event, emit); deleted with the job.';
-- emit(): the waits an event answers.
CREATE INDEX job_steps_waiting ON idemq.job_steps USING btree (event, (COALESCE(event_key, ''::text))) WHERE (status = 'waiting'::text);

-- Events emitted (emit), kept event_retention_seconds for waits reached
-- after their emit (await_event's matching rule); apply_retention deletes
-- older ones (_prune_events).
CREATE TABLE idemq.events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event text NOT NULL,
    key text,
    payload jsonb NOT NULL,
    emitted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT events_event_not_empty CHECK ((event <> ''::text)),
    CONSTRAINT events_key_not_empty CHECK ((key <> ''::text))
);
COMMENT ON TABLE idemq.events IS 'Events emitted (emit), kept event_retention_seconds for waits reached later (await_event); deleted by apply_retention.';
-- await_event(): the first event of a pair after a given one.
CREATE INDEX events_by_pair ON idemq.events USING btree (event, (COALESCE(key, ''::text)), id);
-- _prune_events(): the oldest first.
CREATE INDEX events_by_time ON idemq.events USING btree (emitted_at);
-- Fan-out and fan-in (issue 28; docs/design.md, "Children and batches"):
-- a parent's children by name, with each child's outcome copied when it
-- finishes, and per parent the count of children still running.
CREATE TABLE idemq.job_children (
    parent_id bigint NOT NULL,
    name text NOT NULL,
    child_id bigint NOT NULL,
    state idemq.job_state,
    result jsonb,
    last_error jsonb,
    finished_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT job_children_pkey PRIMARY KEY (parent_id, name),
    CONSTRAINT job_children_name_not_empty CHECK ((name <> ''::text)),
    CONSTRAINT job_children_name_length CHECK ((length(name) <= 200)),
    CONSTRAINT job_children_finished_consistent CHECK (((state IS NULL) = (finished_at IS NULL))),
    CONSTRAINT job_children_state_terminal CHECK ((state = ANY (ARRAY['succeeded'::idemq.job_state, 'failed'::idemq.job_state, 'expired'::idemq.job_state, 'cancelled'::idemq.job_state])))
);
CREATE INDEX job_children_active_child ON idemq.job_children USING btree (child_id) WHERE (state IS NULL);
CREATE TABLE idemq.child_waits (
    parent_id bigint PRIMARY KEY,
    pending integer NOT NULL,
    failed integer DEFAULT 0 NOT NULL,
    fail_fast boolean DEFAULT false NOT NULL,
    CONSTRAINT child_waits_counts_not_negative CHECK (((pending >= 0) AND (failed >= 0)))
) WITH (fillfactor = 50);
-- ==== end hand-written ====

-- ---- sql/functions/checks/_check_claimer.sql ----
CREATE OR REPLACE FUNCTION idemq._check_claimer(operation text, worker_id text, queues text[], tasks text[], lease interval)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('%s: worker_id must be a non-empty string', operation),
      HINT = 'Name the worker, e.g. hostname:pid; it is recorded as locked_by and in the error history.';
  END IF;
  PERFORM idemq._check_size(operation, 'worker_id', worker_id, 'worker_id_bytes',
    'Use a shorter worker id, e.g. hostname:pid; it is stored in every job the worker claims.');
  IF NOT idemq._names_valid(queues) THEN
    PERFORM idemq._raise_bad_names(operation, 'queues', queues, 'all queues', 'Pass NULL to claim from every queue.');
  END IF;
  IF NOT idemq._names_valid(tasks) THEN
    PERFORM idemq._raise_bad_names(operation, 'tasks', tasks, 'any task',
      'Pass the names of the tasks this worker has, or NULL to claim jobs of any task.');
  END IF;
  PERFORM idemq._check_lease(lease, operation);
END;
$$;

COMMENT ON FUNCTION idemq._check_claimer(text, text, text[], text[], interval) IS
  'Raise unless worker_id, queues, tasks and lease are what claim() and complete_and_take_next() accept.';

-- ---- sql/functions/steps/_check_event.sql ----
CREATE OR REPLACE FUNCTION idemq._check_event(operation text, event text, key text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_event.event IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: event must not be NULL', operation),
      HINT = 'Name the event, e.g. ''order.paid''; the key (e.g. the order id) says which one.';
  END IF;
  IF _check_event.event = '' OR _check_event.key = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: event and key must not be empty strings', operation),
      HINT = 'Leave key out (NULL) for an event without a key.';
  END IF;
  PERFORM idemq._check_size(operation, 'event', _check_event.event, 'key_bytes', 'Use a shorter event name.');
  PERFORM idemq._check_size(operation, 'key', _check_event.key, 'key_bytes', 'Use a shorter key, e.g. an id.');
END;
$$;

COMMENT ON FUNCTION idemq._check_event(text, text, text) IS
  'Raise 22004/22023 for a bad event name or key (emit, await_event).';

-- ---- sql/functions/flow/_check_limit_values.sql ----
CREATE OR REPLACE FUNCTION idemq._check_limit_values(operation text, concurrency int, rate int, per interval, per_key int)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_limit_values.concurrency NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: concurrency must be between 1 and 10000, not %s', operation, _check_limit_values.concurrency),
      HINT = 'concurrency is how many jobs of the scope may process at once; pause() stops them all.';
  END IF;
  IF _check_limit_values.rate NOT BETWEEN 1 AND 100000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: rate must be between 1 and 100000, not %s', operation, _check_limit_values.rate),
      HINT = 'rate is how many jobs of the scope may start per period (per); pause() stops them all.';
  END IF;
  IF (_check_limit_values.rate IS NULL) <> (_check_limit_values.per IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: rate and per go together, got %s without %s', operation,
                       CASE WHEN _check_limit_values.rate IS NULL THEN 'per' ELSE 'rate' END,
                       CASE WHEN _check_limit_values.rate IS NULL THEN 'rate' ELSE 'per' END),
      HINT = 'A rate limit is rate starts per period, e.g. rate => 100, per => ''1 minute''.';
  END IF;
  IF _check_limit_values.per < interval '1 second' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: per must be at least 1 second, not %s', operation, _check_limit_values.per),
      HINT = 'Scale both: 10 per 100 milliseconds is rate => 100, per => ''1 second''.';
  END IF;
  PERFORM idemq._check_duration(operation, 'per', _check_limit_values.per);
  IF _check_limit_values.per_key NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: per_key must be between 1 and 10000, not %s', operation, _check_limit_values.per_key),
      HINT = 'per_key is how many jobs with one concurrency key may process at once (1: one at a time).';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_limit_values(text, int, int, interval, int) IS
  'The value rules of a flow-control limit (set_limit, declare_limit): 22023 with a HINT for a value out of range.';

-- ---- sql/functions/flow/_claim_capped.sql ----
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

-- ---- sql/functions/flow/_claim_gate.sql ----
CREATE OR REPLACE FUNCTION idemq._claim_gate(key_tasks text[], key_queues text[], batch_size int,
                                             OUT tasks text[], OUT queues text[], OUT take int, OUT caps int[],
                                             OUT limited boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  WITH scopes AS MATERIALIZED (
    SELECT l.kind, l.name,
           CASE WHEN l.paused OR l.held_until > now() THEN 0 ELSE
             least(_claim_gate.batch_size,
                   CASE WHEN l.concurrency IS NOT NULL THEN
                     greatest(0, l.concurrency
                                 - (SELECT coalesce(sum(s.held), 0) FROM idemq.limit_slots s WHERE s.limit_id = l.id)
                                 + (SELECT coalesce(sum(r.n), 0) FROM idemq.limit_releases r WHERE r.limit_id = l.id))::int END,
                   CASE WHEN l.rate IS NOT NULL THEN
                     (SELECT count(*) FROM (SELECT FROM idemq.limit_starts r
                                            WHERE r.limit_id = l.id AND r.started_at < now() - r.per
                                            LIMIT _claim_gate.batch_size) f)::int END)
           END AS cap,
           l.concurrency IS NOT NULL OR l.rate IS NOT NULL AS takes
    FROM idemq.limits l
    WHERE (l.kind = 'queue' AND l.name = ANY (key_queues)) OR (l.kind = 'task' AND l.name = ANY (key_tasks))
  ),
  keys AS (
    SELECT k.n, k.task, k.queue,
           least(_claim_gate.batch_size,
                 (SELECT c.cap FROM scopes c WHERE c.kind = 'task' AND c.name = k.task),
                 (SELECT c.cap FROM scopes c WHERE c.kind = 'queue' AND c.name = k.queue)) AS cap,
           EXISTS (SELECT FROM scopes c
                   WHERE c.takes AND ((c.kind = 'task' AND c.name = k.task) OR (c.kind = 'queue' AND c.name = k.queue))) AS takes
    FROM unnest(key_tasks, key_queues) WITH ORDINALITY AS k(task, queue, n)
  )
  SELECT coalesce(array_agg(k.task ORDER BY k.n) FILTER (WHERE k.cap > 0), '{}'),
         coalesce(array_agg(k.queue ORDER BY k.n) FILTER (WHERE k.cap > 0), '{}'),
         least(_claim_gate.batch_size, coalesce(sum(k.cap) FILTER (WHERE k.cap > 0), 0))::int,
         CASE WHEN bool_or(k.cap > 0 AND k.cap < _claim_gate.batch_size)
              THEN array_agg(k.cap ORDER BY k.n) FILTER (WHERE k.cap > 0) END,
         coalesce(bool_or(k.takes) FILTER (WHERE k.cap > 0), false)
  INTO tasks, queues, take, caps, limited
  FROM keys k;
END;
$$;

COMMENT ON FUNCTION idemq._claim_gate(text[], text[], int) IS
  'claim() under flow control: the keys not paused and with free slots and starts, and how many jobs to walk at most.';

-- ---- sql/functions/retention/_delete_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq._delete_jobs(job_ids bigint[])
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  WITH gone AS (
    DELETE FROM idemq.jobs AS j
    WHERE j.id = ANY (_delete_jobs.job_ids) AND j.finished_at IS NOT NULL
    RETURNING j.id
  ), deps AS (
    DELETE FROM idemq.job_dependencies AS dep USING gone g WHERE dep.parent_id = g.id
  ), links AS (
    -- A parent's children links and count go with it (the children stay).
    DELETE FROM idemq.job_children AS c USING gone g WHERE c.parent_id = g.id
  ), waits AS (
    DELETE FROM idemq.child_waits AS w USING gone g WHERE w.parent_id = g.id
  )
  SELECT count(*) INTO v_count FROM gone;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq._delete_jobs(bigint[]) IS
  'Delete locked finished jobs and their dependency rows (never their keys); returns how many.';

-- ---- sql/functions/reads/_duration_buckets.sql ----
CREATE OR REPLACE FUNCTION idemq._duration_buckets()
RETURNS float8[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{1,2,5,10,20,50,100,200,500,1000,2000,5000,10000,20000,50000,100000,200000,500000,1000000,2000000,5000000}'::float8[];

COMMENT ON FUNCTION idemq._duration_buckets() IS
  'Bounds (ms) of the run and wait time buckets of idemq.job_minutes.';

-- ---- sql/functions/steps/_event_lock.sql ----
CREATE OR REPLACE FUNCTION idemq._event_lock(event text, key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('idemq.event'), hashtext(_event_lock.event || chr(1) || coalesce(_event_lock.key, '')));
END;
$$;

COMMENT ON FUNCTION idemq._event_lock(text, text) IS
  'Transaction advisory lock on one (event, key): emit and await_event never miss each other.';

-- ---- sql/functions/checks/_excerpt.sql ----
CREATE OR REPLACE FUNCTION idemq._excerpt(value text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN value IS NULL THEN 'NULL'
            -- Cut first, then escape: a cut never splits an escape sequence.
            WHEN left(value, 60) !~ '[\u0001-\u001f\u007f-\u009f]' THEN left(value, 60)
            ELSE (SELECT string_agg(CASE WHEN s.c !~ '[\u0001-\u001f\u007f-\u009f]' THEN s.c
                                         WHEN s.c = E'\n' THEN '\n' WHEN s.c = E'\r' THEN '\r' WHEN s.c = E'\t' THEN '\t'
                                         ELSE format('\u%s', lpad(to_hex(ascii(s.c)), 4, '0')) END, '' ORDER BY s.n)
                    FROM regexp_split_to_table(left(value, 60), '') WITH ORDINALITY AS s(c, n))
       END || CASE WHEN length(value) > 60 THEN format('… (%s characters)', length(value)) ELSE '' END;

COMMENT ON FUNCTION idemq._excerpt(text) IS
  'The first 60 characters of an input, control characters escaped, for error messages (bounded and inert whatever the input).';

-- ---- sql/functions/reads/_history_kept.sql ----
CREATE OR REPLACE FUNCTION idemq._history_kept()
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN interval '1 day';

COMMENT ON FUNCTION idemq._history_kept() IS
  'The span of the dashboard history (idemq.job_minutes): a day.';

-- ---- sql/functions/reads/_job_counts.sql ----
CREATE OR REPLACE FUNCTION idemq._job_counts()
RETURNS TABLE(queue text, task text, state idemq.job_state, jobs bigint)
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
  SELECT c.queue, c.task, c.state, sum(c.n)::bigint
  FROM idemq.job_counts c
  GROUP BY c.queue, c.task, c.state
  HAVING sum(c.n) <> 0;
END;

COMMENT ON FUNCTION idemq._job_counts() IS
  'Jobs per queue, task and state, exact, summed from idemq.job_counts (never a count of idemq.jobs).';

-- ---- sql/functions/enqueue/_job_rule_broken.sql ----
CREATE OR REPLACE FUNCTION idemq._job_rule_broken(job idemq._planned_job, limits idemq._enqueue_limits)
RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
  WHEN job.task IS NULL OR job.task = '' THEN 1
  WHEN octet_length(job.task) > limits.task_bytes THEN 2
  WHEN jsonb_typeof(job.payload) IS DISTINCT FROM 'object' THEN 3
  -- The stored size first: over 16 x payload_bytes + 8 the JSON text is surely
  -- over payload_bytes (see the header), and printing a payload of 100 MB,
  -- only to refuse it, cost seconds and the memory of its text.
  WHEN pg_column_size(job.payload) > 16 * limits.payload_bytes + 8
       OR octet_length(job.payload::text) > limits.payload_bytes THEN 4
  WHEN job.queue = '' THEN 5
  WHEN length(job.queue) > idemq._queue_name_limit() THEN 6
  WHEN NOT isfinite(job.run_at) THEN 7
  WHEN job.max_attempts < 1 THEN 8
  WHEN job.idempotency_key = '' THEN 9
  WHEN octet_length(job.idempotency_key) > limits.key_bytes THEN 10
  WHEN cardinality(job.after) > limits.parents_per_job THEN 11
  WHEN array_position(job.after, NULL) IS NOT NULL OR 0 >= ANY (job.after) THEN 12
  WHEN job.key_retention < interval '0' THEN 13
  WHEN job.key_retention > make_interval(days => limits.duration_days::int) THEN 14
  WHEN NOT idemq._is_traceparent(job.traceparent) THEN 15
  WHEN job.concurrency_key = '' THEN 16
  WHEN octet_length(job.concurrency_key) > limits.key_bytes THEN 17
  WHEN job.timeout <= interval '0' THEN 18
  WHEN job.timeout > make_interval(days => limits.duration_days::int) THEN 19
END;

COMMENT ON FUNCTION idemq._job_rule_broken(idemq._planned_job, idemq._enqueue_limits) IS
  'The number of the first value rule of enqueue a job breaks (NULL: none); _job_problem words it.';

-- ---- sql/functions/enqueue/_key_leaders.sql ----
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

-- ---- sql/functions/flow/_key_lock.sql ----
CREATE OR REPLACE FUNCTION idemq._key_lock(keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  -- One statement: the locks are taken as the sorted rows come (OFFSET 0
  -- keeps the sort below the calls).
  PERFORM pg_advisory_xact_lock(1801812339, s.h)
  FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(keys) AS k WHERE k IS NOT NULL ORDER BY 1 OFFSET 0) AS s;
END;
$$;

COMMENT ON FUNCTION idemq._key_lock(text[]) IS
  'Lock concurrency keys for the rest of the transaction (advisory, in hash order): admissions of a key are serialised.';

-- ---- sql/functions/attempts/_lease_until.sql ----
CREATE OR REPLACE FUNCTION idemq._lease_until(locked_at timestamptz, timeout interval, lease interval)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN least(now() + lease, locked_at + timeout);

COMMENT ON FUNCTION idemq._lease_until(timestamptz, interval, interval) IS
  'When a lease taken or renewed now runs out: lease from now, never past locked_at + timeout (the one definition claim, the hand-off and heartbeat use).';

-- ---- sql/functions/children/_link_children.sql ----
CREATE OR REPLACE FUNCTION idemq._link_children(parent_id bigint, children idemq._planned_job[], names text[],
                                                fail_fast boolean, OUT pending int, OUT failed int)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the children array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_linked int;
  v_existing bigint[];
  v_finished int := 0;
  v_unsuccessful int := 0;
BEGIN
  INSERT INTO idemq.job_children (parent_id, name, child_id)
  SELECT _link_children.parent_id, _link_children.names[p.ordinal], p.job_id
  FROM unnest(_link_children.children) p
  WHERE p.outcome IN ('created', 'deduplicated');
  GET DIAGNOSTICS v_linked = ROW_COUNT;

  v_existing := ARRAY(SELECT p.job_id FROM unnest(_link_children.children) p
                      WHERE p.outcome = 'deduplicated' ORDER BY p.job_id);
  IF cardinality(v_existing) > 0 THEN
    -- `id = ANY (array)` on the primary key is an index condition: one
    -- probe per element of the array (EXPLAIN: Index Cond), not a filter
    -- that compares every row with the whole list.
    PERFORM 1 FROM idemq.jobs j WHERE j.id = ANY (v_existing) ORDER BY j.id FOR NO KEY UPDATE;
    UPDATE idemq.jobs AS j SET has_children = true WHERE j.id = ANY (v_existing) AND NOT j.has_children;
  END IF;
  IF cardinality(v_existing) > 0
     OR EXISTS (SELECT FROM unnest(_link_children.children) p WHERE p.outcome = 'created' AND p.after IS NOT NULL) THEN
    WITH copied AS (
      UPDATE idemq.job_children AS c
      SET state = j.state, finished_at = j.finished_at,
          result = CASE WHEN j.state = 'succeeded' THEN j.result END,
          last_error = CASE WHEN j.state <> 'succeeded' THEN j.errors -> -1 END
      FROM unnest(_link_children.children) p
      JOIN idemq.jobs j ON j.id = p.job_id
      WHERE (p.outcome = 'deduplicated' OR (p.outcome = 'created' AND p.after IS NOT NULL))
        AND j.finished_at IS NOT NULL
        AND c.parent_id = _link_children.parent_id AND c.name = _link_children.names[p.ordinal]
      RETURNING c.state
    )
    SELECT count(*), count(*) FILTER (WHERE x.state <> 'succeeded') INTO v_finished, v_unsuccessful
    FROM copied x;
  END IF;

  INSERT INTO idemq.child_waits AS w (parent_id, pending, failed, fail_fast)
  VALUES (_link_children.parent_id, v_linked - v_finished, v_unsuccessful, _link_children.fail_fast)
  -- By constraint name: the parameter parent_id would make `(parent_id)` ambiguous.
  ON CONFLICT ON CONSTRAINT child_waits_pkey DO UPDATE
    SET pending = w.pending + EXCLUDED.pending, failed = w.failed + EXCLUDED.failed, fail_fast = EXCLUDED.fail_fast
  RETURNING w.pending, w.failed INTO _link_children.pending, _link_children.failed;
END;
$$;

COMMENT ON FUNCTION idemq._link_children(bigint, idemq._planned_job[], text[], boolean) IS
  'Link enqueued children to their parent (job_children), record those already finished, and add them to its child_waits count.';

-- ---- sql/functions/flow/_lock_slots.sql ----
CREATE OR REPLACE FUNCTION idemq._lock_slots(limit_id bigint, need int,
                                             OUT slots int[], OUT rooms int[], OUT folded int[], OUT shrunk int[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_last int := -2147483648;
  v_slot int;
  v_size int;
  v_held int;
  v_fold int;
  v_shrink int;
  v_debt int;
  v_room int;
  v_got int := 0;
BEGIN
  slots := '{}';
  rooms := '{}';
  folded := '{}';
  shrunk := '{}';
  WHILE v_got < need LOOP
    -- One stripe at a time (LIMIT 1), so a claim locks only the stripes it
    -- needs. A full stripe with releases waiting is locked too: its room
    -- shows once they are folded.
    SELECT s.slot, s.size, s.held INTO v_slot, v_size, v_held
    FROM idemq.limit_slots s
    WHERE s.limit_id = _lock_slots.limit_id AND s.slot > v_last
      AND (s.held < s.size
           OR EXISTS (SELECT FROM idemq.limit_releases r WHERE r.limit_id = s.limit_id AND r.slot = s.slot))
    ORDER BY s.slot
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED;
    EXIT WHEN NOT FOUND;
    v_last := v_slot;
    WITH gone AS (
      DELETE FROM idemq.limit_releases r
      WHERE r.limit_id = _lock_slots.limit_id AND r.slot = v_slot
      RETURNING r.n
    )
    SELECT coalesce(sum(g.n), 0)::int INTO v_fold FROM gone g;
    -- Never below zero: a count the trigger did not keep (a write with
    -- triggers off) is _repair_slots' to correct, not a claim's to fail on.
    v_fold := least(v_fold, v_held);
    v_shrink := 0;
    IF v_fold > 0 THEN
      SELECT l.slot_rows - l.concurrency INTO v_debt
      FROM idemq.limits l
      WHERE l.id = _lock_slots.limit_id AND l.slot_rows > l.concurrency
      FOR UPDATE;
      IF FOUND THEN
        v_shrink := least(v_debt, v_fold, v_size);
        UPDATE idemq.limits AS l SET slot_rows = l.slot_rows - v_shrink WHERE l.id = _lock_slots.limit_id;
      END IF;
    END IF;
    v_room := least(greatest(v_size - v_shrink - (v_held - v_fold), 0), need - v_got);
    slots := slots || v_slot;
    rooms := rooms || v_room;
    folded := folded || v_fold;
    shrunk := shrunk || v_shrink;
    v_got := v_got + v_room;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._lock_slots(bigint, int) IS
  'claim() under a concurrency limit: lock the stripes holding up to need free slots (SKIP LOCKED), folding their releases; the caller writes them.';

-- ---- sql/functions/reads/_minute_of.sql ----
CREATE OR REPLACE FUNCTION idemq._minute_of(at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN date_bin('1 minute', at, '2000-01-01 00:00:00+00');

COMMENT ON FUNCTION idemq._minute_of(timestamptz) IS
  'The job_minutes minute a time falls in (rounded down to a whole UTC minute).';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._pairs_by_id;
-- ---- sql/functions/attempts/_pairs_by_id.sql ----
CREATE OR REPLACE FUNCTION idemq._pairs_by_id(job_ids bigint[], attempts int[], lease_tokens uuid[],
                                              operation text, null_hint text,
                                              OUT ids bigint[], OUT attempts_by_id int[], OUT tokens_by_id uuid[])
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF job_ids IS NULL OR attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_ids and attempts must not be NULL', operation),
      HINT = null_hint;
  END IF;
  IF cardinality(job_ids) <> cardinality(attempts) OR cardinality(job_ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: job_ids (%s) and attempts (%s) must have the same length, at most 10000',
                       operation, cardinality(job_ids), cardinality(attempts)),
      HINT = 'attempts[i] is the attempt that claimed job_ids[i].';
  END IF;
  IF cardinality(lease_tokens) <> cardinality(job_ids) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: job_ids (%s) and lease_tokens (%s) must have the same length',
                       operation, cardinality(job_ids), cardinality(lease_tokens)),
      HINT = 'lease_tokens[i] is the lease_token claim() returned with job_ids[i].';
  END IF;
  -- plpgsql, not LANGUAGE sql: a SQL function with a SET clause is never
  -- inlined, and PostgreSQL 15-17 parse and plan its body again at every
  -- call from complete_many's or heartbeat's statement (18 caches it);
  -- plpgsql keeps the plan for the session. As LANGUAGE sql, `npm run bench
  -- -- profile` (process.c10, 20,000 jobs, PG15): 180 us per call, 19.3 us
  -- per completed job.
  -- unnest pads a NULL lease_tokens with NULLs: a NULL token for each id.
  SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.attempt ORDER BY t.id), '{}'),
         coalesce(array_agg(t.token ORDER BY t.id), '{}')
    INTO ids, attempts_by_id, tokens_by_id
  FROM (SELECT DISTINCT ON (u.id) u.id, u.attempt, u.token
        FROM unnest(job_ids, attempts, lease_tokens) AS u(id, attempt, token)
        WHERE u.id IS NOT NULL
        ORDER BY u.id, u.attempt DESC NULLS LAST, u.token) t;
END;
$$;

COMMENT ON FUNCTION idemq._pairs_by_id(bigint[], int[], uuid[], text, text) IS
  'Check (job_id, attempt, lease_token) entries and sort them by id, each id once with its highest attempt, for width_bucket() lookups.';

-- ---- sql/functions/flow/_per_key.sql ----
CREATE OR REPLACE FUNCTION idemq._per_key(queue text, task text)
RETURNS int
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
-- PL/pgSQL, not SQL: its callers run once per transaction (an enqueue, a
-- release), and a SQL function with a sub-SELECT is not inlined and was
-- planned again in every transaction; PL/pgSQL keeps the plan for the
-- session (bench/FINDINGS.md, "Flow control: concurrency keys").
AS $$
#variable_conflict error
BEGIN
  RETURN coalesce((SELECT min(l.per_key) FROM idemq.limits l
                   WHERE l.per_key IS NOT NULL
                     AND ((l.kind = 'queue' AND l.name = _per_key.queue) OR (l.kind = 'task' AND l.name = _per_key.task))),
                  1);
END;
$$;

COMMENT ON FUNCTION idemq._per_key(text, text) IS
  'How many jobs of one concurrency key may be admitted at once for a job of this queue and task: the lower per_key, else 1.';

-- ---- sql/functions/steps/_prune_events.sql ----
CREATE OR REPLACE FUNCTION idemq._prune_events(batch_size int)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_count int;
BEGIN
  WITH gone AS (
    DELETE FROM idemq.events e
    WHERE e.id IN (
      SELECT o.id FROM idemq.events o
      WHERE o.emitted_at < now() - make_interval(secs => idemq._limit('event_retention_seconds'))
      ORDER BY o.emitted_at
      LIMIT _prune_events.batch_size
      FOR UPDATE SKIP LOCKED)
    RETURNING e.id
  )
  SELECT count(*) INTO v_count FROM gone;
  RETURN v_count;
END;
$$;

COMMENT ON FUNCTION idemq._prune_events(int) IS
  'Delete at most batch_size events past event_retention_seconds (apply_retention).';

-- ---- sql/functions/attempts/_raise_not_held.sql ----
CREATE OR REPLACE FUNCTION idemq._raise_not_held(job_id bigint, attempt int, operation text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job record;
BEGIN
  IF _raise_not_held.job_id IS NULL OR _raise_not_held.attempt IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job_id and attempt must not be NULL', operation),
      HINT = 'Pass the id and attempt that claim() returned: together they are the fencing token.';
  END IF;
  SELECT j.state INTO v_job FROM idemq.jobs j WHERE j.id = _raise_not_held.job_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ404',
      MESSAGE = format('%s: job %s does not exist', operation, _raise_not_held.job_id),
      HINT = 'Check the job id; finished jobs may have been purged.';
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'IQ410',
    MESSAGE = format('%s: lease lost: attempt %s no longer holds job %s (it is %s)',
                     operation, _raise_not_held.attempt, _raise_not_held.job_id, v_job.state),
    DETAIL = jsonb_build_object('job_id', _raise_not_held.job_id, 'attempt', _raise_not_held.attempt,
                                'current_state', v_job.state)::text,
    HINT = 'Another attempt took the job over (lease expired and rescued, or cancelled), or the lease_token '
           'passed is not the one claim() returned with this attempt: roll back this attempt''s work and stop.';
END;
$$;

COMMENT ON FUNCTION idemq._raise_not_held(bigint, int, text) IS
  'Raise IQ404 or IQ410 for a fenced call whose (job_id, attempt) matched no held job.';

-- ---- sql/functions/checks/_result_limit.sql ----
CREATE OR REPLACE FUNCTION idemq._result_limit()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1048576;

COMMENT ON FUNCTION idemq._result_limit() IS
  'The largest job result, step result or event payload, in bytes of its JSON text (1 MiB).';

-- ---- sql/functions/reads/_scope_waits.sql ----
CREATE OR REPLACE FUNCTION idemq._scope_waits()
RETURNS TABLE(queue text, task text, waiting_for idemq.waiting_reason)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  -- PL/pgSQL, not a SQL-standard body: bound at each call, so a limits()
  -- redefined (DROP and CREATE, to give it a column) is not held by this
  -- function, and the migration may create it before limits().
  RETURN QUERY
  SELECT l.queue, l.task,
         CASE WHEN l.paused THEN 'paused'
              WHEN l.held_until IS NOT NULL THEN 'held'
              WHEN l.running >= l.concurrency THEN 'concurrency'
              WHEN l.started >= l.rate THEN 'rate' END::idemq.waiting_reason
  FROM idemq.limits() l;
END;
$$;

COMMENT ON FUNCTION idemq._scope_waits() IS
  'Why each queue and task with flow control holds its runnable jobs back now (paused, held, concurrency, rate), from limits(); NULL when it does not.';

-- ---- sql/functions/search/_search_walk.sql ----
CREATE OR REPLACE FUNCTION idemq._search_walk()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 20000;

COMMENT ON FUNCTION idemq._search_walk() IS
  'How many of the newest ids a search walks in order before it scans the rest unordered (20,000).';

-- ---- sql/functions/flow/_size_slots.sql ----
CREATE OR REPLACE FUNCTION idemq._size_slots(limit_id bigint, concurrency int)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_stripes int;
  v_held int;
BEGIN
  WITH gone AS (
    DELETE FROM idemq.limit_releases r WHERE r.limit_id = _size_slots.limit_id RETURNING r.slot, r.n
  ),
  per_slot AS (
    SELECT g.slot, sum(g.n)::int AS n FROM gone g GROUP BY g.slot
  )
  UPDATE idemq.limit_slots AS s SET held = greatest(s.held - p.n, 0)
  FROM per_slot p
  WHERE s.limit_id = _size_slots.limit_id AND s.slot = p.slot;

  SELECT count(*)::int INTO v_stripes FROM idemq.limit_slots s WHERE s.limit_id = _size_slots.limit_id;
  IF v_stripes < least(_size_slots.concurrency, 8) THEN
    INSERT INTO idemq.limit_slots (limit_id, slot, size)
    SELECT _size_slots.limit_id, nextval('idemq.limit_slot_numbers'), 0
    FROM generate_series(v_stripes + 1, least(_size_slots.concurrency, 8));
    v_stripes := least(_size_slots.concurrency, 8);
  END IF;

  SELECT coalesce(sum(s.held), 0)::int INTO v_held FROM idemq.limit_slots s WHERE s.limit_id = _size_slots.limit_id;
  -- The k-th stripe (in slot order) gets (free / stripes) more slots than it
  -- holds, and one more while k <= free % stripes.
  UPDATE idemq.limit_slots AS s
  SET size = s.held + CASE WHEN v_held >= _size_slots.concurrency THEN 0
                           ELSE (_size_slots.concurrency - v_held) / v_stripes
                                + CASE WHEN o.k <= (_size_slots.concurrency - v_held) % v_stripes THEN 1 ELSE 0 END END
  FROM (SELECT f.slot, row_number() OVER (ORDER BY f.slot) AS k
        FROM idemq.limit_slots f WHERE f.limit_id = _size_slots.limit_id) o
  WHERE s.limit_id = _size_slots.limit_id AND s.slot = o.slot;
  UPDATE idemq.limits AS l SET slot_rows = greatest(v_held, _size_slots.concurrency)
  WHERE l.id = _size_slots.limit_id;
END;
$$;

COMMENT ON FUNCTION idemq._size_slots(bigint, int) IS
  'Fold a concurrency limit''s releases and size its stripes for concurrency: room only while fewer than concurrency are held.';

-- ---- sql/functions/flow/_stripe_of.sql ----
CREATE OR REPLACE FUNCTION idemq._stripe_of(named int, first_slot int)
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN named >= first_slot THEN named ELSE first_slot END;

COMMENT ON FUNCTION idemq._stripe_of(int, int) IS
  'The stripe a processing job is counted in: the one it names if its limit''s (>= first_slot), else first_slot.';

-- ---- sql/functions/schedules/_tick.sql ----
CREATE OR REPLACE FUNCTION idemq._tick(at timestamptz)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_created int := 0;
  v_s record;
  v_spec jsonb;
  v_on_time timestamptz[];
  v_missed timestamptz[];
  v_slot timestamptz;
  v_last_job bigint;
  v_last_slot timestamptz;
  v_last_state idemq.job_state;
  v_skipped int;
  v_after bigint[];
  v_job bigint;
  v_deduplicated boolean;
  v_new int;
  v_state text;
  v_message text;
BEGIN
  FOR v_s IN
    SELECT s.name, s.cron, s.timezone, s.task, s.payload, s.queue, s.priority, s.max_attempts,
           s.overlap, s.misfire, s.misfire_grace, s.next_at, s.last_job_id, s.last_slot_at
    FROM idemq.schedules s
    WHERE s.next_at <= _tick.at
    ORDER BY s.next_at, s.name
    FOR UPDATE SKIP LOCKED
  LOOP
    -- Each schedule in a subtransaction: a job enqueue refuses for the
    -- schedule's own reason (a limit lowered after schedule() checked it)
    -- undoes this schedule's slots only, and is recorded in the handler.
    BEGIN
      v_spec := idemq._cron_parse(v_s.cron);
      v_on_time := idemq._cron_latest(v_spec, v_s.timezone,
                                      greatest(v_s.next_at, _tick.at - v_s.misfire_grace + interval '1 microsecond'),
                                      _tick.at, 100);
      v_missed := '{}';
      IF v_s.next_at <= _tick.at - v_s.misfire_grace THEN
        IF v_s.misfire = 'all' THEN
          v_missed := idemq._cron_latest(v_spec, v_s.timezone, v_s.next_at, _tick.at - v_s.misfire_grace,
                                         100 - cardinality(v_on_time));
        ELSIF v_s.misfire = 'once' AND cardinality(v_on_time) = 0 THEN
          v_missed := idemq._cron_latest(v_spec, v_s.timezone, v_s.next_at, _tick.at - v_s.misfire_grace, 1);
        END IF;
      END IF;

      v_last_job := v_s.last_job_id;
      v_last_slot := v_s.last_slot_at;
      v_skipped := 0;
      v_new := 0;
      FOREACH v_slot IN ARRAY v_missed || v_on_time LOOP
        v_after := NULL;
        IF v_s.overlap <> 'allow' THEN
          SELECT j.state INTO v_last_state FROM idemq.jobs j WHERE j.id = v_last_job;
          IF v_last_state = ANY (idemq.active_states()) THEN
            IF v_s.overlap = 'skip' OR v_last_state <> 'processing' THEN
              v_skipped := v_skipped + 1;
              CONTINUE;
            END IF;
            v_after := ARRAY[v_last_job];
          END IF;
        END IF;
        BEGIN
          SELECT e.job_id, e.deduplicated INTO v_job, v_deduplicated
          FROM idemq.enqueue(
            task => v_s.task, payload => v_s.payload, queue => v_s.queue, priority => v_s.priority,
            max_attempts => v_s.max_attempts,
            idempotency_key => format('schedule:%s:%s', v_s.name,
                                      to_char(v_slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
            duplicate_policy => 'reject_always', after => v_after) e;
        EXCEPTION WHEN SQLSTATE 'IQ409' OR SQLSTATE 'IQ422' THEN
          -- The slot's key was used already: the slot ran (or was replayed) before.
          CONTINUE;
        END;
        IF NOT v_deduplicated THEN
          v_new := v_new + 1;
        END IF;
        v_last_job := v_job;
        v_last_slot := v_slot;
      END LOOP;

      UPDATE idemq.schedules AS s
      SET next_at = coalesce(idemq._cron_next(v_spec, v_s.timezone, _tick.at), 'infinity'),
          last_slot_at = v_last_slot,
          last_job_id = v_last_job,
          skipped = s.skipped + v_skipped,
          last_error = NULL,
          last_error_at = NULL
      WHERE s.name = v_s.name;
      v_created := v_created + v_new;
    EXCEPTION WHEN data_exception OR integrity_constraint_violation OR program_limit_exceeded
                   OR SQLSTATE 'IQ404' THEN
      -- Its slots are undone and its next_at stays (due: the next call tries
      -- again); the row lock of the loop's FOR UPDATE is the transaction's.
      GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
      UPDATE idemq.schedules AS s
      SET last_error = format('%s (SQLSTATE %s)', v_message, v_state),
          last_error_at = _tick.at
      WHERE s.name = v_s.name;
    END;
  END LOOP;
  RETURN v_created;
END;
$$;

COMMENT ON FUNCTION idemq._tick(timestamptz) IS
  'tick() on a given clock: enqueue each due slot of every due schedule once, by its overlap and misfire policies.';

-- ---- sql/functions/admin/_action_states.sql ----
CREATE OR REPLACE FUNCTION idemq._action_states(operation text, action text)
RETURNS idemq.job_state[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  CASE action
    WHEN 'retry' THEN RETURN idemq._unsuccessful_states();
    WHEN 'cancel' THEN RETURN idemq.active_states();
    WHEN 'delete' THEN RETURN idemq.terminal_states();
    WHEN 'run_now' THEN RETURN ARRAY['scheduled']::idemq.job_state[];
    ELSE
      RAISE EXCEPTION USING ERRCODE = CASE WHEN action IS NULL THEN '22004' ELSE '22023' END,
        MESSAGE = format('%s: action must be retry, cancel, delete or run_now, not %s', operation,
                         CASE WHEN action IS NULL THEN 'NULL' ELSE idemq._excerpt(action) END),
        HINT = 'Name the bulk action whose jobs to count, or leave action out to count every match.';
  END CASE;
END;
$$;

COMMENT ON FUNCTION idemq._action_states(text, text) IS
  'The states a bulk action (retry, cancel, delete, run_now) takes jobs in.';

-- ---- sql/functions/search/_check_job_filter.sql ----
CREATE OR REPLACE FUNCTION idemq._check_job_filter(operation text, filter jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  c_fields constant text[] := ARRAY['ids', 'state', 'task', 'queue', 'key', 'concurrency_key', 'error',
                                    'created_after', 'created_before', 'finished_after', 'finished_before', 'payload'];
  v_field text;
  v_value jsonb;
  v_type text;
  v_problem text;
  v_hint text;
  v_at timestamptz;
BEGIN
  IF filter IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: filter must not be NULL', operation),
      HINT = 'Pass ''{}'' to match every job, or e.g. ''{"state": ["failed"], "task": "send_email"}''.';
  END IF;
  IF jsonb_typeof(filter) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: filter must be a JSON object, not %s', operation, idemq._excerpt(filter::text)),
      HINT = format('e.g. ''{"state": ["failed"], "task": "send_email"}''; the fields are %s.', array_to_string(c_fields, ', '));
  END IF;

  FOR v_field, v_value IN SELECT e.key, e.value FROM jsonb_each(filter) AS e ORDER BY e.key LOOP
    v_type := jsonb_typeof(v_value);
    v_problem := NULL;
    IF NOT v_field = ANY (c_fields) THEN
      v_problem := 'is not a filter field';
      v_hint := format('The fields are %s.', array_to_string(c_fields, ', '));
    ELSIF v_field = 'ids' THEN
      v_hint := 'ids is an array of job ids, e.g. {"ids": [42, "43"]}, at most 10000 of them.';
      IF v_type <> 'array' OR jsonb_array_length(v_value) NOT BETWEEN 1 AND 10000 THEN
        v_problem := 'must be an array of 1 to 10000 job ids';
      ELSIF EXISTS (SELECT FROM jsonb_array_elements(v_value) AS e
                    WHERE jsonb_typeof(e) NOT IN ('number', 'string')
                       OR (e #>> '{}') !~ '^[1-9][0-9]{0,18}$'
                       OR (e #>> '{}')::numeric > 9223372036854775807) THEN
        v_problem := 'must hold only job ids (positive whole numbers)';
      END IF;
    ELSIF v_field = 'state' THEN
      v_hint := format('state is an array of states, e.g. {"state": ["failed", "expired"]}; the states are %s.',
                       array_to_string(enum_range(NULL::idemq.job_state)::text[], ', '));
      IF v_type <> 'array' OR jsonb_array_length(v_value) = 0 THEN
        v_problem := 'must be a non-empty array of states';
      ELSIF EXISTS (SELECT FROM jsonb_array_elements(v_value) AS e
                    WHERE jsonb_typeof(e) <> 'string'
                       OR NOT (e #>> '{}') = ANY (enum_range(NULL::idemq.job_state)::text[])) THEN
        v_problem := 'holds something that is not a state';
      END IF;
    ELSIF v_field IN ('task', 'queue', 'key', 'concurrency_key', 'error') THEN
      v_hint := format('%s is one string, e.g. {"%s": "%s"}.', v_field, v_field,
                       CASE v_field WHEN 'task' THEN 'send_email' WHEN 'queue' THEN 'default'
                                    WHEN 'key' THEN 'invoice:42' WHEN 'concurrency_key' THEN 'customer:7'
                                    ELSE 'timeout' END);
      IF v_type <> 'string' OR v_value #>> '{}' = '' OR length(v_value #>> '{}') > 1000 THEN
        v_problem := 'must be a non-empty string of at most 1000 characters';
      END IF;
    ELSIF v_field IN ('created_after', 'created_before', 'finished_after', 'finished_before') THEN
      v_hint := format('%s is a time, e.g. {"%s": "2026-12-01T09:00:00Z"}.', v_field, v_field);
      IF v_type <> 'string' THEN
        v_problem := 'must be a time as a string';
      ELSE
        BEGIN
          v_at := (v_value #>> '{}')::timestamptz;
          IF NOT isfinite(v_at) THEN
            v_problem := 'must be a finite time';
          END IF;
        EXCEPTION WHEN data_exception THEN
          v_problem := 'is not a time';
        END;
      END IF;
    ELSIF v_field = 'payload' THEN
      v_hint := 'payload is a JSON object the job''s payload must contain (@>), with the task named: '
                || 'e.g. {"task": "send_email", "payload": {"customer": 42}}.';
      IF v_type <> 'object' THEN
        v_problem := 'must be a JSON object';
      -- The payload match is tested on every job the other fields leave: a
      -- task's jobs, not the whole table (bench/FINDINGS.md, "Search").
      ELSIF NOT (filter ? 'task' OR filter ? 'key' OR filter ? 'ids') THEN
        v_problem := 'needs task (or key, or ids) beside it';
      END IF;
    END IF;
    IF v_problem IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('%s: filter field "%s" %s; got %s', operation, idemq._excerpt(v_field), v_problem,
                         idemq._excerpt(v_value::text)),
        HINT = v_hint;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._check_job_filter(text, jsonb) IS
  'Raise 22023 (22004 for NULL) naming the field when a job filter has an unknown field or a bad value.';

-- ---- sql/functions/checks/_check_result.sql ----
CREATE OR REPLACE FUNCTION idemq._check_result(operation text, what text, value jsonb, hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_bytes int := octet_length(_check_result.value::text);
BEGIN
  IF v_bytes > idemq._result_limit() THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: %s is %s bytes of JSON, over the limit of %s bytes', operation, what, v_bytes, idemq._result_limit()),
      HINT = hint;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._check_result(text, text, jsonb, text) IS
  'Raise 22023 when a result or event payload is over _result_limit() bytes of JSON text.';

-- ---- sql/functions/flow/_claim_take.sql ----
CREATE OR REPLACE FUNCTION idemq._claim_take(job_ids bigint[], key_task text, key_queue text,
                                             OUT ids bigint[], OUT queue_slots int[], OUT task_slots int[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_held boolean[];
  v_slot_scope bigint[];   -- per job: [queue's, task's] concurrency limit ids (NULL: none)
  v_start_scope bigint[];  -- per job: [queue's, task's] rate limit ids
  v_slot_lids bigint[] := '{}';  -- the free slots locked, one entry per slot, grouped by limit
  v_slot_nos int[] := '{}';      -- ... and the stripe of each
  v_w_lids bigint[] := '{}';     -- the stripes locked, to write once each
  v_w_slots int[] := '{}';
  v_w_folded int[] := '{}';
  v_w_shrunk int[] := '{}';
  v_start_lids bigint[];
  v_start_nos int[];
  v_t_lids bigint[];              -- every entry locked (below), to give out in one loop
  v_t_nos int[];
  v_used_lids bigint[] := '{}';  -- per v_t_lids value: how many of its entries are given
  v_used_n int[] := '{}';
  v_a_lid bigint[] := '{}';      -- the slots given, one entry per (job, scope)
  v_a_slot int[] := '{}';
  v_r_lid bigint[] := '{}';
  v_r_n int[] := '{}';
  v_lid bigint;
  v_need int;
  v_p int;
  v_ok boolean;
  v_pick int[];
  v_scopes bigint[];
  v_simple boolean;
  v_one_scope bigint[];    -- per job: its one concurrency limit id (NULL: none, or held)
  v_one_queue boolean[];   -- per job: that limit is its queue's
  v_q int;
  v_t int;
  v_lq idemq.limits;
  v_lt idemq.limits;
  v_lock record;
BEGIN
  IF key_task IS NOT NULL THEN
    -- One key: its two scopes are every job's.
    SELECT l.* INTO v_lq FROM idemq.limits l WHERE l.kind = 'queue' AND l.name = key_queue;
    SELECT l.* INTO v_lt FROM idemq.limits l WHERE l.kind = 'task' AND l.name = key_task;
    IF coalesce(v_lq.paused, false) OR coalesce(v_lt.paused, false) THEN
      ids := '{}';
      RETURN;
    END IF;
    IF v_lq.rate IS NULL AND v_lt.rate IS NULL AND (v_lq.concurrency IS NULL OR v_lt.concurrency IS NULL) THEN
      IF v_lq.concurrency IS NULL AND v_lt.concurrency IS NULL THEN
        ids := job_ids;
        RETURN;
      END IF;
      v_lid := CASE WHEN v_lq.concurrency IS NOT NULL THEN v_lq.id ELSE v_lt.id END;
      SELECT k.slots, k.rooms, k.folded, k.shrunk INTO v_lock FROM idemq._lock_slots(v_lid, cardinality(job_ids)) k;
      -- The k-th job (claim order) gets the k-th free slot locked; jobs past
      -- the last are left.
      v_slot_nos := ARRAY(SELECT u.slot
                          FROM unnest(v_lock.slots, v_lock.rooms) WITH ORDINALITY AS u(slot, room, o)
                          CROSS JOIN generate_series(1, u.room)
                          ORDER BY u.o);
      ids := job_ids[1:cardinality(v_slot_nos)];
      IF cardinality(v_lock.slots) > 0 THEN
        UPDATE idemq.limit_slots AS s SET held = s.held - u.folded + u.room, size = s.size - u.shrunk
        FROM unnest(v_lock.slots, v_lock.rooms, v_lock.folded, v_lock.shrunk) AS u(slot, room, folded, shrunk)
        WHERE s.limit_id = v_lid AND s.slot = u.slot;
      END IF;
      IF v_lq.concurrency IS NOT NULL THEN
        queue_slots := v_slot_nos;
      ELSE
        task_slots := v_slot_nos;
      END IF;
      RETURN;
    END IF;
  END IF;

  SELECT array_agg(j.id ORDER BY o.n),
         array_agg(coalesce(lq.paused, false) OR coalesce(lt.paused, false) ORDER BY o.n),
         array_agg(CASE WHEN lq.concurrency IS NOT NULL THEN lq.id END ORDER BY o.n)
           || array_agg(CASE WHEN lt.concurrency IS NOT NULL THEN lt.id END ORDER BY o.n),
         array_agg(CASE WHEN lq.rate IS NOT NULL THEN lq.id END ORDER BY o.n)
           || array_agg(CASE WHEN lt.rate IS NOT NULL THEN lt.id END ORDER BY o.n),
         bool_and(lq.rate IS NULL AND lt.rate IS NULL
                  AND (lq.concurrency IS NULL OR lt.concurrency IS NULL)),
         array_agg(CASE WHEN NOT (coalesce(lq.paused, false) OR coalesce(lt.paused, false))
                        THEN CASE WHEN lq.concurrency IS NOT NULL THEN lq.id
                                  WHEN lt.concurrency IS NOT NULL THEN lt.id END END ORDER BY o.n),
         array_agg(lq.concurrency IS NOT NULL ORDER BY o.n)
  INTO v_ids, v_held, v_slot_scope, v_start_scope, v_simple, v_one_scope, v_one_queue
  FROM unnest(job_ids) WITH ORDINALITY AS o(id, n)
  JOIN idemq.jobs j ON j.id = o.id
  LEFT JOIN idemq.limits lq ON lq.kind = 'queue' AND lq.name = j.queue
  LEFT JOIN idemq.limits lt ON lt.kind = 'task' AND lt.name = j.task;
  IF v_ids IS NULL THEN
    ids := '{}';
    RETURN;
  END IF;

  -- Lock as many free slots per concurrency scope as its jobs here could
  -- use (in limit order, stripes in slot order), skipping stripes other
  -- transactions hold.
  FOR v_lid, v_need IN
    SELECT u.lid, count(*)::int
    FROM unnest(v_slot_scope, v_held || v_held) AS u(lid, held)
    WHERE u.lid IS NOT NULL AND NOT u.held
    GROUP BY u.lid
    ORDER BY u.lid
  LOOP
    SELECT k.slots, k.rooms, k.folded, k.shrunk INTO v_lock FROM idemq._lock_slots(v_lid, v_need) k;
    v_slot_nos := v_slot_nos || ARRAY(SELECT u.slot
                                      FROM unnest(v_lock.slots, v_lock.rooms) WITH ORDINALITY AS u(slot, room, o)
                                      CROSS JOIN generate_series(1, u.room)
                                      ORDER BY u.o);
    v_slot_lids := v_slot_lids || array_fill(v_lid, ARRAY[cardinality(v_slot_nos) - cardinality(v_slot_lids)]);
    v_w_lids := v_w_lids || array_fill(v_lid, ARRAY[cardinality(v_lock.slots)]);
    v_w_slots := v_w_slots || v_lock.slots;
    v_w_folded := v_w_folded || v_lock.folded;
    v_w_shrunk := v_w_shrunk || v_lock.shrunk;
  END LOOP;

  IF v_simple THEN
    -- The common case, set-based: no rate, at most one concurrency scope per
    -- job. The k-th job of a scope (claim order, paused jobs left out) gets
    -- the k-th free slot of it locked above; a job past the slots locked is
    -- left; a job of no scope goes. What the loop below does, with no
    -- per-job PL/pgSQL step (bench/FINDINGS.md, "Flow control: what a
    -- limited claim costs").
    WITH j AS (
      SELECT u.id, u.lid, u.is_queue, u.n,
             row_number() OVER (PARTITION BY u.lid ORDER BY u.n) AS k
      FROM unnest(v_ids, v_one_scope, v_one_queue, v_held) WITH ORDINALITY AS u(id, lid, is_queue, held, n)
      WHERE NOT u.held
    ),
    locked AS (
      SELECT u.lid, u.slot, row_number() OVER (PARTITION BY u.lid ORDER BY u.o) AS k
      FROM unnest(v_slot_lids, v_slot_nos) WITH ORDINALITY AS u(lid, slot, o)
    )
    SELECT coalesce(array_agg(j.id ORDER BY j.n), '{}'),
           array_agg(CASE WHEN j.is_queue THEN l.slot END ORDER BY j.n),
           array_agg(CASE WHEN NOT j.is_queue THEN l.slot END ORDER BY j.n),
           coalesce(array_agg(l.lid) FILTER (WHERE l.lid IS NOT NULL), '{}'),
           coalesce(array_agg(l.slot) FILTER (WHERE l.lid IS NOT NULL), '{}')
    INTO ids, queue_slots, task_slots, v_a_lid, v_a_slot
    FROM j
    LEFT JOIN locked l ON l.lid = j.lid AND l.k = j.k
    WHERE j.lid IS NULL OR l.lid IS NOT NULL;
  ELSE
    ids := '{}';
    queue_slots := '{}';
    task_slots := '{}';
    WITH need AS (
      SELECT u.lid, count(*) AS n
      FROM unnest(v_start_scope, v_held || v_held) AS u(lid, held)
      WHERE u.lid IS NOT NULL AND NOT u.held
      GROUP BY u.lid
    )
    SELECT array_agg(r.limit_id ORDER BY r.limit_id, r.n), array_agg(r.n ORDER BY r.limit_id, r.n)
    INTO v_start_lids, v_start_nos
    FROM need c
    CROSS JOIN LATERAL (
      SELECT r.limit_id, r.n FROM idemq.limit_starts r
      WHERE r.limit_id = c.lid AND r.started_at < now() - r.per
      ORDER BY r.started_at, r.n
      LIMIT c.n
      FOR UPDATE SKIP LOCKED
    ) r;
    v_start_lids := coalesce(v_start_lids, '{}');

    -- One list of the entries locked, slots then starts, each under its
    -- limit's id, a start's negated: one limit may have both, and limit ids
    -- are positive (an identity), so the sign tells them apart and one
    -- lookup and one count of entries used serve both kinds.
    v_t_lids := v_slot_lids || ARRAY(SELECT -u.lid FROM unnest(v_start_lids) AS u(lid));
    v_t_nos := v_slot_nos || coalesce(v_start_nos, '{}');

    -- In claim order: a job goes only if each of its scopes (queue's slot,
    -- task's slot, queue's start, task's start) has an entry left for it;
    -- the k-th job of a scope gets its k-th locked entry.
    FOR i IN 1 .. cardinality(v_ids) LOOP
      CONTINUE WHEN v_held[i];
      v_ok := true;
      v_q := NULL;
      v_t := NULL;
      v_pick := '{}';
      v_scopes := ARRAY[v_slot_scope[i], v_slot_scope[cardinality(v_ids) + i],
                        -v_start_scope[i], -v_start_scope[cardinality(v_ids) + i]];
      FOR w IN 1 .. 4 LOOP
        v_lid := v_scopes[w];
        CONTINUE WHEN v_lid IS NULL;
        v_p := array_position(v_t_lids, v_lid)
               + coalesce(v_used_n[array_position(v_used_lids, v_lid)], 0);
        IF v_p IS NULL OR v_p > cardinality(v_t_lids) OR v_t_lids[v_p] <> v_lid THEN
          v_ok := false;
          EXIT;
        END IF;
        v_pick := v_pick || v_p;
        IF w = 1 THEN
          v_q := v_t_nos[v_p];
        ELSIF w = 2 THEN
          v_t := v_t_nos[v_p];
        END IF;
      END LOOP;
      CONTINUE WHEN NOT v_ok;
      ids := ids || v_ids[i];
      queue_slots := queue_slots || v_q;
      task_slots := task_slots || v_t;
      FOREACH v_p IN ARRAY v_pick LOOP
        v_lid := v_t_lids[v_p];
        IF v_lid = ANY (v_used_lids) THEN
          v_used_n[array_position(v_used_lids, v_lid)] := v_used_n[array_position(v_used_lids, v_lid)] + 1;
        ELSE
          v_used_lids := v_used_lids || v_lid;
          v_used_n := v_used_n || 1;
        END IF;
        IF v_lid > 0 THEN
          v_a_lid := v_a_lid || v_lid;
          v_a_slot := v_a_slot || v_t_nos[v_p];
        ELSE
          v_r_lid := v_r_lid || -v_lid;
          v_r_n := v_r_n || v_t_nos[v_p];
        END IF;
      END LOOP;
    END LOOP;
    IF cardinality(v_r_lid) > 0 THEN
      UPDATE idemq.limit_starts AS r SET started_at = now()
      FROM unnest(v_r_lid, v_r_n) AS a(lid, n)
      WHERE r.limit_id = a.lid AND r.n = a.n;
    END IF;
  END IF;

  -- Each stripe locked, written once: the slots given there, the releases
  -- folded, the slots given up to a draining limit.
  IF cardinality(v_w_lids) > 0 THEN
    UPDATE idemq.limit_slots AS s
    SET held = s.held - w.folded + coalesce(u.n, 0), size = s.size - w.shrunk
    FROM unnest(v_w_lids, v_w_slots, v_w_folded, v_w_shrunk) AS w(lid, slot, folded, shrunk)
    LEFT JOIN (SELECT a.lid, a.slot, count(*)::int AS n
               FROM unnest(v_a_lid, v_a_slot) AS a(lid, slot)
               GROUP BY a.lid, a.slot) u ON u.lid = w.lid AND u.slot = w.slot
    WHERE s.limit_id = w.lid AND s.slot = w.slot;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._claim_take(bigint[], text, text) IS
  'claim() under flow control: the slots and starts for its locked jobs, in claim order; returns the jobs that may start and their stripes.';

-- ---- sql/functions/reads/_duration_percentile.sql ----
CREATE OR REPLACE FUNCTION idemq._duration_percentile(buckets jsonb, fraction float8)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
  SELECT (idemq._duration_buckets())[least(c.k + 1, cardinality(idemq._duration_buckets()))]::bigint
  FROM (
    SELECT b.key::int AS k,
           sum(b.value::bigint) OVER (ORDER BY b.key::int) AS below,
           sum(b.value::bigint) OVER () AS total
    FROM jsonb_each_text(buckets) b
  ) c
  WHERE c.below >= fraction * c.total AND c.total > 0
  ORDER BY c.k
  LIMIT 1;
END;

COMMENT ON FUNCTION idemq._duration_percentile(jsonb, float8) IS
  'A percentile (ms, a bucket''s upper bound) of durations counted in _duration_buckets() buckets.';

-- ---- sql/functions/install/_grant_roles.sql ----
CREATE OR REPLACE FUNCTION idemq._grant_roles()
RETURNS TABLE(role text, privilege text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_fn regprocedure;
  v_name text;
  v_kind text;
  v_role text;
  v_member text;
  v_prefix text := nullif(current_setting('idemq.roles_prefix', true), '');
  v_installation idemq.installation;
  v_may_create boolean := (SELECT r.rolsuper OR r.rolcreaterole FROM pg_roles r WHERE r.rolname = current_user);
  v_shared constant text[] := ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'];
  v_kinds constant text[] := ARRAY['producer', 'worker', 'admin', 'viewer'];
  v_constants text[] := ARRAY['active_states', 'terminal_states', 'schema_version'];
  v_producer text[] := ARRAY['enqueue', 'enqueue_many', 'job', 'emit', 'job_result', 'children', 'enqueue_batch'];
  v_worker text[] := ARRAY['job', 'claim', 'complete', 'complete_many', 'complete_and_take_next', 'fail', 'heartbeat', 'snooze', 'hold',
                           'guard', 'effect_claim', 'effect_done', 'effect_release', 'rescue',
                           'wait_for_jobs', 'stop_waiting', 'prune_keys', 'tick', 'apply_retention',
                           'worker_seen', 'worker_stopped', 'stats', 'limits', 'declare_limit', 'progress', 'roll_up',
                           'step_record', 'steps', 'sleep', 'await_event',
                           'job_result', 'children', 'spawn', 'wait_for_children'];
  v_viewer text[] := ARRAY['job', 'find_jobs', 'count_jobs', 'overview', 'stats', 'limits', 'held_keys',
                           'workers', 'unserved_jobs', 'schedules', 'schedule_next', 'retry_horizon', 'history',
                           'children'];
BEGIN
  -- The installation's names, recorded once.
  SELECT i.* INTO v_installation FROM idemq.installation i FOR UPDATE;
  IF NOT FOUND THEN
    v_prefix := coalesce(v_prefix, 'idemq_' || CASE WHEN octet_length(current_database()) <= 40 THEN current_database()
                                                    ELSE left(md5(current_database()), 12) END);
    IF octet_length(v_prefix || '_producer') > 63 THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('roles prefix "%s" makes role names over 63 bytes', idemq._excerpt(v_prefix)),
        HINT = 'Choose a prefix of at most 54 bytes (idemq migrate --roles-prefix NAME).';
    END IF;
    INSERT INTO idemq.installation (producer_role, worker_role, admin_role, viewer_role, shared_members_pending)
    VALUES (v_prefix || '_producer', v_prefix || '_worker', v_prefix || '_admin', v_prefix || '_viewer',
            current_setting('idemq.installing', true) IS DISTINCT FROM 'on')
    RETURNING * INTO v_installation;
  ELSIF v_prefix IS NOT NULL AND v_prefix || '_worker' <> v_installation.worker_role THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('this installation''s roles are %s, %s, %s and %s; roles prefix "%s" cannot rename them',
                       v_installation.producer_role, v_installation.worker_role, v_installation.admin_role,
                       v_installation.viewer_role, idemq._excerpt(v_prefix)),
      HINT = 'The prefix is chosen once, at install: drop --roles-prefix (or the setting idemq.roles_prefix).';
  END IF;

  FOREACH v_role IN ARRAY ARRAY[v_installation.producer_role, v_installation.worker_role, v_installation.admin_role,
                                v_installation.viewer_role] LOOP
    CONTINUE WHEN NOT v_may_create OR EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    BEGIN
      EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL; -- a concurrent creator committed it first
    END;
  END LOOP;

  FOR v_fn IN
    SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
  END LOOP;
  FOR i IN 1 .. 4 LOOP
    v_kind := v_kinds[i];
    v_role := CASE v_kind WHEN 'producer' THEN v_installation.producer_role
                          WHEN 'worker' THEN v_installation.worker_role
                          WHEN 'viewer' THEN v_installation.viewer_role
                          ELSE v_installation.admin_role END;
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    EXECUTE format('GRANT USAGE ON SCHEMA idemq TO %I', v_role);
    role := v_role;
    privilege := 'USAGE ON SCHEMA idemq';
    RETURN NEXT;
    FOR v_fn, v_name IN
      SELECT p.oid::regprocedure, p.proname FROM pg_proc p
      WHERE p.pronamespace = 'idemq'::regnamespace AND left(p.proname, 1) <> '_'
      ORDER BY p.proname
    LOOP
      CONTINUE WHEN NOT (v_name = ANY (v_constants)
                         OR (v_kind = 'producer' AND v_name = ANY (v_producer))
                         OR (v_kind = 'worker' AND v_name = ANY (v_worker))
                         OR (v_kind = 'viewer' AND v_name = ANY (v_viewer))
                         OR v_kind = 'admin');
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
      privilege := format('EXECUTE ON FUNCTION %s', v_fn);
      RETURN NEXT;
    END LOOP;
    IF v_kind = 'admin' THEN
      EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA idemq TO %I', v_role);
      privilege := 'SELECT ON ALL TABLES IN SCHEMA idemq';
      RETURN NEXT;
      -- The limits are the admin's to change (their ranges are CHECKed).
      EXECUTE format('GRANT UPDATE (value) ON idemq.settings TO %I', v_role);
      privilege := 'UPDATE (value) ON idemq.settings';
      RETURN NEXT;
    END IF;
    IF v_kind = 'viewer' THEN
      -- What the job page reads beside job(): no payload, no result.
      EXECUTE format('GRANT SELECT ON idemq.job_dependencies TO %I', v_role);
      EXECUTE format('GRANT SELECT (id, task, state) ON idemq.jobs TO %I', v_role);
      EXECUTE format('GRANT SELECT (key, job_id, task, finished_state, finished_at, created_at) ON idemq.keys TO %I', v_role);
      privilege := 'SELECT ON idemq.job_dependencies, idemq.jobs (id, task, state), idemq.keys (key, job_id, task, finished_state, finished_at, created_at)';
      RETURN NEXT;
    END IF;

    -- Upgrading from 0.1.0: the logins of the cluster-wide role keep their
    -- rights here through this installation's role, granted before the
    -- cluster-wide role's are revoked below.
    IF v_installation.shared_members_pending AND v_may_create AND v_shared[i] IS NOT NULL THEN
      FOR v_member IN
        SELECT m.rolname FROM pg_auth_members a
        JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member
        WHERE g.rolname = v_shared[i] AND NOT m.rolname = ANY (v_shared) AND m.rolname <> v_role
        ORDER BY 1
      LOOP
        EXECUTE format('GRANT %I TO %I', v_role, v_member);
        RAISE NOTICE 'idemq: % (a member of the cluster-wide %) is now a member of % in database %; revoke it if it belongs to another database: REVOKE % FROM %',
          v_member, v_shared[i], v_role, current_database(), quote_ident(v_role), quote_ident(v_member);
        privilege := format('MEMBER %s (from %s)', v_member, v_shared[i]);
        RETURN NEXT;
      END LOOP;
    END IF;
  END LOOP;

  IF v_installation.shared_members_pending AND NOT v_may_create THEN
    RAISE NOTICE 'idemq: the roles of this installation (%, %, %, %) need a role with CREATEROLE: run the script of `idemq roles sql` as one; until then the cluster-wide idemq_producer, idemq_worker and idemq_admin keep their privileges here',
      v_installation.producer_role, v_installation.worker_role, v_installation.admin_role, v_installation.viewer_role;
    RETURN;
  END IF;
  UPDATE idemq.installation SET shared_members_pending = false WHERE shared_members_pending;

  -- The cluster-wide roles of 0.1.0 hold nothing here.
  FOREACH v_role IN ARRAY v_shared LOOP
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    EXECUTE format('REVOKE ALL ON SCHEMA idemq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA idemq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA idemq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA idemq FROM %I', v_role);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._grant_roles() IS
  'Create (when it may) and grant this installation''s producer, worker, admin and viewer roles what their kinds say, PUBLIC and the cluster-wide roles of 0.1.0 nothing; returns what it granted.';

-- ---- sql/functions/flow/_key_promote.sql ----
CREATE OR REPLACE FUNCTION idemq._key_promote(keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_keys text[];
  v_picked bigint[];
  v_picked_tasks text[];
  v_picked_queues text[];
  v_moved int;
  v_queues text[];
  -- Without any per_key set (the usual case) K is 1 for every job: no
  -- _per_key call per key.
  v_per_key_set boolean := EXISTS (SELECT FROM idemq.limits l WHERE l.per_key IS NOT NULL);
  -- Without any parent edge (no job enqueued with `after` is waiting), no
  -- probe of job_dependencies per job: two index probes a promoted job less.
  v_parents boolean := EXISTS (SELECT FROM idemq.job_dependencies);
  -- complete_and_take_next's worker: {"worker", "lease", "queues", "tasks"};
  -- NULL (the usual case) promotes every picked job.
  v_hand jsonb := nullif(current_setting('idemq.hand_off', true), '')::jsonb;
  v_worker text;
  v_lease interval;
  v_hand_queues text[];
  v_hand_tasks text[];
  v_scopes_limited boolean;
  v_keys_held boolean;
  v_handed bigint[];
BEGIN
  IF v_hand IS NOT NULL THEN
    v_worker := v_hand->>'worker';
    v_lease := (v_hand->>'lease')::interval;
    v_hand_queues := CASE WHEN jsonb_typeof(v_hand->'queues') = 'array'
                          THEN ARRAY(SELECT jsonb_array_elements_text(v_hand->'queues')) END;
    v_hand_tasks := CASE WHEN jsonb_typeof(v_hand->'tasks') = 'array'
                         THEN ARRAY(SELECT jsonb_array_elements_text(v_hand->'tasks')) END;
    -- One read each of the small tables: while no scope is paused, limited
    -- or held, and no key held, no probe per job.
    v_scopes_limited := EXISTS (SELECT FROM idemq.limits l
                                WHERE l.paused OR l.concurrency IS NOT NULL OR l.rate IS NOT NULL
                                   OR l.held_until > now());
    v_keys_held := EXISTS (SELECT FROM idemq.key_holds h WHERE h.held_until > now());
  END IF;
  PERFORM idemq._key_lock(keys);
  SELECT array_agg(DISTINCT k) INTO v_keys FROM unnest(keys) AS k WHERE k IS NOT NULL;
  LOOP
    -- One statement for every key (a complete_many of 100 jobs of 100 keys
    -- promotes 100 jobs in one UPDATE, one trigger call): per key, its
    -- admitted count, then as many of its best waiting jobs as K leaves
    -- room for. Started after the locks (see Concurrency).
    SELECT array_agg(p.id), array_agg(p.task), array_agg(p.queue) INTO v_picked, v_picked_tasks, v_picked_queues
    FROM unnest(v_keys) AS k(key)
    CROSS JOIN LATERAL (
      SELECT count(*) AS n FROM idemq.jobs h
      WHERE h.concurrency_key = k.key AND h.state IN ('enqueued', 'scheduled', 'processing')) AS a
    CROSS JOIN LATERAL (
      SELECT w.id, w.task, w.queue FROM idemq.jobs w
      WHERE w.concurrency_key = k.key AND w.state = 'awaiting'
        AND (NOT v_parents OR NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = w.id))
      ORDER BY w.priority DESC, w.run_at, w.id
      -- K is 1 unless a per_key is set; then the K of the best waiting job.
      LIMIT greatest(CASE WHEN NOT v_per_key_set THEN 1
                          ELSE (SELECT idemq._per_key(b.queue, b.task) FROM idemq.jobs b
                                WHERE b.concurrency_key = k.key AND b.state = 'awaiting'
                                  AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = b.id)
                                ORDER BY b.priority DESC, b.run_at, b.id
                                LIMIT 1) END - a.n, 0)) AS p;
    EXIT WHEN v_picked IS NULL;
    v_handed := '{}';
    IF v_hand IS NOT NULL THEN
      -- The picked jobs the completing worker's next claim would take,
      -- claimed here (as claim(token => true) claims: attempt, lease, token;
      -- the same columns and values as claim's UPDATE, held equal by
      -- test/sql/predicates.test.ts).
      -- Claim order within the job's (task, queue): the first runnable job
      -- there, one descent of jobs_runnable_by_task_queue, must not come
      -- before it, so a worker handed a key's jobs one after another never
      -- passes over older or higher-priority work of its task and queue.
      -- One descent per (task, queue) of the picked jobs (firsts), not one
      -- per job: the picked jobs of a completion are mostly of one task and
      -- queue, and a descent per job was 6.6% of a keyed completion's
      -- instructions (bench/FINDINGS.md, "The keyed completion's cost").
      -- Read in the UPDATE's own snapshot, as a per-row probe would be. A
      -- job's task and queue never change (no function writes them), so the
      -- picked version's pair is the updated version's.
      WITH firsts AS MATERIALIZED (
        SELECT t.task, t.queue, f.priority, f.run_at, f.id
        FROM (SELECT DISTINCT u.task, u.queue FROM unnest(v_picked_tasks, v_picked_queues) AS u(task, queue)) t
        CROSS JOIN LATERAL (
          SELECT r.priority, r.run_at, r.id FROM idemq.jobs r
          WHERE r.state IN ('enqueued', 'scheduled')
            AND idemq._name_key(r.task) = idemq._name_key(t.task)
            AND idemq._name_key(r.queue) = idemq._name_key(t.queue)
            AND r.task = t.task AND r.queue = t.queue
            AND r.run_at <= now() AND (r.expires_at IS NULL OR r.expires_at > now())
          ORDER BY r.priority DESC, r.run_at, r.id
          LIMIT 1) f
      ), handed AS (
        UPDATE idemq.jobs AS j
        SET state = 'processing', attempt = j.attempt + 1, locked_by = v_worker,
            locked_at = now(), lease_lost = false,
            lease_expires_at = idemq._lease_until(now(), j.timeout, v_lease),
            lease_token = gen_random_uuid(), queue_slot = NULL, task_slot = NULL, progress = NULL
        WHERE j.id = ANY (v_picked) AND j.state = 'awaiting'
          AND (NOT v_parents OR NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id))
          AND j.run_at <= now() AND (j.expires_at IS NULL OR j.expires_at > now())
          AND NOT j.lease_lost
          AND (v_hand_tasks IS NULL OR j.task = ANY (v_hand_tasks))
          AND (v_hand_queues IS NULL OR j.queue = ANY (v_hand_queues))
          AND (NOT v_scopes_limited OR NOT EXISTS (
                 SELECT FROM idemq.limits l
                 WHERE ((l.kind = 'queue' AND l.name = j.queue) OR (l.kind = 'task' AND l.name = j.task))
                   AND (l.paused OR l.concurrency IS NOT NULL OR l.rate IS NOT NULL OR l.held_until > now())))
          AND (NOT v_keys_held OR NOT EXISTS (
                 SELECT FROM idemq.key_holds h WHERE h.concurrency_key = j.concurrency_key AND h.held_until > now()))
          AND NOT EXISTS (
                 SELECT FROM firsts f
                 WHERE f.task = j.task AND f.queue = j.queue
                   AND (f.priority > j.priority OR (f.priority = j.priority AND (f.run_at, f.id) < (j.run_at, j.id))))
        RETURNING j.id
      )
      SELECT coalesce(array_agg(h.id), '{}') INTO v_handed FROM handed h;
      IF cardinality(v_handed) > 0 THEN
        PERFORM set_config('idemq.handed',
          concat_ws(',', nullif(current_setting('idemq.handed', true), ''), array_to_string(v_handed, ',')), true);
      END IF;
    END IF;
    -- Every picked job handed: no promotion statement (it would find no
    -- row, and still run the jobs trigger).
    EXIT WHEN cardinality(v_handed) = cardinality(v_picked);
    -- Re-judged on each row's newest version: a job cancelled or deleted
    -- meanwhile is left alone, and the keys are looked at again.
    WITH moved AS (
      UPDATE idemq.jobs AS j SET state = idemq._initial_state(j.run_at)
      WHERE j.id = ANY (v_picked) AND NOT j.id = ANY (v_handed) AND j.state = 'awaiting'
        AND (NOT v_parents OR NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id))
      RETURNING j.queue, j.state
    )
    SELECT count(*), array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued') INTO v_moved, v_queues
    FROM moved m;
    PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) AS q;
    EXIT WHEN v_moved + cardinality(v_handed) = cardinality(v_picked);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._key_promote(text[]) IS
  'Admit the best waiting jobs of these concurrency keys while fewer than K of each are admitted; called where a key''s place frees or its jobs arrive.';

-- ---- sql/functions/flow/_limit_scope.sql ----
CREATE OR REPLACE FUNCTION idemq._limit_scope(operation text, queue text, task text, OUT kind text, OUT name text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF (_limit_scope.queue IS NULL) = (_limit_scope.task IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: give exactly one of queue and task, not %s', operation,
                       CASE WHEN _limit_scope.queue IS NULL THEN 'neither' ELSE 'both' END),
      HINT = 'A limit or a pause is for one queue (queue => ''emails'') or one task (task => ''send-email''); a job obeys its queue''s and its task''s.';
  END IF;
  IF _limit_scope.queue = '' OR _limit_scope.task = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: the %s name must not be empty', operation, CASE WHEN _limit_scope.queue = '' THEN 'queue' ELSE 'task' END),
      HINT = 'Name the queue or the task as its jobs are enqueued.';
  END IF;
  IF char_length(_limit_scope.queue) > idemq._queue_name_limit() THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: queue is %s characters, over the limit of %s (%s)', operation,
                       char_length(_limit_scope.queue), idemq._queue_name_limit(), idemq._excerpt(_limit_scope.queue)),
      HINT = 'No job can be enqueued in a queue with a longer name.';
  END IF;
  PERFORM idemq._check_size(operation, 'task', _limit_scope.task, 'task_bytes',
    'No job can be enqueued with a longer task name (the limit task_bytes).');
  kind := CASE WHEN _limit_scope.queue IS NULL THEN 'task' ELSE 'queue' END;
  name := coalesce(_limit_scope.queue, _limit_scope.task);
END;
$$;

COMMENT ON FUNCTION idemq._limit_scope(text, text, text) IS
  'The one queue or task a flow-control call names (exactly one, non-empty, within the name limits), as (kind, name).';

-- ---- sql/functions/attempts/_lock_held.sql ----
CREATE OR REPLACE FUNCTION idemq._lock_held(operation text, job_id bigint, attempt int, lease_token uuid,
                                            OUT queue text, OUT created_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  SELECT j.queue, j.created_at INTO _lock_held.queue, _lock_held.created_at
  FROM idemq.jobs j
  WHERE j.id = _lock_held.job_id AND j.attempt = _lock_held.attempt
    AND j.lease_token IS NOT DISTINCT FROM _lock_held.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(_lock_held.job_id, _lock_held.attempt, operation);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._lock_held(text, bigint, int, uuid) IS
  'Lock the job (job_id, attempt, lease_token) holds, or raise IQ410/IQ404: the fencing of the step functions, spawn and wait_for_children.';

-- ---- sql/functions/reads/_oldest_runnable.sql ----
CREATE OR REPLACE FUNCTION idemq._oldest_runnable()
RETURNS TABLE(queue text, task text, oldest_seconds bigint)
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
  -- The index is (_name_key(task), _name_key(queue), priority DESC, run_at,
  -- id) over enqueued and scheduled rows. Each walk names the key and then
  -- the names (a Filter, so names that share a key never mix), as claim()
  -- does. The priorities present are found by a loose scan (the next lower
  -- priority after this one: one descent each); within one priority the
  -- entries are in run_at order, so the first one not past its deadline is
  -- the oldest, and "run_at <= now()" bounds the walk.
  WITH RECURSIVE pairs AS (
    SELECT DISTINCT c.queue, c.task
    FROM idemq._job_counts() c
    WHERE c.state IN ('enqueued', 'scheduled')
  ), levels(queue, task, priority) AS (
    SELECT p.queue, p.task, f.priority
    FROM pairs p
    CROSS JOIN LATERAL (
      SELECT j.priority
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND idemq._name_key(j.task) = idemq._name_key(p.task)
        AND idemq._name_key(j.queue) = idemq._name_key(p.queue)
        AND j.task = p.task AND j.queue = p.queue
      ORDER BY j.priority DESC
      LIMIT 1
    ) f
    UNION ALL
    SELECT l.queue, l.task, f.priority
    FROM levels l
    CROSS JOIN LATERAL (
      SELECT j.priority
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND idemq._name_key(j.task) = idemq._name_key(l.task)
        AND idemq._name_key(j.queue) = idemq._name_key(l.queue)
        AND j.priority < l.priority
        AND j.task = l.task AND j.queue = l.queue
      ORDER BY j.priority DESC
      LIMIT 1
    ) f
  )
  SELECT l.queue, l.task,
         least(floor(extract(epoch FROM now()) - extract(epoch FROM min(o.run_at))),
               9223372036854775807)::bigint
  FROM levels l
  CROSS JOIN LATERAL (
    SELECT j.run_at
    FROM idemq.jobs j
    WHERE j.state IN ('enqueued', 'scheduled')
      AND idemq._name_key(j.task) = idemq._name_key(l.task)
      AND idemq._name_key(j.queue) = idemq._name_key(l.queue)
      AND j.priority = l.priority
      AND j.run_at <= now()
      AND j.task = l.task AND j.queue = l.queue
      AND (j.expires_at IS NULL OR j.expires_at > now())
    ORDER BY j.run_at
    LIMIT 1
  ) o
  GROUP BY l.queue, l.task;
END;

COMMENT ON FUNCTION idemq._oldest_runnable() IS
  'Age in seconds of the oldest runnable job per queue and task, found by index descents (never a scan of the backlog).';

-- ---- sql/functions/enqueue/_payload_problem.sql ----
CREATE OR REPLACE FUNCTION idemq._payload_problem(payload jsonb, payload_bytes bigint)
RETURNS text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_text text := _payload_problem.payload::text;
BEGIN
  RETURN ARRAY[format('payload is %s bytes of JSON text, over the limit of %s bytes (payload_bytes): %s',
                      octet_length(v_text), _payload_problem.payload_bytes, idemq._excerpt(v_text)),
               'Store large data elsewhere (a table, object storage) and put its id in the payload; '
               'an admin can raise payload_bytes in idemq.settings.'];
END;
$$;

COMMENT ON FUNCTION idemq._payload_problem(jsonb, bigint) IS
  'The problem and hint of a payload over payload_bytes, its JSON text printed once.';

-- ---- sql/functions/flow/_stripe_counts.sql ----
CREATE OR REPLACE FUNCTION idemq._stripe_counts(limit_id bigint)
RETURNS TABLE(slot int, n int)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT idemq._stripe_of(CASE WHEN l.kind = 'queue' THEN j.queue_slot ELSE j.task_slot END, l.first_slot),
         count(*)::int
  FROM idemq.limits l
  JOIN idemq.jobs j ON j.state = 'processing' AND CASE WHEN l.kind = 'queue' THEN j.queue ELSE j.task END = l.name
  WHERE l.id = _stripe_counts.limit_id AND l.concurrency IS NOT NULL
  GROUP BY 1;
END;
$$;

COMMENT ON FUNCTION idemq._stripe_counts(bigint) IS
  'The jobs processing in a concurrency limit''s scope, per stripe they are counted in: what held less unfolded releases must equal.';

-- ---- sql/functions/steps/_check_step.sql ----
CREATE OR REPLACE FUNCTION idemq._check_step(operation text, job_id bigint, name text, result jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF _check_step.name IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s: job %s: the step name must not be NULL', operation, _check_step.job_id),
      HINT = 'Name each step of a job once, e.g. ''charge-card''.';
  END IF;
  IF _check_step.name = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: job %s: the step name must not be empty', operation, _check_step.job_id),
      HINT = 'Name each step of a job once, e.g. ''charge-card''.';
  END IF;
  PERFORM idemq._check_size(operation, 'the step name', _check_step.name, 'key_bytes',
                            'Use a shorter step name: it identifies the step within its job.');
  PERFORM idemq._check_result(operation, format('job %s, step "%s": the result', _check_step.job_id, idemq._excerpt(_check_step.name)),
    _check_step.result, 'Keep a step''s result small (ids, amounts, statuses); store bulky data in a table and return its key.');
END;
$$;

COMMENT ON FUNCTION idemq._check_step(text, bigint, text, jsonb) IS
  'Raise 22004/22023 for a bad step name or a step result over _result_limit, naming the job and step.';

-- ---- sql/functions/reads/_count_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq._count_jobs()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_keys text[];
  v_runnable text[];
  v_retried text[];
BEGIN
  -- Flow control: the concurrency slots of attempts that left processing
  -- (or were deleted) are given back in this same statement's transaction,
  -- by whoever moved them: one row appended to idemq.limit_releases per
  -- stripe, with the number of jobs (the next claim to lock the stripe folds
  -- it: _lock_slots). A job's stripe is the one claim() wrote on it
  -- (queue_slot, task_slot); one that names a stripe older than its limit's
  -- first (numbers only grow: idemq.limit_slot_numbers, no cache) or none
  -- was processing when set_limit made the limit, which counted it in
  -- first_slot. Appending takes no lock, so a completion never waits for a
  -- claim or another completion here. Skipped, after one read of the small
  -- idemq.limits, while no scope has a concurrency limit.
  IF TG_OP <> 'INSERT' AND EXISTS (SELECT FROM idemq.limits l WHERE l.slot_rows > 0) THEN
    IF TG_OP = 'UPDATE' THEN
      -- A claim's statement moved no job out of processing: one read of
      -- old_jobs, stopped early. Otherwise, per stripe, the jobs naming it
      -- that were processing before the statement less those processing
      -- after it: what left (a heartbeat's jobs cancel out; a claim's only
      -- come in, and claim() counted them). Planner trap: no join of
      -- old_jobs with new_jobs. A transition table has no statistics, so
      -- the plan (cached for the session) expects one row of each and
      -- nests the loops: EXPLAIN ANALYZE of the join on id under a worker's
      -- complete_many of 500 jobs, Rows Removed by Join Filter: 248502,
      -- 44-107 ms a statement (a worker at a non-binding limit ran at about
      -- half the speed of one without); grouped, as here, each side is read
      -- once.
      IF EXISTS (SELECT FROM old_jobs o WHERE o.state = 'processing') THEN
        INSERT INTO idemq.limit_releases (limit_id, slot, n)
        SELECT l.id, idemq._stripe_of(v.slot, l.first_slot), sum(d.n)
        FROM (SELECT o.queue, o.task, o.queue_slot, o.task_slot, count(*) AS n
              FROM old_jobs o WHERE o.state = 'processing'
              GROUP BY o.queue, o.task, o.queue_slot, o.task_slot
              UNION ALL
              SELECT w.queue, w.task, w.queue_slot, w.task_slot, -count(*)
              FROM new_jobs w WHERE w.state = 'processing'
              GROUP BY w.queue, w.task, w.queue_slot, w.task_slot) d
        CROSS JOIN LATERAL (VALUES ('queue', d.queue, d.queue_slot), ('task', d.task, d.task_slot)) AS v(kind, name, slot)
        JOIN idemq.limits l ON l.kind = v.kind AND l.name = v.name AND l.slot_rows > 0
        GROUP BY 1, 2
        HAVING sum(d.n) > 0;
      END IF;
    ELSIF TG_OP = 'DELETE' THEN
      INSERT INTO idemq.limit_releases (limit_id, slot, n)
      SELECT l.id, idemq._stripe_of(v.slot, l.first_slot), count(*)
      FROM old_jobs o
      CROSS JOIN LATERAL (VALUES ('queue', o.queue, o.queue_slot), ('task', o.task, o.task_slot)) AS v(kind, name, slot)
      JOIN idemq.limits l ON l.kind = v.kind AND l.name = v.name AND l.slot_rows > 0
      WHERE o.state = 'processing'
      GROUP BY 1, 2;
    ELSIF TG_OP = 'TRUNCATE' THEN
      -- No job is left: nothing holds a slot, and a draining limit's debt is
      -- gone with its jobs.
      DELETE FROM idemq.limit_releases;
      UPDATE idemq.limit_slots AS s SET held = 0 WHERE s.held <> 0;
      PERFORM idemq._size_slots(l.id, l.concurrency) FROM idemq.limits l WHERE l.concurrency IS NOT NULL;
    END IF;
  END IF;
  -- Concurrency keys: a job of a key that leaves the admitted states
  -- (finishes, or is deleted) makes room for the key's next waiting job,
  -- in this same transaction (_key_promote, after the key's lock). A
  -- statement without a keyed job on either side pays one probe of each
  -- transition table and nothing more here. The keys of the keyed jobs the statement left
  -- runnable (v_runnable), and of those among them that came out of
  -- processing (v_retried: a retry, snooze, rescue or hold), are for the
  -- held keys below.
  IF TG_OP = 'UPDATE' THEN
    -- No keyed job on either side (most statements): none of the probes
    -- below can find anything, and each costs the executor's set-up of a
    -- query (one probe here instead of three: 6.2% of a one-job claim and
    -- its completion, bench/FINDINGS.md, "The keyed completion's cost").
    IF EXISTS (SELECT FROM new_jobs w WHERE w.concurrency_key IS NOT NULL)
       OR EXISTS (SELECT FROM old_jobs o WHERE o.concurrency_key IS NOT NULL) THEN
      -- Per key, from each side grouped, never joined (the planner trap of the
      -- slots above: a join of the transition tables nests loops), and only
      -- when it can find something: v_keys, the keys with fewer admitted jobs
      -- after the statement than before (only if a keyed job left the
      -- admitted states: a claim's or a promotion's cannot have); v_retried,
      -- the keys with a job processing before and one runnable after.
      IF EXISTS (SELECT FROM new_jobs w
                 WHERE w.concurrency_key IS NOT NULL AND w.state NOT IN ('enqueued', 'scheduled', 'processing'))
         AND EXISTS (SELECT FROM old_jobs o
                     WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing')) THEN
        SELECT array_agg(g.k) INTO v_keys
        FROM (SELECT d.k
              FROM (SELECT o.concurrency_key AS k, count(*) AS n FROM old_jobs o
                    WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing')
                    GROUP BY o.concurrency_key
                    UNION ALL
                    SELECT w.concurrency_key, -count(*) FROM new_jobs w
                    WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled', 'processing')
                    GROUP BY w.concurrency_key) d
              GROUP BY d.k
              HAVING sum(d.n) > 0) g;
      END IF;
      IF EXISTS (SELECT FROM old_jobs o WHERE o.concurrency_key IS NOT NULL AND o.state = 'processing')
         AND EXISTS (SELECT FROM new_jobs w WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled')) THEN
        SELECT array_agg(g.k) INTO v_retried
        FROM (SELECT d.k
              FROM (SELECT DISTINCT o.concurrency_key AS k, 1 AS side FROM old_jobs o
                    WHERE o.concurrency_key IS NOT NULL AND o.state = 'processing'
                    UNION ALL
                    SELECT DISTINCT w.concurrency_key, 2 FROM new_jobs w
                    WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled')) d
              GROUP BY d.k
              HAVING count(*) = 2) g;
      END IF;
      -- The keys of the keyed jobs left runnable, for the held keys below:
      -- all of them while some key is held; otherwise those back from
      -- processing, whose key's lock (below) may wait for a hold in flight,
      -- which this probe, before the lock, cannot see.
      IF EXISTS (SELECT FROM idemq.key_holds h WHERE h.held_until > now()) THEN
        SELECT array_agg(DISTINCT w.concurrency_key) INTO v_runnable
        FROM new_jobs w
        WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled');
      ELSE
        v_runnable := v_retried;
      END IF;
    END IF;
  ELSIF TG_OP = 'INSERT' THEN
    -- Only enqueue's fast path inserts a keyed job runnable, and it holds the
    -- key's lock (_key_admits); without a live key hold, one probe of the
    -- empty idemq.key_holds and no scan of new_jobs.
    IF EXISTS (SELECT FROM idemq.key_holds h WHERE h.held_until > now()) THEN
      SELECT array_agg(DISTINCT w.concurrency_key) INTO v_runnable
      FROM new_jobs w
      WHERE w.concurrency_key IS NOT NULL AND w.state IN ('enqueued', 'scheduled');
    END IF;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(DISTINCT o.concurrency_key) INTO v_keys
    FROM old_jobs o
    WHERE o.concurrency_key IS NOT NULL AND o.state IN ('enqueued', 'scheduled', 'processing');
  END IF;
  -- A job back from processing may be one hold() did not move (it was
  -- processing then): the key's lock, before the probe below, orders this
  -- statement after a hold of its key in flight (hold() writes under it),
  -- or that hold after this one (its own statement then sees this job
  -- runnable and moves it). Every other way in holds the lock already
  -- (enqueue, _key_promote) or the job's row lock, which hold() takes too.
  IF v_retried IS NOT NULL THEN
    IF cardinality(v_retried) = 1 AND v_keys IS NULL THEN
      -- _key_lock's lock for one key, taken here directly (as _key_admits
      -- does: a call, an unnest and a sort less; 4 against 25-40 us).
      PERFORM pg_advisory_xact_lock(1801812339, hashtext(v_retried[1]));
    ELSE
      PERFORM idemq._key_lock(v_retried || v_keys);
    END IF;
  END IF;
  IF v_keys IS NOT NULL THEN
    PERFORM idemq._key_promote(v_keys);
  END IF;
  -- Held keys (hold(..., scope => 'key')): a keyed job this statement left
  -- runnable before its key's hold ends runs at the hold's end instead,
  -- whoever wrote it (an admission, a promotion, a retry, a snooze, a
  -- reschedule, direct SQL). Without a live hold of any key: one probe of
  -- the empty idemq.key_holds (3 us, as the idemq.limits guard above; the
  -- probe by these keys costs 8-20). The UPDATE fires this trigger again,
  -- which finds every job of it at its hold's end already.
  -- v_runnable alone first: a condition with a subquery runs through the
  -- executor, set-up included, even when its first operand is false.
  IF v_runnable IS NULL THEN
    NULL;
  ELSIF EXISTS (SELECT FROM idemq.key_holds h WHERE h.held_until > now())
     AND EXISTS (SELECT FROM idemq.key_holds h WHERE h.concurrency_key = ANY (v_runnable) AND h.held_until > now()) THEN
    UPDATE idemq.jobs AS j SET run_at = h.held_until, state = 'scheduled'
    FROM new_jobs w JOIN idemq.key_holds h ON h.concurrency_key = w.concurrency_key
    WHERE j.id = w.id AND j.state IN ('enqueued', 'scheduled') AND j.run_at < h.held_until
      AND h.held_until > now();
  END IF;
  -- Grouped, so a statement of many jobs (enqueue_many, a claim of 100,
  -- complete_many, apply_retention) appends a row per group, not per job.
  IF TG_OP = 'UPDATE' THEN
    INSERT INTO idemq.job_counts (queue, task, state, n)
    SELECT d.queue, d.task, d.state, sum(d.n)
    FROM (SELECT o.queue, o.task, o.state, -1 AS n FROM old_jobs o
          UNION ALL
          SELECT w.queue, w.task, w.state, 1 FROM new_jobs w) d
    GROUP BY d.queue, d.task, d.state
    HAVING sum(d.n) <> 0;
  ELSIF TG_OP = 'INSERT' THEN
    INSERT INTO idemq.job_counts (queue, task, state, n)
    SELECT w.queue, w.task, w.state, count(*)
    FROM new_jobs w
    GROUP BY w.queue, w.task, w.state;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO idemq.job_counts (queue, task, state, n)
    SELECT o.queue, o.task, o.state, -count(*)
    FROM old_jobs o
    GROUP BY o.queue, o.task, o.state;
  ELSE
    -- TRUNCATE: no job is left in any state.
    DELETE FROM idemq.job_counts;
  END IF;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._count_jobs() IS
  'Trigger on idemq.jobs (per statement): appends the change of each (queue, task, state) count to idemq.job_counts.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._insert_jobs;
-- ---- sql/functions/enqueue/_insert_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq._insert_jobs(jobs idemq._planned_job[], keyed boolean, parents boolean,
                                              as_children boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the jobs array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_notified bigint;
BEGIN
  WITH ins AS (
    INSERT INTO idemq.jobs AS j (id, task, queue, payload, state, priority, run_at, max_attempts,
                                 idempotency_key, backoff, expires_at, traceparent, concurrency_key, timeout,
                                 has_children)
    SELECT p.job_id, p.task, p.queue, p.payload,
           CASE WHEN parents AND p.after IS NOT NULL AND EXISTS (
                  SELECT 1 FROM idemq.jobs pj WHERE pj.id = ANY (p.after) AND pj.state <> 'succeeded')
                THEN 'awaiting'::idemq.job_state
                WHEN p.concurrency_key IS NOT NULL THEN 'awaiting'::idemq.job_state
                ELSE idemq._initial_state(p.run_at) END,
           p.priority, p.run_at, p.max_attempts, p.idempotency_key, p.backoff, p.expires_at, p.traceparent,
           p.concurrency_key, p.timeout, _insert_jobs.as_children
    FROM unnest(jobs) p
    WHERE p.outcome = 'created'
    RETURNING j.queue, j.state
  )
  SELECT count(idemq._notify_waiting(q.queue)) INTO v_notified
  FROM (SELECT DISTINCT i.queue FROM ins i WHERE i.state = 'enqueued') q;

  IF keyed THEN
    INSERT INTO idemq.counters AS c (task, event, n)
    SELECT p.task, p.outcome, count(*)
    FROM unnest(jobs) p
    WHERE p.outcome <> 'created'
    GROUP BY 1, 2;
  END IF;

  IF parents THEN
    INSERT INTO idemq.job_dependencies (parent_id, child_id)
    SELECT DISTINCT pj.id, p.job_id
    FROM unnest(jobs) p
    JOIN idemq.jobs pj ON pj.id = ANY (p.after)
    WHERE p.outcome = 'created' AND pj.state <> 'succeeded'
      AND NOT EXISTS (SELECT 1 FROM idemq.jobs u
                      WHERE u.id = ANY (p.after) AND u.state = ANY (idemq._unsuccessful_states()));

    UPDATE idemq.jobs AS j
    SET state = 'cancelled', finished_at = now(),
        errors = j.errors || jsonb_build_array(jsonb_build_object(
          'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
          'message', format('parent job %s ended %s before this job could run', f.parent_id, f.parent_state)))
    FROM (SELECT DISTINCT ON (p.job_id) p.job_id, pj.id AS parent_id, pj.state AS parent_state
          FROM unnest(jobs) p
          JOIN idemq.jobs pj ON pj.id = ANY (p.after)
          WHERE p.outcome = 'created' AND pj.state = ANY (idemq._unsuccessful_states())
          ORDER BY p.job_id, pj.id) f
    WHERE j.id = f.job_id;
  END IF;
  -- Concurrency keys: the new jobs of each key wait; admit what fits. After the
  -- continuations: a child waiting for parents has its job_dependencies rows
  -- by now, and _key_promote leaves it alone.
  IF EXISTS (SELECT FROM unnest(jobs) p WHERE p.outcome = 'created' AND p.concurrency_key IS NOT NULL) THEN
    PERFORM idemq._key_promote(ARRAY(SELECT p.concurrency_key FROM unnest(jobs) p
                                     WHERE p.outcome = 'created' AND p.concurrency_key IS NOT NULL));
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._insert_jobs(idemq._planned_job[], boolean, boolean, boolean) IS
  'Write a plan''s created jobs (state, continuations), count the other outcomes, and notify waiting consumers.';

-- ---- sql/functions/enqueue/_job_problem.sql ----
CREATE OR REPLACE FUNCTION idemq._job_problem(job idemq._planned_job, limits idemq._enqueue_limits)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE idemq._job_rule_broken(job, limits)
  WHEN 1 THEN
    ARRAY['task must be a non-empty string: the name of a task your workers handle', NULL]
  WHEN 2 THEN
    ARRAY[format('task is %s bytes, over the limit of %s bytes (task_bytes): %s',
                 octet_length(job.task), limits.task_bytes, idemq._excerpt(job.task)),
          'Name tasks briefly, e.g. ''send_email''; an admin can raise task_bytes in idemq.settings.']
  WHEN 3 THEN
    ARRAY[format('payload must be a JSON object, not %s', idemq._excerpt(coalesce(job.payload::text, 'NULL'))),
          'Wrap the value in an object, e.g. {"value": ...}.']
  WHEN 4 THEN
    idemq._payload_problem(job.payload, limits.payload_bytes)
  WHEN 5 THEN
    ARRAY['queue must be a non-empty string', 'Leave queue out for the default queue.']
  WHEN 6 THEN
    ARRAY[format('queue must be at most %s characters, not %s: %s', idemq._queue_name_limit(), length(job.queue),
                 idemq._excerpt(job.queue)),
          'Use a short queue name: it travels as the NOTIFY payload.']
  WHEN 7 THEN
    ARRAY[format('run_at must be a finite time, not %s', job.run_at),
          'Pass a real time, e.g. now() + interval ''1 hour'', or leave run_at out to run at once.']
  WHEN 8 THEN
    ARRAY[format('max_attempts must be at least 1, not %s', job.max_attempts), NULL]
  WHEN 9 THEN
    ARRAY['idempotency_key must be a non-empty string or null', NULL]
  WHEN 10 THEN
    ARRAY[format('idempotency_key is %s bytes, over the limit of %s bytes (key_bytes): %s',
                 octet_length(job.idempotency_key), limits.key_bytes, idemq._excerpt(job.idempotency_key)),
          'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''order:'' || md5(...).']
  WHEN 11 THEN
    ARRAY[format('after names %s parents, over the limit of %s (parents_per_job)', cardinality(job.after),
                 limits.parents_per_job),
          'Wait for fewer jobs: chain through an intermediate job that waits for a part of them; '
          'an admin can raise parents_per_job in idemq.settings.']
  WHEN 12 THEN
    ARRAY[format('after must be an array of job ids, not %s', idemq._excerpt(job.after::text)), NULL]
  WHEN 13 THEN
    ARRAY[format('key_retention must not be negative, not %s', job.key_retention),
          'key_retention is how long a finished job''s key stays held, e.g. ''14 days''.']
  WHEN 14 THEN
    ARRAY[format('key_retention must be at most %s days (duration_days), not %s', limits.duration_days, job.key_retention),
          format('Use a retention of at most %s days (duration_days in idemq.settings).', limits.duration_days)]
  WHEN 15 THEN
    ARRAY[format('traceparent must be a W3C traceparent (00-<32 hex digits>-<16 hex digits>-<2 hex digits>, '
                 'lower case, ids not all zeros), not %s', idemq._excerpt(job.traceparent)),
          'Pass the traceparent of the producer''s span as OpenTelemetry formats it, '
          'e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01, or leave traceparent out.']
  WHEN 16 THEN
    ARRAY['concurrency_key must be a non-empty string or null',
          'Name what must not run twice at once, e.g. ''customer:42'', or leave concurrency_key out.']
  WHEN 17 THEN
    ARRAY[format('concurrency_key is %s bytes, over the limit of %s bytes (key_bytes): %s',
                 octet_length(job.concurrency_key), limits.key_bytes, idemq._excerpt(job.concurrency_key)),
          'Keys are at most key_bytes bytes (idemq.settings): hash a long business key, e.g. ''customer:'' || md5(...).']
  WHEN 18 THEN
    ARRAY[format('timeout must be more than 0, not %s', job.timeout),
          'timeout is how long one attempt may run, e.g. ''30 seconds''; leave it out for no limit.']
  WHEN 19 THEN
    ARRAY[format('timeout must be at most %s days (duration_days), not %s', limits.duration_days, job.timeout),
          format('Use a time limit of at most %s days (duration_days in idemq.settings), or none.', limits.duration_days)]
END;

COMMENT ON FUNCTION idemq._job_problem(idemq._planned_job, idemq._enqueue_limits) IS
  'What is wrong with one job to enqueue, and the fix (NULL: nothing): the value rules of enqueue and enqueue_many, once.';

-- ---- sql/functions/flow/_key_admits.sql ----
CREATE OR REPLACE FUNCTION idemq._key_admits(key text, queue text, task text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_limit int;
BEGIN
  -- _key_lock's lock for one key, taken here directly (a call less per enqueue).
  PERFORM pg_advisory_xact_lock(1801812339, hashtext(_key_admits.key));
  v_limit := idemq._per_key(_key_admits.queue, _key_admits.task);
  IF (SELECT count(*) FROM idemq.jobs h
      WHERE h.concurrency_key = _key_admits.key AND h.state IN ('enqueued', 'scheduled', 'processing')) >= v_limit THEN
    RETURN false;
  END IF;
  IF EXISTS (SELECT FROM idemq.jobs w
             WHERE w.concurrency_key = _key_admits.key AND w.state = 'awaiting'
               AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = w.id)) THEN
    PERFORM idemq._key_promote(ARRAY[_key_admits.key]);
    RETURN (SELECT count(*) FROM idemq.jobs h
            WHERE h.concurrency_key = _key_admits.key AND h.state IN ('enqueued', 'scheduled', 'processing')) < v_limit
       AND NOT EXISTS (SELECT FROM idemq.jobs w
                       WHERE w.concurrency_key = _key_admits.key AND w.state = 'awaiting'
                         AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = w.id));
  END IF;
  RETURN true;
END;
$$;

COMMENT ON FUNCTION idemq._key_admits(text, text, text) IS
  'Lock a concurrency key and say whether a new job of it is admitted at once (fewer than K admitted, none waiting).';

-- ---- sql/functions/search/_matching_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq._matching_jobs(operation text, filter jsonb, states idemq.job_state[],
                                                before_id bigint, max_rows int)
RETURNS SETOF bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
-- Planner trap: one static statement serves every filter, each unset field
-- an `x IS NULL OR ...` term. A generic plan cannot drop those terms and
-- plans for every field at once (a scan); a custom plan is made with the
-- values, folds the unset terms away and picks the index of the fields set.
-- A search is an operator's, never a hot path: planning each call is cheap.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_states idemq.job_state[];
  v_error text;
  v_created_after timestamptz;
  v_created_before timestamptz;
  v_finished_after timestamptz;
  v_finished_before timestamptz;
  v_unordered boolean;
  -- The pass: its id range [v_from, v_below) and how many it may still return.
  v_from bigint;
  v_below bigint := _matching_jobs.before_id;
  v_left int := _matching_jobs.max_rows;
  v_found int;
BEGIN
  PERFORM idemq._check_job_filter(operation, filter);
  v_created_after := (filter->>'created_after')::timestamptz;
  v_created_before := (filter->>'created_before')::timestamptz;
  v_finished_after := (filter->>'finished_after')::timestamptz;
  v_finished_before := (filter->>'finished_before')::timestamptz;
  IF filter ? 'ids' THEN
    v_ids := ARRAY(SELECT (e #>> '{}')::bigint FROM jsonb_array_elements(filter->'ids') AS e);
  END IF;
  IF filter ? 'state' THEN
    v_states := ARRAY(SELECT (e #>> '{}')::idemq.job_state FROM jsonb_array_elements(filter->'state') AS e);
  END IF;
  IF _matching_jobs.states IS NOT NULL THEN
    v_states := ARRAY(SELECT s FROM unnest(coalesce(v_states, _matching_jobs.states)) AS s
                      WHERE s = ANY (_matching_jobs.states));
  END IF;
  v_error := lower(filter->>'error');
  v_unordered := filter ? 'created_before'
                 OR (coalesce(v_states <@ idemq.terminal_states(), false)
                     AND (filter ? 'finished_after' OR filter ? 'finished_before'));

  -- Planner trap: a search whose matches are rare or none (a key, a task
  -- matching nothing, a payload) walked the primary key newest first to the
  -- end of the table, testing each row in its heap order (task + payload
  -- matching nothing: 288-449 ms at 1,000,000 jobs), where a parallel scan
  -- keeping the newest reads it in 150-190. Common matches are found at the
  -- top of the walk (2-10 ms). So an ordered search runs in two passes: the
  -- walk over the newest _search_walk() ids, then, if the page is not full,
  -- the rest unordered (scanned and the newest kept). The passes' id ranges
  -- are disjoint and in order, so their rows come out newest first.
  IF NOT v_unordered AND v_ids IS NULL THEN
    v_from := coalesce(v_below, (SELECT max(j.id) + 1 FROM idemq.jobs j)) - idemq._search_walk();
  END IF;

  LOOP
  RETURN QUERY
  SELECT j.id
  FROM idemq.jobs j
  WHERE (v_ids IS NULL OR j.id = ANY (v_ids))
    AND (v_states IS NULL OR j.state = ANY (v_states))
    -- Finished states only: say finished_at is set, so jobs_by_finish serves them.
    AND (NOT coalesce(v_states <@ idemq.terminal_states(), false) OR j.finished_at IS NOT NULL)
    AND (filter->>'task' IS NULL OR j.task = filter->>'task')
    AND (filter->>'queue' IS NULL OR j.queue = filter->>'queue')
    AND (filter->>'key' IS NULL OR j.idempotency_key = filter->>'key')
    AND (filter->>'concurrency_key' IS NULL OR j.concurrency_key = filter->>'concurrency_key')
    -- Planner trap: text -> timestamptz is a stable cast, never folded into
    -- a constant, so `(filter->>'created_before')::timestamptz` in the query
    -- parsed the text again for every row scanned (created_before 6 days
    -- back: 545 ms against 155, at 1,000,000 jobs); the locals are parsed once.
    AND (v_created_after IS NULL OR j.created_at >= v_created_after)
    AND (v_created_before IS NULL OR j.created_at < v_created_before)
    AND (v_finished_after IS NULL OR j.finished_at >= v_finished_after)
    AND (v_finished_before IS NULL OR j.finished_at < v_finished_before)
    -- `errors <> '[]'` is the predicate of jobs_with_errors.
    AND (v_error IS NULL OR (j.errors <> '[]'::jsonb
         AND strpos(lower(concat_ws(': ', j.errors->-1->>'class', j.errors->-1->>'message')), v_error) > 0))
    -- Planner trap: at one operator's cost each, the plan tested @> before
    -- `task =` on every row (865 ms against 494 for the task alone, at
    -- 1,000,000 jobs under load); as a CASE the match costs more, so the
    -- task's test runs first and @> only on that task's jobs.
    AND (filter->'payload' IS NULL
         OR CASE WHEN filter->>'task' IS NULL OR j.task = filter->>'task'
                 THEN j.payload @> (filter->'payload') ELSE false END)
    AND (v_below IS NULL OR j.id < v_below)
    AND (v_from IS NULL OR j.id >= v_from)
  -- Planner trap: created_at and finished_at grow with id, which the
  -- planner does not know; walking the primary key for old jobs read
  -- 778,000 rows to find 51 (finished_before: 549 ms; created_before 6 days
  -- back: 2.1 s). With a finished range (and terminal states) or a
  -- created_before, j.id + 0 takes the index order away: the range is read
  -- from jobs_by_finish and sorted (17-22 ms), or the table is scanned in
  -- parallel and the newest kept (created_before: no index serves it). A
  -- custom plan folds the CASE to one of its arms.
  ORDER BY CASE WHEN v_unordered THEN j.id + 0 ELSE j.id END DESC
  LIMIT v_left;
  GET DIAGNOSTICS v_found = ROW_COUNT;
  v_left := v_left - v_found;
  EXIT WHEN v_from IS NULL OR v_left = 0;
  -- The second pass: below the walk, unordered.
  v_below := v_from;
  v_from := NULL;
  v_unordered := true;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._matching_jobs(text, jsonb, idemq.job_state[], bigint, int) IS
  'The ids of the jobs a filter matches (checked first), newest first, below before_id, at most max_rows.';

-- ---- sql/functions/children/_release_waiting.sql ----
CREATE OR REPLACE FUNCTION idemq._release_waiting(job_id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_moved record;
  v_key text;
BEGIN
  DELETE FROM idemq.job_dependencies AS d
  WHERE d.parent_id = _release_waiting.job_id AND d.child_id = _release_waiting.job_id;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  UPDATE idemq.jobs AS j
  SET state = idemq._initial_state(j.run_at)
  WHERE j.id = _release_waiting.job_id AND j.state = 'awaiting' AND j.concurrency_key IS NULL
    AND NOT EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id)
  RETURNING j.queue, j.state INTO v_moved;
  IF FOUND THEN
    IF v_moved.state = 'enqueued' THEN
      PERFORM idemq._notify_waiting(v_moved.queue);
    END IF;
    RETURN;
  END IF;
  SELECT j.concurrency_key INTO v_key
  FROM idemq.jobs j
  WHERE j.id = _release_waiting.job_id AND j.state = 'awaiting' AND j.concurrency_key IS NOT NULL;
  IF v_key IS NOT NULL THEN
    PERFORM idemq._key_promote(ARRAY[v_key]);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._release_waiting(bigint) IS
  'End a parked job''s wait for its children: remove its gate and make it runnable (or let its concurrency key admit it).';

-- ---- sql/functions/flow/_repair_slots.sql ----
CREATE OR REPLACE FUNCTION idemq._repair_slots(batch_size int)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_off bigint[];
  v_id bigint;
  v_concurrency int;
  v_stripes int;
  v_locked int;
  v_before int;
  v_after int;
  v_freed int := 0;
BEGIN
  DELETE FROM idemq.limit_releases r
  WHERE NOT EXISTS (SELECT FROM idemq.limit_slots s WHERE s.limit_id = r.limit_id AND s.slot = r.slot);

  WITH lim AS (
    SELECT l.id FROM idemq.limits l WHERE l.concurrency IS NOT NULL
  ),
  running AS (
    SELECT lim.id, c.slot, c.n FROM lim CROSS JOIN LATERAL idemq._stripe_counts(lim.id) c
  ),
  kept AS (
    SELECT s.limit_id AS id, s.slot,
           s.held - coalesce((SELECT sum(r.n) FROM idemq.limit_releases r
                              WHERE r.limit_id = s.limit_id AND r.slot = s.slot), 0)::int AS n
    FROM idemq.limit_slots s JOIN lim ON lim.id = s.limit_id
  )
  SELECT array_agg(DISTINCT coalesce(k.id, r.id)) INTO v_off
  FROM kept k FULL JOIN running r ON r.id = k.id AND r.slot = k.slot
  WHERE coalesce(k.n, 0) <> coalesce(r.n, 0);
  IF v_off IS NULL THEN
    RETURN 0;
  END IF;

  FOREACH v_id IN ARRAY v_off[1:batch_size] LOOP
    SELECT count(*)::int INTO v_stripes FROM idemq.limit_slots s WHERE s.limit_id = v_id;
    SELECT count(*)::int INTO v_locked
    FROM (SELECT FROM idemq.limit_slots s WHERE s.limit_id = v_id ORDER BY s.slot FOR UPDATE SKIP LOCKED) x;
    CONTINUE WHEN v_locked < v_stripes;
    SELECT l.concurrency INTO v_concurrency FROM idemq.limits l WHERE l.id = v_id;
    CONTINUE WHEN v_concurrency IS NULL;
    SELECT (SELECT coalesce(sum(s.held), 0) FROM idemq.limit_slots s WHERE s.limit_id = v_id)
           - (SELECT coalesce(sum(r.n), 0) FROM idemq.limit_releases r WHERE r.limit_id = v_id)
    INTO v_before;
    -- One statement, one snapshot: the releases deleted are those of the
    -- jobs this count no longer sees processing (a data-modifying WITH runs
    -- whether or not it is read).
    WITH gone AS (
      DELETE FROM idemq.limit_releases r WHERE r.limit_id = v_id RETURNING r.n
    )
    UPDATE idemq.limit_slots AS s
    SET held = coalesce((SELECT c.n FROM idemq._stripe_counts(v_id) c WHERE c.slot = s.slot), 0)
    WHERE s.limit_id = v_id;
    PERFORM idemq._size_slots(v_id, v_concurrency);
    SELECT coalesce(sum(s.held), 0)::int INTO v_after FROM idemq.limit_slots s WHERE s.limit_id = v_id;
    v_freed := v_freed + greatest(v_before - v_after, 0);
  END LOOP;
  RETURN v_freed;
END;
$$;

COMMENT ON FUNCTION idemq._repair_slots(int) IS
  'Correct the slot counts of at most batch_size concurrency limits that disagree with the jobs processing (a write the jobs trigger missed); called by apply_retention.';

-- ---- sql/functions/admin/_bulk_batch.sql ----
CREATE OR REPLACE FUNCTION idemq._bulk_batch(operation text, filter jsonb, action text, before_id bigint, max_jobs int)
RETURNS TABLE(job_ids bigint[], more boolean, next_before_id bigint, batch int)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_states idemq.job_state[];
  v_ids bigint[];
BEGIN
  IF max_jobs IS NULL OR max_jobs NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN max_jobs IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('%s: max_jobs must be between 1 and 10000, not %s', operation, coalesce(max_jobs::text, 'NULL')),
      HINT = 'Act in batches of a few thousand at most: call again with before_id => next_before_id while more is true.';
  END IF;
  v_states := idemq._action_states(operation, action);
  v_ids := ARRAY(SELECT m.id FROM idemq._matching_jobs(operation, filter, v_states, before_id, max_jobs + 1) AS m(id));
  more := cardinality(v_ids) > max_jobs;
  IF more THEN
    v_ids := v_ids[1:max_jobs];
    next_before_id := v_ids[max_jobs];
  END IF;
  batch := cardinality(v_ids);
  IF action = 'retry' THEN
    -- A concurrency key never changes: read it unlocked, lock the keys first.
    PERFORM idemq._key_lock(ARRAY(SELECT j.concurrency_key FROM idemq.jobs j WHERE j.id = ANY (v_ids)));
  END IF;
  IF action = 'delete' THEN
    job_ids := ARRAY(SELECT j.id FROM idemq.jobs j
                     WHERE j.id = ANY (v_ids) AND j.state = ANY (v_states)
                     ORDER BY j.id DESC FOR UPDATE SKIP LOCKED);
  ELSE
    job_ids := ARRAY(SELECT j.id FROM idemq.jobs j
                     WHERE j.id = ANY (v_ids) AND j.state = ANY (v_states)
                     ORDER BY j.id DESC FOR NO KEY UPDATE SKIP LOCKED);
  END IF;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq._bulk_batch(text, jsonb, text, bigint, int) IS
  'One batch of a bulk action: the matching jobs in the action''s states, locked SKIP LOCKED, and where the next batch starts.';

-- ---- sql/functions/children/_child_finished.sql ----
CREATE OR REPLACE FUNCTION idemq._child_finished(child_id bigint, state idemq.job_state, result jsonb, errors jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_parent bigint;
  v_wait record;
  v_failed int := CASE WHEN _child_finished.state = 'succeeded' THEN 0 ELSE 1 END;
BEGIN
  FOR v_parent IN
    UPDATE idemq.job_children AS c
    SET state = _child_finished.state, finished_at = now(),
        result = CASE WHEN _child_finished.state = 'succeeded' THEN _child_finished.result END,
        last_error = CASE WHEN _child_finished.state <> 'succeeded' THEN _child_finished.errors -> -1 END
    WHERE c.child_id = _child_finished.child_id AND c.state IS NULL
    RETURNING c.parent_id
  LOOP
    UPDATE idemq.child_waits AS w
    SET pending = w.pending - 1, failed = w.failed + v_failed
    WHERE w.parent_id = v_parent
    RETURNING w.pending, w.failed, w.fail_fast INTO v_wait;
    IF FOUND AND (v_wait.pending = 0 OR (v_wait.fail_fast AND v_failed = 1)) THEN
      PERFORM idemq._release_waiting(v_parent);
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._child_finished(bigint, idemq.job_state, jsonb, jsonb) IS
  'Trigger helper: record a finished child''s outcome in its links, count it, and release a parent whose wait it ends.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq._enqueue_planned;
-- ---- sql/functions/enqueue/_enqueue_planned.sql ----
CREATE OR REPLACE FUNCTION idemq._enqueue_planned(jobs idemq._planned_job[], keyed boolean, parents boolean,
                                                  as_children boolean DEFAULT false)
RETURNS idemq._planned_job[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans: with a custom plan (the first five calls of a session, and
-- after them whenever its estimate wins) each statement that reads the
-- jobs array took the whole array into its plan as a constant, copied it
-- and planned around it at every call, a cost per job of the array
-- (measured: bench/FINDINGS.md, "Why the SQL is written as it is").
-- enqueue_many, _parse_jobs and _insert_jobs are set the same way, for the
-- same reason.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_planned idemq._planned_job[] := CASE WHEN keyed THEN idemq._resolve_keys(jobs) ELSE jobs END;
BEGIN
  IF parents THEN
    PERFORM idemq._lock_parents(v_planned);
  END IF;
  PERFORM idemq._insert_jobs(v_planned, keyed, parents, _enqueue_planned.as_children);
  RETURN v_planned;
END;
$$;

COMMENT ON FUNCTION idemq._enqueue_planned(idemq._planned_job[], boolean, boolean, boolean) IS
  'Resolve keys, lock parents and insert a checked plan of jobs: the pipeline enqueue and enqueue_many share.';

-- ---- sql/functions/enqueue/_parse_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq._parse_jobs(jobs jsonb, OUT planned idemq._planned_job[], OUT keyed boolean,
                                             OUT parents boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Generic plans, so the jobs array stays a parameter: see _enqueue_planned.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_fields text[] := idemq._enqueue_fields();
  v_policies text[] := enum_range(NULL::idemq.duplicate_policy)::text[];
  v_now timestamptz := now();
  -- The defaults, typed once: read per element (v_defaults->>'priority', then
  -- numeric_in and enum_in for each element without the field) they cost
  -- about 8 ms per 20,000 elements (backend CPU, enqueue.bulk's batch).
  v_payload jsonb := idemq._job_defaults()->'payload';
  v_queue text := idemq._job_defaults()->>'queue';
  v_priority int := (idemq._job_defaults()->>'priority')::int;
  v_max_attempts int := (idemq._job_defaults()->>'max_attempts')::int;
  v_policy idemq.duplicate_policy := (idemq._job_defaults()->>'duplicate_policy')::idemq.duplicate_policy;
  v_key_retention interval := (idemq._job_defaults()->>'key_retention')::interval;
  v_bad int;
  v_problem text;
  v_ord int;
  v_value_problem text[];
  v_hint text;
  v_limits idemq._enqueue_limits;
  v_bad_backoffs jsonb[];
  v_elem jsonb;
  v_jobs jsonb := jobs;
  v_oversized int[] := '{}';
BEGIN
  IF jobs IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'jobs must not be NULL',
      HINT = 'Pass a JSON array of job objects, e.g. [{"task": "send_email"}].';
  END IF;
  IF jsonb_typeof(jobs) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('jobs must be a JSON array of job objects, not %s', jsonb_typeof(jobs)),
      HINT = 'Pass jsonb like [{"task": "send_email", "payload": {"to": "a@example.com"}}].';
  END IF;
  SELECT * INTO v_limits FROM idemq._enqueue_limits();
  IF jsonb_array_length(jobs) > v_limits.jobs_per_call THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('jobs has %s elements, over the limit of %s jobs per call (jobs_per_call)',
                       jsonb_array_length(jobs), v_limits.jobs_per_call),
      HINT = format('Split the batch into calls of at most %s jobs (one transaction can hold several calls); '
                    'an admin can raise jobs_per_call in idemq.settings. Nothing was enqueued.', v_limits.jobs_per_call);
  END IF;

  -- Payloads surely over payload_bytes, by their stored size (rule 4 of
  -- _job_rule_broken: over 16 x payload_bytes + 8 bytes), are found before
  -- the decoding and decoded as {}: the decoding copies every element into
  -- two tuplestores (spilled to temporary files past work_mem) and every row
  -- into an array, which for one element of 100 MB cost about 2 s. Looked
  -- for only when the whole array is that big; an object stays an object, so
  -- the rules before rule 4 judge the element as they would the real one.
  -- v_jobs is what is decoded; the value rules below report rule 4 for the
  -- elements in v_oversized, worded from the real payload.
  IF pg_column_size(jobs) > 16 * v_limits.payload_bytes + 8 THEN
    -- Each element read once (OFFSET 0: not pulled up, so not read per use),
    -- its payload only when the element itself is over the bound.
    SELECT coalesce(array_agg(e.i + 1 ORDER BY e.i), '{}') INTO v_oversized
    FROM generate_series(0, jsonb_array_length(jobs) - 1) AS e(i)
    CROSS JOIN LATERAL (SELECT jobs -> e.i AS element OFFSET 0) x
    WHERE pg_column_size(x.element) > 16 * v_limits.payload_bytes + 8
      AND jsonb_typeof(x.element -> 'payload') = 'object'
      AND pg_column_size(x.element -> 'payload') > 16 * v_limits.payload_bytes + 8;
    FOREACH v_ord IN ARRAY v_oversized LOOP
      v_jobs := jsonb_set(v_jobs, ARRAY[(v_ord - 1)::text, 'payload'], '{}');
    END LOOP;
  END IF;

  BEGIN
    -- One pass in C (jsonb_to_recordset, every field as text or jsonb, which
    -- any JSON value converts to) and cheap checks that skip absent fields.
    -- OFFSET 0 keeps the subquery `d` from being pulled up: pulled up, the
    -- checks would run once per use of `shape` (three). A MATERIALIZED CTE
    -- did the same but copied every decoded row into a tuplestore first:
    -- 10 ms more per 20,000 elements (backend CPU, 46 against 36 ms).
    -- In element order (the subquery scan keeps its input's order): ids are
    -- taken in that order, and the array needs no sort.
    SELECT array_agg(CASE WHEN d.shape IS NULL THEN ROW(
               d.ord, nextval('idemq.jobs_id_seq'), 'created', NULL,
               d.task,
               coalesce(nullif(d.payload, 'null'), v_payload),
               coalesce(d.queue, v_queue),
               coalesce(d.run_at::timestamptz, v_now),
               coalesce(d.priority::numeric::int, v_priority),
               coalesce(d.max_attempts::numeric::int, v_max_attempts),
               d.idempotency_key,
               coalesce(d.duplicate_policy::idemq.duplicate_policy, v_policy),
               nullif(d.backoff, 'null'),
               d.expires_at::timestamptz,
               CASE WHEN jsonb_typeof(d.after) = 'array' AND jsonb_array_length(d.after) > 0
                    THEN ARRAY(SELECT a::numeric::bigint FROM jsonb_array_elements_text(d.after) a) END,
               coalesce(d.key_retention::interval, v_key_retention),
               d.traceparent,
               d.concurrency_key,
               d.timeout::interval
             )::idemq._planned_job END),
           coalesce(bool_or(d.idempotency_key IS NOT NULL), false),
           coalesce(bool_or(jsonb_typeof(d.after) = 'array' AND jsonb_array_length(d.after) > 0), false),
           min(d.ord) FILTER (WHERE d.shape IS NOT NULL),
           (array_agg(d.shape ORDER BY d.ord) FILTER (WHERE d.shape IS NOT NULL))[1]
    FROM (SELECT r.*, CASE
          WHEN r.v - v_fields <> '{}' THEN
            format('has an unknown field "%s" (fields: %s)',
                   idemq._excerpt((SELECT min(f) FROM jsonb_object_keys(r.v - v_fields) f)), array_to_string(v_fields, ', '))
          WHEN r.task IS NOT NULL AND jsonb_typeof(r.v->'task') <> 'string' THEN
            format('task must be a string, not %s', idemq._excerpt((r.v->'task')::text))
          WHEN r.queue IS NOT NULL AND jsonb_typeof(r.v->'queue') <> 'string' THEN
            format('queue must be a string, not %s', idemq._excerpt((r.v->'queue')::text))
          WHEN r.run_at IS NOT NULL AND jsonb_typeof(r.v->'run_at') <> 'string' THEN
            format('run_at must be a timestamp string, not %s', idemq._excerpt((r.v->'run_at')::text))
          WHEN r.expires_at IS NOT NULL AND jsonb_typeof(r.v->'expires_at') <> 'string' THEN
            format('expires_at must be a timestamp string, not %s', idemq._excerpt((r.v->'expires_at')::text))
          WHEN r.priority IS NOT NULL AND (jsonb_typeof(r.v->'priority') <> 'number'
               OR r.priority::numeric NOT BETWEEN -2147483648 AND 2147483647
               OR r.priority::numeric <> trunc(r.priority::numeric)) THEN
            format('priority must be a whole number (higher runs first), not %s', idemq._excerpt((r.v->'priority')::text))
          WHEN r.max_attempts IS NOT NULL AND (jsonb_typeof(r.v->'max_attempts') <> 'number'
               OR r.max_attempts::numeric NOT BETWEEN -2147483648 AND 2147483647
               OR r.max_attempts::numeric <> trunc(r.max_attempts::numeric)) THEN
            format('max_attempts must be a whole number >= 1, not %s', idemq._excerpt((r.v->'max_attempts')::text))
          WHEN r.idempotency_key IS NOT NULL AND jsonb_typeof(r.v->'idempotency_key') <> 'string' THEN
            format('idempotency_key must be a string or null, not %s', idemq._excerpt((r.v->'idempotency_key')::text))
          WHEN r.duplicate_policy IS NOT NULL AND (jsonb_typeof(r.v->'duplicate_policy') <> 'string'
               OR r.duplicate_policy <> ALL (v_policies)) THEN
            format('duplicate_policy must be one of %s, not %s', array_to_string(v_policies, ', '),
                   idemq._excerpt((r.v->'duplicate_policy')::text))
          WHEN r.after IS NOT NULL AND jsonb_typeof(r.after) <> 'null' AND (jsonb_typeof(r.after) <> 'array'
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(r.after) a
                          WHERE jsonb_typeof(a) NOT IN ('number', 'null')
                             OR (jsonb_typeof(a) = 'number' AND (a::numeric NOT BETWEEN 1 AND 9223372036854775807
                                                                 OR a::numeric <> trunc(a::numeric))))) THEN
            format('after must be an array of job ids, not %s', idemq._excerpt(r.after::text))
          WHEN r.key_retention IS NOT NULL AND jsonb_typeof(r.v->'key_retention') <> 'string' THEN
            format('key_retention must be an interval string such as "14 days", not %s',
                   idemq._excerpt((r.v->'key_retention')::text))
          WHEN r.traceparent IS NOT NULL AND jsonb_typeof(r.v->'traceparent') <> 'string' THEN
            format('traceparent must be a string (a W3C traceparent) or null, not %s',
                   idemq._excerpt((r.v->'traceparent')::text))
          WHEN r.concurrency_key IS NOT NULL AND jsonb_typeof(r.v->'concurrency_key') <> 'string' THEN
            format('concurrency_key must be a string or null, not %s',
                   idemq._excerpt((r.v->'concurrency_key')::text))
          WHEN r.timeout IS NOT NULL AND jsonb_typeof(r.v->'timeout') <> 'string' THEN
            format('timeout must be an interval string such as "30 seconds", or null, not %s',
                   idemq._excerpt((r.v->'timeout')::text))
        END AS shape
      FROM ROWS FROM (jsonb_array_elements(v_jobs),
                      jsonb_to_recordset(v_jobs) AS (task text, payload jsonb, queue text, run_at text, priority text,
                        max_attempts text, idempotency_key text, duplicate_policy text, backoff jsonb,
                        expires_at text, after jsonb, key_retention text, traceparent text,
                        concurrency_key text, timeout text)) WITH ORDINALITY
           AS r(v, task, payload, queue, run_at, priority, max_attempts, idempotency_key, duplicate_policy,
                backoff, expires_at, after, key_retention, traceparent, concurrency_key, timeout, ord)
          OFFSET 0) d
    INTO planned, keyed, parents, v_bad, v_problem;
  EXCEPTION WHEN data_exception THEN
    -- An element that is not an object, or a timestamp or interval that does not parse,
    -- fails the statement: find the first such element; an earlier
    -- element's problem comes first.
    FOR v_bad, v_elem IN SELECT e.ord, e.v FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(v, ord) LOOP
      v_problem := CASE WHEN jsonb_typeof(v_elem) <> 'object' THEN format('must be a JSON object, not %s', idemq._excerpt(v_elem::text)) END;
      IF v_problem IS NULL THEN
        BEGIN
          PERFORM (v_elem->>'run_at')::timestamptz, (v_elem->>'expires_at')::timestamptz,
                  (v_elem->>'key_retention')::interval, (v_elem->>'timeout')::interval;
        EXCEPTION WHEN data_exception THEN
          v_problem := format('run_at/expires_at is not a timestamp, or key_retention/timeout not an interval: %s',
                              idemq._excerpt(SQLERRM));
        END;
      END IF;
      IF v_problem IS NOT NULL THEN
        IF v_bad > 1 THEN
          -- The real elements before it (their payloads too): their problems come first.
          PERFORM idemq._parse_jobs(jsonb_path_query_array(jobs, format('$[0 to %s]', v_bad - 2)::jsonpath));
        END IF;
        PERFORM idemq._raise_bad_job(v_problem, v_bad);
      END IF;
    END LOOP;
    RAISE;
  END;
  -- The value rules, on the decoded elements before the first that did not
  -- decode (its own problem comes first otherwise). An element in
  -- v_oversized breaks rule 4 unless it breaks an earlier one (rules 1-3
  -- judge its stand-in {} as the real object).
  -- The element first, then its wording (words one element, whatever
  -- others break a rule too). planned[N] is element N (ordinal N).
  SELECT p.ordinal INTO v_ord
  FROM unnest(planned) p
  WHERE p.ordinal < coalesce(v_bad, 2147483647)
    AND (idemq._job_rule_broken(p, v_limits) IS NOT NULL OR p.ordinal = ANY (v_oversized))
  ORDER BY p.ordinal LIMIT 1;
  IF FOUND THEN
    v_bad := v_ord;
    v_value_problem := CASE
      WHEN v_ord = ANY (v_oversized) AND coalesce(idemq._job_rule_broken(planned[v_ord], v_limits), 4) >= 4
        THEN idemq._payload_problem(jobs -> (v_ord - 1) -> 'payload', v_limits.payload_bytes)
      ELSE idemq._job_problem(planned[v_ord], v_limits) END;
    v_problem := v_value_problem[1];
    v_hint := v_value_problem[2];
  END IF;
  IF v_bad IS NOT NULL THEN
    PERFORM idemq._raise_bad_job(v_problem, v_bad, v_hint);
  END IF;

  IF jobs @? '$[*].backoff ? (@.type() != "null")' THEN
    SELECT array_agg(d.spec) INTO v_bad_backoffs
    FROM (SELECT DISTINCT p.backoff AS spec FROM unnest(planned) p WHERE p.backoff IS NOT NULL) d
    WHERE idemq._backoff_problem(d.spec) IS NOT NULL;
    IF v_bad_backoffs IS NOT NULL THEN
      SELECT p.ordinal, idemq._backoff_problem(p.backoff) INTO v_bad, v_problem
      FROM unnest(planned) p WHERE p.backoff = ANY (v_bad_backoffs)
      ORDER BY p.ordinal LIMIT 1;
      PERFORM idemq._raise_bad_job(v_problem, v_bad);
    END IF;
  END IF;
  planned := coalesce(planned, '{}');
END;
$$;

COMMENT ON FUNCTION idemq._parse_jobs(jsonb) IS
  'Parse and check enqueue_many''s JSON array into planned jobs, raising 22023 for the first bad element.';

-- ---- sql/functions/attempts/_on_job_finished.sql ----
CREATE OR REPLACE FUNCTION idemq._on_job_finished()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_children bigint[];
  v_queues text[];
  v_keys text[];
BEGIN
  IF NEW.idempotency_key IS NOT NULL THEN
    UPDATE idemq.keys AS k
    SET finished_state = NEW.state, finished_at = NEW.finished_at
    WHERE k.key = NEW.idempotency_key AND k.job_id = NEW.id;
  END IF;

  IF NEW.has_children THEN
    -- A client waits for this outcome (job_result's notify), and parents
    -- wait for this child (spawn, enqueue_batch): before the continuations,
    -- which may end the trigger early.
    IF NEW.result_watched THEN
      PERFORM pg_notify('idemq_results', NEW.id::text);
    END IF;
    PERFORM idemq._child_finished(NEW.id, NEW.state, NEW.result, NEW.errors);
    WITH released AS (
      DELETE FROM idemq.job_dependencies AS d
      WHERE d.parent_id = NEW.id
      RETURNING d.child_id
    )
    SELECT array_agg(r.child_id) INTO v_children FROM released r;
    IF v_children IS NULL THEN
      RETURN NULL;
    END IF;
    -- Lock the children (in id order) before looking at what else they wait
    -- on, and look in statements of their own: each takes its snapshot after
    -- the lock, so it sees what a concurrent parent's transaction committed.
    -- Read in the statement that deletes the dependency rows, two parents
    -- succeeding at once would each still see the other's row, and neither
    -- would release the child.
    PERFORM 1 FROM idemq.jobs j
    WHERE j.id = ANY (v_children)
    ORDER BY j.id
    FOR NO KEY UPDATE;

    IF NEW.state = 'succeeded' THEN
      WITH moved AS (
        UPDATE idemq.jobs AS j
        SET state = idemq._initial_state(j.run_at)
        WHERE j.id = ANY (v_children)
          AND j.state = 'awaiting'
          AND j.concurrency_key IS NULL
          AND NOT EXISTS (SELECT 1 FROM idemq.job_dependencies d WHERE d.child_id = j.id)
        RETURNING j.queue, j.state
      )
      SELECT array_agg(DISTINCT m.queue) FILTER (WHERE m.state = 'enqueued') INTO v_queues FROM moved m;
      PERFORM idemq._notify_waiting(q) FROM unnest(v_queues) q;
      -- A child with a concurrency key stays awaiting, now for its key, and
      -- is admitted when the key has room (_key_promote).
      SELECT array_agg(DISTINCT j.concurrency_key) INTO v_keys
      FROM idemq.jobs j
      WHERE j.id = ANY (v_children) AND j.state = 'awaiting' AND j.concurrency_key IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM idemq.job_dependencies d WHERE d.child_id = j.id);
      IF v_keys IS NOT NULL THEN
        PERFORM idemq._key_promote(v_keys);
      END IF;
    ELSE
      UPDATE idemq.jobs AS j
      SET state = 'cancelled', finished_at = now(),
          errors = idemq._append_error(j.errors, jsonb_build_object(
            'attempt', j.attempt, 'failed_at', now(), 'class', 'ParentNotSucceeded',
            'message', format('parent job %s ended %s before this job could run', NEW.id, NEW.state)))
      WHERE j.id = ANY (v_children) AND j.state = 'awaiting';
    END IF;
  END IF;
  RETURN NULL;
END;
$$;

COMMENT ON FUNCTION idemq._on_job_finished() IS
  'Trigger: on a job entering a terminal state, finish its key in the ledger and release or cancel its children.';

-- ---- sql/functions/retention/apply_retention.sql ----
CREATE OR REPLACE FUNCTION idemq.apply_retention(batch_size int DEFAULT 1000)
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_left int := batch_size;
  v_rule record;
  v_ids bigint[];
  v_state idemq.job_state;
  v_cutoff timestamptz;
BEGIN
  PERFORM idemq._check_delete_batch('apply_retention', batch_size);

  DELETE FROM idemq.workers w
  WHERE w.worker_id IN (
    SELECT s.worker_id FROM idemq.workers s
    WHERE s.last_seen_at < now() - make_interval(secs => idemq._limit('worker_retention_seconds'))
       OR s.stopped_at < now() - make_interval(secs => idemq._limit('stopped_worker_seconds'))
    LIMIT batch_size
    FOR UPDATE SKIP LOCKED);

  PERFORM idemq._prune_events(batch_size);

  -- One rule at a time: the overrides of tasks, of queues, then each state's
  -- default, each rule excluding the rows a more specific one governs. Each
  -- lock query is a range scan of jobs_by_finish (state, finished_at) in
  -- index order. Planner trap: plpgsql caches a generic plan after five
  -- calls, and a generic plan estimates "finished_at < $2" at a third of the
  -- rows. Without the ORDER BY, on 100,000 finished jobs none of which was
  -- due (plus 5,000 enqueued), the generic plan was a sequential scan with
  -- LIMIT: 105,000 rows filtered, 2,993 buffers, 16 ms, to find nothing, on
  -- every timer tick. With it, a sort of the whole range is the only other
  -- plan, and the plan is the jobs_by_finish index scan: 3 buffers, 0.08 ms
  -- (EXPLAIN ANALYZE, plan_cache_mode = force_generic_plan, PostgreSQL 15).
  -- Cost: a rule steps over the rows of its state that are older than its
  -- cutoff but kept by a more specific rule (e.g. a queue kept a year is
  -- stepped over by the default's scan), in index entries and heap visits.
  FOR v_rule IN
    SELECT r.task, r.queue, r.state, r.keep FROM idemq.retention r
    ORDER BY r.task IS NULL, r.task, r.queue, r.state
  LOOP
    EXIT WHEN v_left = 0;
    v_cutoff := now() - v_rule.keep;
    IF v_rule.task IS NOT NULL THEN
      SELECT array_agg(x.id) INTO v_ids FROM (
        SELECT j.id FROM idemq.jobs j
        WHERE j.state = v_rule.state AND j.finished_at < v_cutoff AND j.task = v_rule.task
        ORDER BY j.finished_at
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED) x;
    ELSE
      SELECT array_agg(x.id) INTO v_ids FROM (
        SELECT j.id FROM idemq.jobs j
        WHERE j.state = v_rule.state AND j.finished_at < v_cutoff AND j.queue = v_rule.queue
          AND NOT EXISTS (SELECT 1 FROM idemq.retention r WHERE r.task = j.task AND r.state = j.state)
        ORDER BY j.finished_at
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED) x;
    END IF;
    v_left := v_left - idemq._delete_jobs(coalesce(v_ids, '{}'));
  END LOOP;

  FOREACH v_state IN ARRAY idemq.terminal_states() LOOP
    EXIT WHEN v_left = 0;
    v_cutoff := now() - idemq._default_retention(v_state);
    SELECT array_agg(x.id) INTO v_ids FROM (
      SELECT j.id FROM idemq.jobs j
      WHERE j.state = v_state AND j.finished_at < v_cutoff
        AND NOT EXISTS (SELECT 1 FROM idemq.retention r WHERE r.task = j.task AND r.state = j.state)
        AND NOT EXISTS (SELECT 1 FROM idemq.retention r WHERE r.queue = j.queue AND r.state = j.state)
      ORDER BY j.finished_at
      LIMIT v_left
      FOR UPDATE OF j SKIP LOCKED) x;
    v_left := v_left - idemq._delete_jobs(coalesce(v_ids, '{}'));
  END LOOP;

  -- Flow control: slot counts a write unseen by the trigger left off.
  PERFORM idemq._repair_slots(batch_size);

  -- Fold the appended count rows (their deletions above included). Rows a
  -- writer appends meanwhile are not seen and stay for the next call. The
  -- stamped rows' counts go to their minute of idemq.job_minutes first
  -- (added: each row is deleted here, by one caller, exactly once), in key
  -- order, so two folders lock the minute rows in the same order.
  WITH taken AS MATERIALIZED (
    SELECT c.ctid AS row_id FROM idemq.job_counts c FOR UPDATE SKIP LOCKED
  ), folded AS (
    DELETE FROM idemq.job_counts AS c USING taken t WHERE c.ctid = t.row_id
    RETURNING c.queue, c.task, c.state, c.n, c.at
  ), minutes AS (
    INSERT INTO idemq.job_minutes AS m (minute, queue, task, started, succeeded, failed, retried)
    SELECT x.minute, x.queue, x.task, x.started, x.succeeded, x.failed,
           -- Left processing without finishing: retried, rescued, snoozed, held.
           greatest(x.left_processing - x.succeeded - x.failed, 0)
    FROM (SELECT idemq._minute_of(f.at) AS minute, f.queue, f.task,
                 coalesce(sum(f.n) FILTER (WHERE f.state = 'processing' AND f.n > 0), 0) AS started,
                 coalesce(sum(f.n) FILTER (WHERE f.state = 'succeeded' AND f.n > 0), 0) AS succeeded,
                 coalesce(sum(f.n) FILTER (WHERE f.state = 'failed' AND f.n > 0), 0) AS failed,
                 coalesce(-sum(f.n) FILTER (WHERE f.state = 'processing' AND f.n < 0), 0) AS left_processing
          FROM folded f
          WHERE f.at >= now() - idemq._history_kept()
          GROUP BY 1, 2, 3) x
    WHERE x.started + x.succeeded + x.failed + x.left_processing > 0
    ORDER BY x.minute, x.queue, x.task
    ON CONFLICT (minute, queue, task) DO UPDATE
    SET started = m.started + excluded.started, succeeded = m.succeeded + excluded.succeeded,
        failed = m.failed + excluded.failed, retried = m.retried + excluded.retried
  )
  INSERT INTO idemq.job_counts (queue, task, state, n, at)
  SELECT f.queue, f.task, f.state, sum(f.n), NULL
  FROM folded f
  GROUP BY f.queue, f.task, f.state
  HAVING sum(f.n) <> 0;
  RETURN batch_size - v_left;
END;
$$;

COMMENT ON FUNCTION idemq.apply_retention(int) IS
  'Delete at most batch_size finished jobs past their retention (task, queue override or state default); keys stay.';

-- ---- sql/functions/steps/await_event.sql ----
CREATE OR REPLACE FUNCTION idemq.await_event(job_id bigint, attempt int, name text, event text, key text,
                                             timeout interval, lease_token uuid DEFAULT NULL)
RETURNS TABLE(status text, payload jsonb)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job record;
  v_step record;
  v_event record;
BEGIN
  PERFORM idemq._check_step('await_event', await_event.job_id, await_event.name, NULL);
  PERFORM idemq._check_event('await_event', await_event.event, await_event.key);
  IF await_event.timeout IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('await_event: job %s, step "%s": timeout must not be NULL', await_event.job_id,
                       idemq._excerpt(await_event.name)),
      HINT = 'Pass how long to wait for the event at most, e.g. interval ''3 days''.';
  END IF;
  IF await_event.timeout <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('await_event: job %s, step "%s": timeout must be positive, not %s', await_event.job_id,
                       idemq._excerpt(await_event.name), await_event.timeout),
      HINT = 'Pass how long to wait for the event at most, e.g. interval ''3 days''.';
  END IF;
  PERFORM idemq._check_duration('await_event', 'timeout', await_event.timeout);
  -- The event's lock before the job's, in emit()'s order: no deadlock.
  PERFORM idemq._event_lock(await_event.event, await_event.key);
  SELECT * INTO v_job FROM idemq._lock_held('await_event', await_event.job_id, await_event.attempt,
                                            await_event.lease_token);

  INSERT INTO idemq.job_steps AS s (job_id, name, kind, status, attempt, wake_at, event, event_key)
  VALUES (await_event.job_id, await_event.name, 'wait', 'waiting', await_event.attempt,
          now() + await_event.timeout, await_event.event, await_event.key)
  ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING;
  SELECT s.kind, s.status, s.result, s.wake_at, s.event, s.event_key INTO v_step FROM idemq.job_steps s
  WHERE s.job_id = await_event.job_id AND s.name = await_event.name
  FOR UPDATE;
  IF v_step.kind <> 'wait' OR v_step.event <> await_event.event
     OR v_step.event_key IS DISTINCT FROM await_event.key THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('await_event: job %s recorded step "%s" as %s, not a wait for (%s, %s)', await_event.job_id,
                       idemq._excerpt(await_event.name),
                       CASE WHEN v_step.kind = 'wait'
                            THEN format('a wait for (%s, %s)', idemq._excerpt(v_step.event), idemq._excerpt(v_step.event_key))
                            ELSE 'a ' || v_step.kind END,
                       idemq._excerpt(await_event.event), idemq._excerpt(await_event.key)),
      HINT = 'The handler no longer takes its steps in the order its recorded ones were taken: name the wait, '
             'or keep the old handler for jobs already running (docs/worker.md, "Changing a workflow").';
  END IF;
  IF v_step.status = 'received' OR v_step.status = 'timed_out' THEN
    status := v_step.status;
    payload := v_step.result;
    RETURN NEXT;
    RETURN;
  END IF;

  -- An event emitted before the wait was reached.
  SELECT e.id, e.payload INTO v_event FROM idemq.events e
  WHERE e.event = await_event.event AND coalesce(e.key, '') = coalesce(await_event.key, '')
    AND e.emitted_at >= v_job.created_at
    AND e.id > coalesce((SELECT max(t.event_id) FROM idemq.job_steps t
                         WHERE t.job_id = await_event.job_id AND t.event = await_event.event
                           AND coalesce(t.event_key, '') = coalesce(await_event.key, '')), 0)
  ORDER BY e.id
  LIMIT 1;
  IF FOUND THEN
    UPDATE idemq.job_steps AS s SET status = 'received', result = v_event.payload, event_id = v_event.id
    WHERE s.job_id = await_event.job_id AND s.name = await_event.name;
    status := 'received';
    payload := v_event.payload;
  ELSIF v_step.wake_at <= now() THEN
    UPDATE idemq.job_steps AS s SET status = 'timed_out'
    WHERE s.job_id = await_event.job_id AND s.name = await_event.name;
    status := 'timed_out';
    payload := NULL;
  ELSE
    PERFORM idemq.snooze(await_event.job_id, await_event.attempt, v_step.wake_at, await_event.lease_token);
    status := 'waiting';
    payload := NULL;
  END IF;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.await_event(bigint, int, text, text, text, interval, uuid) IS
  'A held job''s wait for (event, key): the payload when emitted (now or before), timed_out past the deadline, else park the job until either.';

-- ---- sql/functions/admin/cancel_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq.cancel_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_batch record;
  v_id bigint;
BEGIN
  SELECT * INTO v_batch FROM idemq._bulk_batch('cancel_jobs', filter, 'cancel', before_id, max_jobs);
  FOREACH v_id IN ARRAY v_batch.job_ids LOOP
    -- Locked by this call, so only its own cancels (a parent's cascade) move it.
    IF (SELECT j.state FROM idemq.jobs j WHERE j.id = v_id) = ANY (idemq._action_states('cancel_jobs', 'cancel')) THEN
      PERFORM idemq.cancel(v_id);
    END IF;
  END LOOP;
  touched := cardinality(v_batch.job_ids);
  skipped := v_batch.batch - touched;
  more := v_batch.more;
  next_before_id := v_batch.next_before_id;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.cancel_jobs(jsonb, bigint, int) IS
  'Cancel the active jobs a filter matches, one batch of at most max_jobs per call (cancel() each).';

-- ---- sql/functions/children/children.sql ----
CREATE OR REPLACE FUNCTION idemq.children(job_id bigint)
RETURNS TABLE(name text, child_job_id bigint, state idemq.job_state, result jsonb, last_error jsonb, finished_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF children.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'children: job_id must not be NULL',
      HINT = 'Pass the id of the job that spawned them (or of a batch''s callback).';
  END IF;
  RETURN QUERY
  SELECT c.name, c.child_id, coalesce(c.state, j.state), c.result, c.last_error, c.finished_at
  FROM idemq.job_children c
  LEFT JOIN idemq.jobs j ON j.id = c.child_id AND c.state IS NULL
  WHERE c.parent_id = children.job_id
  -- name last: two links to one child share created_at and child_id.
  ORDER BY c.created_at, c.child_id, c.name;
END;
$$;

COMMENT ON FUNCTION idemq.children(bigint) IS
  'A job''s children by name (spawn, enqueue_batch): state, result or latest error, finished_at.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.claim;
-- ---- sql/functions/attempts/claim.sql ----
CREATE OR REPLACE FUNCTION idemq.claim(
  worker_id text,
  queues text[] DEFAULT NULL,
  batch_size int DEFAULT 1,
  lease interval DEFAULT '30 seconds',
  tasks text[] DEFAULT NULL,
  token boolean DEFAULT false)
RETURNS SETOF idemq.claimed_job
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Generic plans, planned once per session: with custom plans (the first five
-- calls, and then whenever a custom plan's estimate beats the generic one, as
-- it does for the key lookups below, which know the array lengths) PL/pgSQL
-- planned the key statements at every call: claim(tasks => '{x}') 2.2 ms a
-- call against 0.65 ms generic (500 calls, same session, loaded machine).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_lost bigint[];
  v_key_tasks text[];
  v_key_queues text[];
  v_limited boolean;
  v_take int := batch_size;
  v_caps int[];
  v_queue_slots int[];
  v_task_slots int[];
BEGIN
  PERFORM idemq._check_claimer('claim', worker_id, queues, tasks, lease);
  IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN batch_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('claim: batch_size must be between 1 and 1000, not %s', coalesce(batch_size::text, 'NULL')),
      HINT = 'Claim at most as many jobs as the worker can start before their leases need a heartbeat.';
  END IF;
  -- Flow control (docs/design.md, "Flow control"): with no row in
  -- idemq.limits, this one read is all a claim pays. The table's ACCESS
  -- SHARE lock, held to the end of the transaction, is what a set_limit
  -- giving a concurrency waits for.
  -- A row holding nothing but a hold that has passed (hold()) does not count.
  v_limited := EXISTS (SELECT FROM idemq.limits l
                       WHERE NOT (l.held_until <= now() AND NOT l.paused AND l.concurrency IS NULL
                                  AND l.rate IS NULL AND l.per_key IS NULL));

  -- Two steps: lock the jobs (SKIP LOCKED, in claim order) into an array, then
  -- update them by primary key. One UPDATE joined to the locking subquery let
  -- the planner hash the whole jobs table for claims of a few hundred (seen in
  -- EXPLAIN: a sequential scan of every row, finished ones included, per
  -- claim); "id = ANY (array)" is an index probe per job whatever the table
  -- holds. The jobs whose previous attempt lost its lease are noted before the
  -- update resets the flag.
  --
  -- One index holds the runnable jobs: jobs_runnable_by_task_queue
  -- (_name_key(task), _name_key(queue), priority DESC, run_at, id), walked
  -- one (task, queue) key at a time, where an equality on both leading
  -- columns leaves that key's jobs, already in claim order; each walk then
  -- compares the names themselves (a Filter), so two names with one 64-bit
  -- key never mix (_name_key). The keys: the listed tasks crossed with the
  -- listed queues; for a list that is NULL, the values present among
  -- runnable jobs, read by a loose index scan (one index descent per value:
  -- "next key after this one", the name read from the row found), and for
  -- an unfiltered claim the (task, queue) pairs present, read the same way;
  -- so finding the keys costs the number of distinct keys, tasks or queues,
  -- not backlogs. The loose scans read keys, not names: a name whose key
  -- another name present shares is not listed (_name_key says what that
  -- costs).
  -- Why keys and not the names: with the variable-width names first,
  -- every comparison of an index insertion walked them to reach priority,
  -- run_at and id (_name_key; measured: bench/FINDINGS.md, "Why the SQL is
  -- written as it is").
  -- Planner trap (why the index leads with task and queue, migration 0019):
  -- a filter on queue or task checked on the rows of a walk over an index
  -- in claim order alone (the former jobs_runnable (priority DESC, run_at,
  -- id)) reads every runnable job of the other queues and tasks before it
  -- finds none of its own. EXPLAIN (ANALYZE, BUFFERS), generic plan
  -- (PG15), 200,000 runnable jobs in queue A, a claim on the empty queue B:
  -- Index Scan using jobs_runnable, Rows Removed by Filter: 200000, 6,394
  -- buffers, 138-166 ms; claim(queues => '{B}') 54-59 ms. Walking this
  -- index per key: 0 rows removed, 3 buffers; claim(queues => '{B}', tasks
  -- => '{t}') 0.36-0.49 ms a call (500 calls, one session, loaded machine).
  -- Second trap, in the pair scan: "next pair" must be the row comparison
  -- (task key, queue key) > (k.task_key, k.queue_key), which is an Index
  -- Cond that starts the descent at the next pair. Spelt "j.task > $1 OR
  -- (j.task = $1 AND j.queue > $2)" it is a Filter on a walk from the first
  -- entry: EXPLAIN (ANALYZE, BUFFERS), generic plan, 50,000 runnable jobs
  -- over 50 pairs, the step after the 49th pair: Rows Removed by Filter:
  -- 44000, 917 buffers, 8.6 ms; as a row comparison, 5 buffers, 0.04 ms.
  -- Third trap (0028), in the queue scan of a claim by tasks: a task-name
  -- Filter on its step ("j.task = k.task") made the planner expect one row
  -- and read the task's whole key with a Bitmap Heap Scan and a sort
  -- (EXPLAIN ANALYZE, generic plan, 50,000 runnable jobs over 10 pairs:
  -- rows=2500 per step); on the keys alone it is an Index Scan that stops
  -- at the first entry (rows=1 per step). So the step compares keys only.
  -- Fourth trap (0019, gone with jobs_runnable): with statistics that saw
  -- one queue and one task, an equality on either looked like it kept every
  -- row, and a generic plan tied the two indexes and walked jobs_runnable
  -- with the filter again (Rows Removed by Filter: 100000 per key, 201 ms);
  -- the schema sets n_distinct = 100 on both columns, which the key columns
  -- of the index (expressions, with statistics of their own) no longer
  -- read. n_distinct stays (the schema's, harmless here).
  IF queues IS NULL AND tasks IS NULL THEN
    WITH RECURSIVE present(task_key, queue_key, task, queue) AS (
      (SELECT idemq._name_key(j.task), idemq._name_key(j.queue), j.task, j.queue
       FROM idemq.jobs j
       WHERE j.state IN ('enqueued', 'scheduled')
       ORDER BY idemq._name_key(j.task), idemq._name_key(j.queue)
       LIMIT 1)
      UNION ALL
      SELECT n.task_key, n.queue_key, n.task, n.queue
      FROM present k
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.task) AS task_key, idemq._name_key(j.queue) AS queue_key, j.task, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND (idemq._name_key(j.task), idemq._name_key(j.queue)) > (k.task_key, k.queue_key)
        ORDER BY idemq._name_key(j.task), idemq._name_key(j.queue)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present k;
  ELSIF tasks IS NULL THEN
    WITH RECURSIVE present(task_key, task) AS (
      (SELECT idemq._name_key(j.task), j.task
       FROM idemq.jobs j
       WHERE j.state IN ('enqueued', 'scheduled')
       ORDER BY idemq._name_key(j.task)
       LIMIT 1)
      UNION ALL
      SELECT n.task_key, n.task
      FROM present t
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.task) AS task_key, j.task
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled') AND idemq._name_key(j.task) > t.task_key
        ORDER BY idemq._name_key(j.task)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(t.task ORDER BY t.task, q.queue), '{}'),
           coalesce(array_agg(q.queue ORDER BY t.task, q.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present t CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q;
  ELSIF queues IS NULL THEN
    WITH RECURSIVE present(task, queue_key, queue) AS (
      SELECT u.task, n.queue_key, n.queue
      FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) u
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.queue) AS queue_key, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND idemq._name_key(j.task) = idemq._name_key(u.task)
        ORDER BY idemq._name_key(j.queue)
        LIMIT 1
      ) n
      UNION ALL
      SELECT k.task, n.queue_key, n.queue
      FROM present k
      CROSS JOIN LATERAL (
        SELECT idemq._name_key(j.queue) AS queue_key, j.queue
        FROM idemq.jobs j
        WHERE j.state IN ('enqueued', 'scheduled')
          AND idemq._name_key(j.task) = idemq._name_key(k.task)
          AND idemq._name_key(j.queue) > k.queue_key
        ORDER BY idemq._name_key(j.queue)
        LIMIT 1
      ) n
    )
    SELECT coalesce(array_agg(k.task), '{}'), coalesce(array_agg(k.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM present k;
  ELSE
    SELECT coalesce(array_agg(t.task), '{}'), coalesce(array_agg(q.queue), '{}')
    INTO v_key_tasks, v_key_queues
    FROM (SELECT DISTINCT v.task FROM unnest(tasks) AS v(task)) t
    CROSS JOIN (SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue)) q;
  END IF;

  IF v_limited THEN
    -- Keys paused or without a free slot or start go; v_take bounds the walk.
    -- v_limited becomes whether a key left has a concurrency or a rate limit:
    -- without one, _claim_take would find nothing to take (calling it cost a
    -- claim as much as a limit of its own: bench/FINDINGS.md). A concurrency
    -- limit cannot appear meanwhile (its set_limit waits for this
    -- transaction's lock on idemq.limits); a rate or a pause committed from
    -- here on counts from the next claim.
    SELECT g.tasks, g.queues, g.take, g.caps, g.limited INTO v_key_tasks, v_key_queues, v_take, v_caps, v_limited
    FROM idemq._claim_gate(v_key_tasks, v_key_queues, batch_size) g;
  END IF;

  IF cardinality(v_key_tasks) = 0 THEN
    -- No runnable job of any key asked for (unfiltered: none at all).
    RETURN;
  ELSIF cardinality(v_key_tasks) = 1 THEN
    -- One key (a worker of one task, or of one queue and one task; an
    -- unfiltered claim while one key has runnable jobs): its walk is the
    -- claim order itself, locked as it goes.
    SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.lease_lost), '{}')
    INTO v_ids, v_lost
    FROM (
      SELECT j.id, j.lease_lost
      FROM idemq.jobs j
      WHERE j.state IN ('enqueued', 'scheduled')
        AND idemq._name_key(j.task) = idemq._name_key(v_key_tasks[1])
        AND idemq._name_key(j.queue) = idemq._name_key(v_key_queues[1])
        AND j.task = v_key_tasks[1]
        AND j.queue = v_key_queues[1]
        AND j.run_at <= now()
        AND (j.expires_at IS NULL OR j.expires_at > now())
      ORDER BY j.priority DESC, j.run_at, j.id
      LIMIT v_take
      FOR UPDATE SKIP LOCKED
    ) p;
  ELSIF v_caps IS NOT NULL THEN
    -- Several keys, some capped by flow control below the batch: each key
    -- read up to its cap (_claim_capped).
    SELECT m.ids, m.lost INTO v_ids, v_lost
    FROM idemq._claim_capped(v_key_tasks, v_key_queues, v_caps, v_take) m;
  ELSE
    -- Several keys: _claim_merge reads each key only as far as the claim
    -- order needs and locks the jobs it takes (its header says how, and
    -- what it costs). Only a claim of several keys pays its call.
    SELECT m.ids, m.lost INTO v_ids, v_lost
    FROM idemq._claim_merge(v_key_tasks, v_key_queues, v_take) m;
  END IF;
  IF v_limited AND cardinality(v_ids) > 0 THEN
    -- The slots and starts of the jobs taken, in claim order; a job that
    -- gets none it needs is left (still locked, until this transaction ends).
    -- Of one key, the key goes along (_claim_take then reads no job).
    SELECT t.ids, t.queue_slots, t.task_slots INTO v_ids, v_queue_slots, v_task_slots
    FROM idemq._claim_take(v_ids,
                           CASE WHEN cardinality(v_key_tasks) = 1 THEN v_key_tasks[1] END,
                           CASE WHEN cardinality(v_key_tasks) = 1 THEN v_key_queues[1] END) t;
  END IF;
  IF cardinality(v_ids) = 0 THEN
    RETURN;
  END IF;
  IF claim.token THEN
    -- Asynchronous commit (issue 29): the claim's answer does not wait for
    -- its WAL flush, the one wait on an idle worker's path that no CPU work
    -- removes (0.3 ms on a quiet disk, 3 ms under the shared disk's load:
    -- bench/FINDINGS.md, "The claim's round trip"). Only a server crash can
    -- lose the claim, within about 3 x wal_writer_delay (0.6 s at the
    -- default) of its commit, and it loses it whole: the jobs, their
    -- counters, flow-control slots and starts go back to before it. What
    -- makes that safe is the token: the job is handed out again with the
    -- same attempt but a new lease_token, so the first holder, if it
    -- outlived the crash, is fenced out (IQ410) of complete, fail, snooze,
    -- heartbeat, progress, steps and effect_claim. Any durable commit of a
    -- later call (a heartbeat, an effect claim, a step, complete) flushes
    -- the WAL through this commit first, so a holder that has written
    -- anything through idemq holds a durable claim. Without a token the
    -- attempt fences alone and would be handed out twice: that claim stays
    -- synchronous. SET LOCAL lasts to the end of the caller's transaction
    -- (no SET clause of this function names it), never past it: nothing
    -- stays on a pooled connection.
    SET LOCAL synchronous_commit = off;
  END IF;

  -- What starting an attempt writes: the same columns and values in both
  -- branches (but the slots) and in the hand-off of _key_promote, held equal
  -- by test/sql/predicates.test.ts ("what starting an attempt writes").
  IF v_queue_slots IS NULL AND v_task_slots IS NULL THEN
    RETURN QUERY
    WITH claimed AS (
      UPDATE idemq.jobs AS j
      SET state = 'processing', attempt = j.attempt + 1, locked_by = worker_id,
          locked_at = now(), lease_lost = false,
          -- Never past the job's time limit (_lease_until, as heartbeat()).
          lease_expires_at = idemq._lease_until(now(), j.timeout, lease),
          lease_token = CASE WHEN claim.token THEN gen_random_uuid() END,
          queue_slot = NULL, task_slot = NULL, progress = NULL
      WHERE j.id = ANY (v_ids)
      RETURNING j.id, j.task, j.queue, j.payload, j.attempt, j.max_attempts,
                j.idempotency_key, j.lease_expires_at, j.id = ANY (v_lost) AS reclaimed,
                j.traceparent, j.lease_token, j.priority, j.run_at, j.timeout, j.concurrency_key
    )
    SELECT c.id, c.task, c.queue, c.payload, c.attempt, c.max_attempts,
           c.idempotency_key, c.lease_expires_at, c.reclaimed, c.traceparent, c.lease_token, c.id, c.timeout,
           c.concurrency_key
    FROM claimed c
    ORDER BY c.priority DESC, c.run_at, c.id;
  ELSE
    -- The stripes whose slots were taken go on the jobs, where the jobs
    -- trigger reads them when the attempt ends ("id = ANY" drives the walk;
    -- the join pairs each job with its stripes).
    RETURN QUERY
    WITH claimed AS (
      UPDATE idemq.jobs AS j
      SET state = 'processing', attempt = j.attempt + 1, locked_by = worker_id,
          locked_at = now(), lease_lost = false,
          -- Never past the job's time limit (_lease_until, as heartbeat()).
          lease_expires_at = idemq._lease_until(now(), j.timeout, lease),
          lease_token = CASE WHEN claim.token THEN gen_random_uuid() END,
          queue_slot = u.queue_slot, task_slot = u.task_slot, progress = NULL
      FROM unnest(v_ids, v_queue_slots, v_task_slots) AS u(id, queue_slot, task_slot)
      WHERE j.id = ANY (v_ids) AND j.id = u.id
      RETURNING j.id, j.task, j.queue, j.payload, j.attempt, j.max_attempts,
                j.idempotency_key, j.lease_expires_at, j.id = ANY (v_lost) AS reclaimed,
                j.traceparent, j.lease_token, j.priority, j.run_at, j.timeout, j.concurrency_key
    )
    SELECT c.id, c.task, c.queue, c.payload, c.attempt, c.max_attempts,
           c.idempotency_key, c.lease_expires_at, c.reclaimed, c.traceparent, c.lease_token, c.id, c.timeout,
           c.concurrency_key
    FROM claimed c
    ORDER BY c.priority DESC, c.run_at, c.id;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.claim(text, text[], int, interval, text[], boolean) IS
  'Claim up to batch_size runnable jobs (priority desc, run_at, id) under a lease; FOR UPDATE SKIP LOCKED.';

-- ---- sql/functions/flow/clear_limit.sql ----
CREATE OR REPLACE FUNCTION idemq.clear_limit(queue text DEFAULT NULL, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
  v_id bigint;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('clear_limit', clear_limit.queue, clear_limit.task) s;
  SELECT l.id INTO v_id FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name;
  IF v_id IS NULL THEN
    RETURN false;
  END IF;
  PERFORM FROM idemq.limit_slots s WHERE s.limit_id = v_id ORDER BY s.slot FOR UPDATE;
  PERFORM FROM idemq.limit_starts r WHERE r.limit_id = v_id ORDER BY r.n FOR UPDATE;
  PERFORM FROM idemq.limits l WHERE l.id = v_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  DELETE FROM idemq.limit_slots s WHERE s.limit_id = v_id;
  DELETE FROM idemq.limit_releases r WHERE r.limit_id = v_id;
  DELETE FROM idemq.limit_starts r WHERE r.limit_id = v_id;
  DELETE FROM idemq.limits l WHERE l.id = v_id AND NOT l.paused AND NOT coalesce(l.held_until > now(), false);
  IF FOUND THEN
    RETURN true;
  END IF;
  UPDATE idemq.limits l
  SET concurrency = NULL, rate = NULL, per = NULL, per_key = NULL, slot_rows = 0, first_slot = NULL, updated_at = now()
  WHERE l.id = v_id AND (l.concurrency IS NOT NULL OR l.rate IS NOT NULL OR l.per_key IS NOT NULL);
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.clear_limit(text, text) IS
  'Remove the limits (concurrency, rate, per_key) of one queue or task; a pause or a hold stays. True when there was one.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.complete;
-- ---- sql/functions/attempts/complete.sql ----
CREATE OR REPLACE FUNCTION idemq.complete(job_id bigint, attempt int, result jsonb DEFAULT NULL,
                                          lease_token uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_r record;
  v_gone int;
BEGIN
  -- Checked before anything is written: the job stays held, and the caller
  -- may complete it again with less.
  PERFORM idemq._check_result('complete', format('job %s: the result', complete.job_id), complete.result,
    'Keep bulky data in a table of your own and return its key; nothing was written, so complete the job again with less.');
  SELECT * INTO v_r FROM idemq._success_retention() z;
  IF v_r.any_zero THEN
    -- Retention 0: delete instead of update. _on_job_finished (AFTER UPDATE)
    -- does not fire for a DELETE, so the ledger write it makes for a
    -- succeeded key is made here; a job with children takes the UPDATE below.
    WITH gone AS (
      DELETE FROM idemq.jobs AS j
      WHERE j.id = complete.job_id AND j.attempt = complete.attempt
        AND j.lease_token IS NOT DISTINCT FROM complete.lease_token
        AND idemq._held(j.lease_expires_at, j.locked_by)
        AND NOT j.has_children
        AND idemq._gone_on_success(j.task, j.queue, v_r.default_zero, v_r.zero_tasks, v_r.kept_tasks,
                                   v_r.zero_queues, v_r.kept_queues)
      RETURNING j.id, j.idempotency_key
    ), ledger AS (
      UPDATE idemq.keys AS k SET finished_state = 'succeeded', finished_at = now()
      FROM gone g WHERE k.key = g.idempotency_key AND k.job_id = g.id
    )
    SELECT count(*) INTO v_gone FROM gone;
    IF v_gone = 1 THEN
      RETURN;
    END IF;
  END IF;

  UPDATE idemq.jobs AS j
  SET state = 'succeeded', result = complete.result, finished_at = now(),
      lease_expires_at = NULL
  WHERE j.id = complete.job_id AND j.attempt = complete.attempt
    AND j.lease_token IS NOT DISTINCT FROM complete.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by);
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(complete.job_id, complete.attempt, 'complete');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.complete(bigint, int, jsonb, uuid) IS
  'Mark a job succeeded if attempt (with its lease token) still holds it; IQ410 (lease lost) otherwise, so the caller''s transaction rolls back.';

-- ---- sql/functions/attempts/complete_and_take_next.sql ----
CREATE OR REPLACE FUNCTION idemq.complete_and_take_next(
  job_ids bigint[],
  attempts int[],
  lease_tokens uuid[],
  worker_id text,
  queues text[] DEFAULT NULL,
  lease interval DEFAULT '30 seconds',
  tasks text[] DEFAULT NULL)
RETURNS TABLE (completed bigint, job_id bigint, task text, queue text, payload jsonb,
               attempt int, max_attempts int, idempotency_key text, lease_expires_at timestamptz,
               reclaimed boolean, traceparent text, lease_token uuid, timeout interval,
               concurrency_key text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_completed bigint[];
  v_handed bigint[];
BEGIN
  PERFORM idemq._check_claimer('complete_and_take_next', worker_id, queues, tasks, lease);
  PERFORM set_config('idemq.hand_off',
    jsonb_build_object('worker', worker_id, 'lease', lease::text, 'queues', queues, 'tasks', tasks)::text, true);
  PERFORM set_config('idemq.handed', '', true);
  SELECT coalesce(array_agg(c.c), '{}') INTO v_completed
  FROM idemq.complete_many(job_ids, attempts, lease_tokens) AS c(c);
  PERFORM set_config('idemq.hand_off', '', true);
  v_handed := string_to_array(nullif(current_setting('idemq.handed', true), ''), ',')::bigint[];
  PERFORM set_config('idemq.handed', '', true);

  RETURN QUERY SELECT c.id, NULL::bigint, NULL::text, NULL::text, NULL::jsonb, NULL::int, NULL::int,
                      NULL::text, NULL::timestamptz, NULL::boolean, NULL::text, NULL::uuid, NULL::interval,
                      NULL::text
               FROM unnest(v_completed) AS c(id);
  IF v_handed IS NOT NULL THEN
    -- Read back by primary key: the hand-off wrote these rows in this
    -- transaction, for this worker (a job it handed and a later statement
    -- of this call changed is not returned: none does).
    -- Planner trap: with the state and worker in the same WHERE as the ids,
    -- the planner may walk jobs_leases (every processing job of every
    -- worker; its statistics, taken when few were processing, say it is
    -- small) and filter the ids: EXPLAIN ANALYZE under a worker holding
    -- 500 jobs, a read-back of 50: Index Scan using jobs_leases, Rows
    -- Removed by Filter: 450, each row checked against the 50 ids; 10% of
    -- a keyed completion's instructions (bench/FINDINGS.md, "The keyed
    -- completion's cost"). OFFSET 0 keeps the lookup by id apart, so it
    -- can only use jobs_pkey; the state and worker are checked on its rows.
    RETURN QUERY
    SELECT NULL::bigint, j.id, j.task, j.queue, j.payload, j.attempt, j.max_attempts,
           j.idempotency_key, j.lease_expires_at, false, j.traceparent, j.lease_token, j.timeout,
           j.concurrency_key
    FROM (SELECT * FROM idemq.jobs b WHERE b.id = ANY (v_handed) OFFSET 0) j
    WHERE j.state = 'processing' AND j.locked_by = worker_id
    ORDER BY j.priority DESC, j.run_at, j.id;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.complete_and_take_next(bigint[], int[], uuid[], text, text[], interval, text[]) IS
  'complete_many(), and the next job of each concurrency key it frees handed to the same worker, claimed in the same statement.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.complete_many;
-- ---- sql/functions/attempts/complete_many.sql ----
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

-- ---- sql/functions/search/count_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq.count_jobs(filter jsonb DEFAULT '{}', action text DEFAULT NULL,
                                            at_most int DEFAULT 10000)
RETURNS TABLE(jobs int, exact boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_states idemq.job_state[];
  v_n int;
BEGIN
  IF at_most IS NULL OR at_most NOT BETWEEN 0 AND 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN at_most IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('count_jobs: at_most must be between 0 and 1000000, not %s', coalesce(at_most::text, 'NULL')),
      HINT = 'It bounds the rows a count reads: e.g. 10000, and "10,000+" when it is reached.';
  END IF;
  IF action IS NOT NULL THEN
    v_states := idemq._action_states('count_jobs', action);
  END IF;
  SELECT count(*) INTO v_n FROM idemq._matching_jobs('count_jobs', filter, v_states, NULL, at_most + 1);
  jobs := least(v_n, at_most);
  exact := v_n <= at_most;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.count_jobs(jsonb, text, int) IS
  'How many jobs a filter matches (those an action would touch, with action), counted up to at_most.';

-- ---- sql/functions/flow/declare_limit.sql ----
CREATE OR REPLACE FUNCTION idemq.declare_limit(task text, concurrency int DEFAULT NULL, rate int DEFAULT NULL,
                                               per interval DEFAULT NULL)
RETURNS TABLE(stored_concurrency int, stored_rate int, stored_per interval, applied boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
  v_row idemq.limits;
  v_concurrency int;
  v_rate int;
  v_per interval;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('declare_limit', NULL, declare_limit.task) s;
  IF declare_limit.concurrency IS NULL AND declare_limit.rate IS NULL AND declare_limit.per IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'declare_limit: give concurrency, or rate with per',
      HINT = 'e.g. declare_limit(task => ''send-email'', concurrency => 5, rate => 100, per => ''1 minute'').';
  END IF;
  -- set_limit's rules: a declared value is refused even where a lower
  -- stored one means it would not be applied.
  PERFORM idemq._check_limit_values('declare_limit', declare_limit.concurrency, declare_limit.rate, declare_limit.per, NULL);

  PERFORM pg_advisory_xact_lock(hashtextextended('idemq.declare_limit ' || v_name, 0));
  SELECT l.* INTO v_row FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name;
  IF declare_limit.concurrency IS NOT NULL
     AND (v_row.concurrency IS NULL OR declare_limit.concurrency < v_row.concurrency) THEN
    v_concurrency := declare_limit.concurrency;
  END IF;
  -- Fewer starts per second: rate / per < stored rate / stored per, compared
  -- without division.
  IF declare_limit.rate IS NOT NULL
     AND (v_row.rate IS NULL
          OR declare_limit.rate::numeric * extract(epoch FROM v_row.per)
             < v_row.rate::numeric * extract(epoch FROM declare_limit.per)) THEN
    v_rate := declare_limit.rate;
    v_per := declare_limit.per;
  END IF;
  IF v_concurrency IS NOT NULL OR v_rate IS NOT NULL THEN
    PERFORM idemq.set_limit(task => v_name, concurrency => v_concurrency, rate => v_rate, per => v_per);
  END IF;
  RETURN QUERY
  SELECT l.concurrency, l.rate, l.per, v_concurrency IS NOT NULL OR v_rate IS NOT NULL
  FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name
  UNION ALL
  SELECT NULL::int, NULL::int, NULL::interval, false
  WHERE NOT EXISTS (SELECT FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name);
END;
$$;

COMMENT ON FUNCTION idemq.declare_limit(text, int, int, interval) IS
  'A worker''s declared limits of one task: set when none is stored or the stored one is higher, never raised; returns what is stored and whether it wrote.';

-- ---- sql/functions/admin/delete_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq.delete_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_batch record;
  v_id bigint;
BEGIN
  SELECT * INTO v_batch FROM idemq._bulk_batch('delete_jobs', filter, 'delete', before_id, max_jobs);
  touched := idemq._delete_jobs(v_batch.job_ids);
  skipped := v_batch.batch - touched;
  more := v_batch.more;
  next_before_id := v_batch.next_before_id;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.delete_jobs(jsonb, bigint, int) IS
  'Delete the finished jobs a filter matches (keys stay until prune_keys), one batch of at most max_jobs per call.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.effect_claim;
-- ---- sql/functions/effects/effect_claim.sql ----
CREATE OR REPLACE FUNCTION idemq.effect_claim(
  key text,
  owner text,
  stale_after interval DEFAULT '10 minutes',
  job_id bigint DEFAULT NULL,
  attempt int DEFAULT NULL,
  lease_token uuid DEFAULT NULL)
RETURNS TABLE(status text, result jsonb)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_round int := 0;
  v_row record;
BEGIN
  IF effect_claim.key IS NULL OR effect_claim.owner IS NULL OR effect_claim.stale_after IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'effect_claim: key, owner and stale_after must not be NULL',
      HINT = 'key names the effect (e.g. ''invoice-email:42''), owner names this attempt (e.g. ''job:7:2'').';
  END IF;
  IF effect_claim.key = '' OR effect_claim.owner = '' OR effect_claim.stale_after <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: key and owner must be non-empty and stale_after positive',
      HINT = 'stale_after should exceed the longest the external call can take.';
  END IF;
  IF (effect_claim.job_id IS NULL) <> (effect_claim.attempt IS NULL)
     OR (effect_claim.lease_token IS NOT NULL AND effect_claim.job_id IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'effect_claim: job_id, attempt and lease_token go together',
      HINT = 'Pass all three (the job, attempt and lease token this claim is made for, as claim() returned them) or none.';
  END IF;
  PERFORM idemq._check_key_bytes('effect_claim', effect_claim.key, effect_claim.owner);
  PERFORM idemq._check_duration('effect_claim', 'stale_after', effect_claim.stale_after);

  LOOP
    v_round := v_round + 1;
    INSERT INTO idemq.effects AS e (key, owner, status, claimed_at, job_id, attempt)
    VALUES (effect_claim.key, effect_claim.owner, 'claimed', clock_timestamp(), effect_claim.job_id, effect_claim.attempt)
    ON CONFLICT ON CONSTRAINT effects_pkey DO NOTHING;
    IF FOUND THEN
      status := 'claimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    -- Stale, or left by an earlier attempt of the job the caller holds now
    -- (fencing: that attempt can no longer finish, so its claim is dead).
    UPDATE idemq.effects AS e
    SET owner = effect_claim.owner, claimed_at = clock_timestamp(), reclaims = e.reclaims + 1,
        job_id = effect_claim.job_id, attempt = effect_claim.attempt
    WHERE e.key = effect_claim.key AND e.status = 'claimed'
      AND (e.claimed_at < clock_timestamp() - effect_claim.stale_after
           OR (e.job_id = effect_claim.job_id AND e.attempt < effect_claim.attempt
               AND EXISTS (SELECT 1 FROM idemq.jobs j
                           WHERE j.id = effect_claim.job_id AND j.attempt = effect_claim.attempt
                             AND j.lease_token IS NOT DISTINCT FROM effect_claim.lease_token
                             AND idemq._held(j.lease_expires_at, j.locked_by))));
    IF FOUND THEN
      status := 'reclaimed'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;

    SELECT e.status, e.result INTO v_row FROM idemq.effects e WHERE e.key = effect_claim.key;
    IF FOUND THEN
      status := CASE WHEN v_row.status = 'done' THEN 'done' ELSE 'busy' END;
      result := v_row.result;
      RETURN NEXT; RETURN;
    END IF;
    -- released between our statements: claim again
    IF v_round >= 10 THEN
      status := 'busy'; result := NULL;
      RETURN NEXT; RETURN;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.effect_claim(text, text, interval, bigint, int, uuid) IS
  'Claim-first record for an external effect: claimed | reclaimed (stale) | done (with result) | busy.';

-- ---- sql/functions/steps/emit.sql ----
CREATE OR REPLACE FUNCTION idemq.emit(event text, key text DEFAULT NULL, payload jsonb DEFAULT '{}')
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_id bigint;
  v_woken int;
  v_queues text[];
  v_queue text;
BEGIN
  PERFORM idemq._check_event('emit', emit.event, emit.key);
  IF emit.payload IS NULL THEN
    PERFORM idemq._raise_null_argument('emit', 'payload');
  END IF;
  PERFORM idemq._check_result('emit', format('the payload of event %s', idemq._excerpt(emit.event)), emit.payload,
    'Keep an event''s payload small (ids, statuses); store bulky data in a table and send its key.');
  PERFORM idemq._event_lock(emit.event, emit.key);
  INSERT INTO idemq.events (event, key, payload)
  VALUES (emit.event, emit.key, emit.payload)
  RETURNING id INTO v_id;

  WITH woken AS (
    UPDATE idemq.job_steps AS s SET status = 'received', result = emit.payload, event_id = v_id
    WHERE s.status = 'waiting' AND s.event = emit.event
      AND coalesce(s.event_key, '') = coalesce(emit.key, '')
    RETURNING s.job_id
  ), moved AS (
    UPDATE idemq.jobs AS j SET run_at = now()
    FROM woken w
    WHERE j.id = w.job_id AND j.state = 'scheduled' AND j.run_at > now()
    RETURNING j.queue
  )
  SELECT (SELECT count(*) FROM woken), (SELECT array_agg(DISTINCT m.queue) FROM moved m)
  INTO v_woken, v_queues;
  FOREACH v_queue IN ARRAY coalesce(v_queues, '{}') LOOP
    PERFORM idemq._notify_waiting(v_queue);
  END LOOP;
  RETURN v_woken;
END;
$$;

COMMENT ON FUNCTION idemq.emit(text, text, jsonb) IS
  'Emit (event, key) with a payload in the caller''s transaction: wakes the jobs waiting for it; kept for waits reached later.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.enqueue;
-- ---- sql/functions/enqueue/enqueue.sql ----
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

-- ---- sql/functions/children/enqueue_batch.sql ----
CREATE OR REPLACE FUNCTION idemq.enqueue_batch(jobs jsonb, callback jsonb, fail_fast boolean DEFAULT false)
RETURNS TABLE(ordinal int, job_id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_parsed record;
  v_callback idemq._planned_job[];
  v_cb idemq._planned_job;
  v_planned idemq._planned_job[];
  v_message text;
  v_wait record;
BEGIN
  IF enqueue_batch.jobs IS NULL OR enqueue_batch.callback IS NULL OR enqueue_batch.fail_fast IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('enqueue_batch: %s must not be NULL',
                       CASE WHEN enqueue_batch.jobs IS NULL THEN 'jobs' WHEN enqueue_batch.callback IS NULL THEN 'callback'
                            ELSE 'fail_fast' END),
      HINT = 'Pass jobs as enqueue_many takes them and callback as one such job, e.g. {"task": "report"}.';
  END IF;
  IF jsonb_typeof(enqueue_batch.callback) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('enqueue_batch: callback must be a JSON object, not %s', jsonb_typeof(enqueue_batch.callback)),
      HINT = 'Pass the callback as one job object, e.g. {"task": "report", "payload": {}}.';
  END IF;
  -- Both checked before anything is written.
  BEGIN
    v_parsed := idemq._parse_jobs(jsonb_build_array(enqueue_batch.callback));
  EXCEPTION WHEN SQLSTATE '22023' THEN
    GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'enqueue_batch: callback: ' || regexp_replace(v_message, '^jobs\[1\]:? ?', ''),
      HINT = 'The callback takes enqueue_many''s fields.';
  END;
  v_callback := v_parsed.planned;
  v_parsed := idemq._parse_jobs(enqueue_batch.jobs);

  v_callback := idemq._enqueue_planned(v_callback, v_callback[1].idempotency_key IS NOT NULL, v_callback[1].after IS NOT NULL);
  v_cb := v_callback[1];
  ordinal := 0;
  job_id := v_cb.job_id;
  outcome := v_cb.outcome;
  RETURN NEXT;
  IF v_cb.outcome <> 'created' THEN
    RETURN;
  END IF;
  -- Park the callback: its gate first (as wait_for_children: the UPDATE's
  -- trigger may promote jobs of its concurrency key, not this one).
  INSERT INTO idemq.job_dependencies (parent_id, child_id) VALUES (v_cb.job_id, v_cb.job_id);
  UPDATE idemq.jobs AS j SET state = 'awaiting', has_children = true
  WHERE j.id = v_cb.job_id AND j.state IN ('enqueued', 'scheduled', 'awaiting');

  v_planned := idemq._enqueue_planned(v_parsed.planned, v_parsed.keyed, v_parsed.parents, as_children => true);
  -- Each job is the callback's child named by its ordinal.
  v_wait := idemq._link_children(v_cb.job_id, v_planned, ARRAY(SELECT p.ordinal::text FROM unnest(v_planned) p ORDER BY p.ordinal),
                                 enqueue_batch.fail_fast);
  IF v_wait.pending = 0 OR (enqueue_batch.fail_fast AND v_wait.failed > 0) THEN
    PERFORM idemq._release_waiting(v_cb.job_id);
  END IF;

  RETURN QUERY SELECT p.ordinal, p.job_id, p.outcome FROM unnest(v_planned) p ORDER BY p.ordinal;
END;
$$;

COMMENT ON FUNCTION idemq.enqueue_batch(jsonb, jsonb, boolean) IS
  'A batch: enqueue jobs and a callback job that runs once when all of them have finished (their outcomes: children()).';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.fail;
-- ---- sql/functions/attempts/fail.sql ----
CREATE OR REPLACE FUNCTION idemq.fail(
  job_id bigint,
  attempt int,
  error jsonb,
  retryable boolean DEFAULT true,
  retry_at timestamptz DEFAULT NULL,
  backoff jsonb DEFAULT NULL,
  max_attempts int DEFAULT NULL,
  counted boolean DEFAULT true,
  lease_token uuid DEFAULT NULL)
RETURNS TABLE(state idemq.job_state, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No "#variable_conflict error" line: the parameter named "error" (fixed by
-- the contract) would be read there as the variable; nor SET
-- plpgsql.variable_conflict, which only a superuser may set (it kept anyone
-- else from installing idemq). Every name in the body is qualified, so it
-- means the same under any setting (the default is error).
AS $$
DECLARE
  v_error jsonb;
  v_job record;
  v_state idemq.job_state;
  v_due record;
  v_problem text;
BEGIN
  IF fail.error IS NULL OR fail.retryable IS NULL OR fail.counted IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'fail: error, retryable and counted must not be NULL',
      HINT = 'Pass the error as {"class": "TimeoutError", "message": "..."}.';
  END IF;
  v_error := idemq._error_entry(fail.error);
  IF v_error IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: error must be a JSON object or string, not %s', idemq._excerpt(fail.error::text)),
      HINT = 'Pass {"class": "TimeoutError", "message": "...", "stack": "..."}.';
  END IF;
  v_problem := idemq._backoff_problem(fail.backoff);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: %s', v_problem),
      HINT = 'Pass NULL to use the job''s own backoff.';
  END IF;
  IF fail.max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fail: max_attempts must be NULL or >= 1, not %s', fail.max_attempts),
      HINT = 'Pass NULL to use the job''s own max_attempts.';
  END IF;
  PERFORM idemq._check_instant('fail', 'retry_at', fail.retry_at);

  SELECT j.attempt, j.uncounted, j.max_attempts, j.backoff INTO v_job
  FROM idemq.jobs j
  WHERE j.id = fail.job_id AND j.attempt = fail.attempt
    AND j.lease_token IS NOT DISTINCT FROM fail.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(fail.job_id, fail.attempt, 'fail');
  END IF;
  v_state := CASE WHEN NOT fail.retryable THEN 'failed'
                  WHEN NOT fail.counted THEN 'scheduled'
                  WHEN v_job.attempt - v_job.uncounted >= least(v_job.max_attempts, fail.max_attempts) THEN 'failed'
                  ELSE 'scheduled' END;

  UPDATE idemq.jobs AS j
  SET state = v_state,
      run_at = CASE WHEN v_state <> 'scheduled' THEN j.run_at
                    WHEN NOT fail.counted THEN coalesce(fail.retry_at, now())
                    ELSE coalesce(fail.retry_at, now() + idemq._backoff_delay(coalesce(nullif(fail.backoff, 'null'), v_job.backoff),
                                                                  v_job.attempt - v_job.uncounted)) END,
      uncounted = j.uncounted + CASE WHEN fail.counted THEN 0 ELSE 1 END,
      finished_at = CASE WHEN v_state = 'failed' THEN now() END,
      errors = idemq._append_error(j.errors, v_error || jsonb_build_object(
        'attempt', j.attempt, 'started_at', j.locked_at, 'failed_at', now(), 'worker', j.locked_by,
        'max_attempts', least(v_job.max_attempts, fail.max_attempts))),
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = fail.job_id
  RETURNING j.run_at, j.queue INTO v_due;
  -- A retry due at once (retry_at in the past, a zero delay) must not wait
  -- for a worker's fallback poll.
  IF v_state = 'scheduled' AND v_due.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_due.queue);
  END IF;
  state := v_state;
  run_at := CASE WHEN v_state = 'scheduled' THEN v_due.run_at END;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.fail(bigint, int, jsonb, boolean, timestamptz, jsonb, int, boolean, uuid) IS
  'Record a failed attempt; scheduled for a retry by backoff (or retry_at), or failed when not retryable or out of attempts.';

-- ---- sql/functions/search/find_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq.find_jobs(filter jsonb DEFAULT '{}', before_id bigint DEFAULT NULL,
                                           page_size int DEFAULT 50)
RETURNS SETOF idemq.job_row
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN page_size IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = format('find_jobs: page_size must be between 1 and 1000, not %s', coalesce(page_size::text, 'NULL')),
      HINT = 'Ask for the next page with before_id => the last job_id of this one.';
  END IF;
  RETURN QUERY
  SELECT r.*
  FROM idemq._matching_jobs('find_jobs', filter, NULL, before_id, page_size) WITH ORDINALITY AS m(id, n)
  CROSS JOIN LATERAL idemq.job(m.id) AS r
  ORDER BY m.n;
END;
$$;

COMMENT ON FUNCTION idemq.find_jobs(jsonb, bigint, int) IS
  'One page of the jobs a filter matches, newest first; the next page starts below before_id.';

-- ---- sql/functions/effects/guard.sql ----
CREATE OR REPLACE FUNCTION idemq.guard(key text, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF guard.key IS NULL OR guard.key = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN guard.key IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'guard: key must be a non-empty string',
      HINT = 'Use a key that names the effect, e.g. ''credit:order-42''.';
  END IF;
  IF guard.task = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'guard: task must be NULL or a non-empty string',
      HINT = 'Pass the task name (counted per task in stats()), or leave task out.';
  END IF;
  -- _check_key_bytes decides and words the 22023; it is called only for a
  -- key over key_bytes, because the call itself (a PL/pgSQL function pinning
  -- search_path, and its read of the limit) is a tenth of a guard's cost
  -- (measured: bench/FINDINGS.md, "Why the SQL is written as it is").
  -- limits.test.ts holds this test and _check_key_bytes equal at the
  -- boundary.
  IF octet_length(guard.key) > (SELECT l.key_bytes FROM idemq.enqueue_limits l) THEN
    PERFORM idemq._check_key_bytes('guard', guard.key, NULL);
  END IF;
  INSERT INTO idemq.processed AS p (key) VALUES (guard.key)
  ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING;
  IF FOUND THEN
    RETURN true;
  END IF;
  IF guard.task IS NOT NULL THEN
    -- Append-only (see idemq.counters): no row lock held until commit.
    INSERT INTO idemq.counters (task, event, n) VALUES (guard.task, 'guard_duplicate', 1);
  END IF;
  RETURN false;
END;
$$;

COMMENT ON FUNCTION idemq.guard(text, text) IS
  'Insert a guard row in the caller''s transaction: true = do the effect, false = already done by another delivery.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.heartbeat;
-- ---- sql/functions/attempts/heartbeat.sql ----
CREATE OR REPLACE FUNCTION idemq.heartbeat(job_ids bigint[], attempts int[], lease interval DEFAULT '30 seconds',
                                           lease_tokens uuid[] DEFAULT NULL)
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
BEGIN
  -- As in complete_many: the pairs checked and sorted by id (_pairs_by_id),
  -- width_bucket() finding an id's attempt by binary search, and "id = ANY
  -- (ids)", a primary-key probe per job whatever the table holds (joined to
  -- the arrays, the planner hashed or scanned the whole table). The attempt
  -- and the held-check are re-checked on the newest row version.
  SELECT p.ids, p.attempts_by_id, p.tokens_by_id INTO v_ids, v_attempts, v_tokens
  FROM idemq._pairs_by_id(job_ids, attempts, lease_tokens, 'heartbeat',
                          'Pass arrays of equal length: the ids, attempts and lease tokens of the jobs this worker runs.') p;
  PERFORM idemq._check_lease(lease, 'heartbeat');

  RETURN QUERY
  UPDATE idemq.jobs AS j
  SET lease_expires_at = idemq._lease_until(j.locked_at, j.timeout, lease)
  WHERE j.id = ANY (v_ids)
    AND (j.timeout IS NULL OR j.locked_at + j.timeout > now())
    AND j.attempt = v_attempts[width_bucket(j.id, v_ids)]
    AND j.lease_token IS NOT DISTINCT FROM v_tokens[width_bucket(j.id, v_ids)]
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.id;
END;
$$;

COMMENT ON FUNCTION idemq.heartbeat(bigint[], int[], interval, uuid[]) IS
  'Extend the leases of (job_id, attempt, lease_token) entries still held; ids missing from the answer were lost.';

-- ---- sql/functions/flow/held_keys.sql ----
CREATE OR REPLACE FUNCTION idemq.held_keys()
RETURNS TABLE(concurrency_key text, held_until timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT h.concurrency_key, h.held_until
  FROM idemq.key_holds h
  WHERE h.held_until > now()
  ORDER BY h.held_until, h.concurrency_key;
$$;

COMMENT ON FUNCTION idemq.held_keys() IS
  'The concurrency keys held back now (hold with scope key: a 429 for one key), and until when.';

-- ---- sql/functions/reads/history.sql ----
CREATE OR REPLACE FUNCTION idemq.history(since interval DEFAULT '1 hour', queue text DEFAULT NULL, task text DEFAULT NULL)
RETURNS TABLE(minute timestamptz, started bigint, succeeded bigint, failed bigint, retried bigint,
              waiting bigint, oldest_waiting_seconds bigint, run_p50_ms bigint, run_p95_ms bigint,
              wait_p50_ms bigint, wait_p95_ms bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF since IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'history: since must not be NULL',
      HINT = 'Leave it out for the last hour, or give e.g. since => ''1 day''.';
  END IF;
  IF since <= interval '0' OR since > idemq._history_kept() THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('history: since must be positive and at most %s, not %s', idemq._history_kept(), since),
      HINT = format('roll_up() keeps a day of minutes: give since => ''1 hour'' up to ''%s''.', idemq._history_kept());
  END IF;

  RETURN QUERY
  WITH chosen AS MATERIALIZED (
    SELECT m.* FROM idemq.job_minutes m
    WHERE m.minute >= idemq._minute_of(now() - since)
      AND (history.queue IS NULL OR m.queue = history.queue)
      AND (history.task IS NULL OR m.task = history.task)
  ), merged AS (
    SELECT c.minute, b.measure, b.key, sum(b.n) AS n
    FROM chosen c
    CROSS JOIN LATERAL (
      SELECT 'run' AS measure, r.key, r.value::bigint AS n FROM jsonb_each_text(c.run_buckets) r
      UNION ALL
      SELECT 'wait', w.key, w.value::bigint FROM jsonb_each_text(c.wait_buckets) w
    ) b
    GROUP BY c.minute, b.measure, b.key
  ), summed AS (
    SELECT s.minute, s.measure, jsonb_object_agg(s.key, s.n) AS counts
    FROM merged s
    GROUP BY s.minute, s.measure
  )
  SELECT c.minute, sum(c.started)::bigint, sum(c.succeeded)::bigint, sum(c.failed)::bigint, sum(c.retried)::bigint,
         sum(c.waiting)::bigint, max(c.oldest_waiting_seconds),
         idemq._duration_percentile((SELECT s.counts FROM summed s WHERE s.minute = c.minute AND s.measure = 'run'), 0.5),
         idemq._duration_percentile((SELECT s.counts FROM summed s WHERE s.minute = c.minute AND s.measure = 'run'), 0.95),
         idemq._duration_percentile((SELECT s.counts FROM summed s WHERE s.minute = c.minute AND s.measure = 'wait'), 0.5),
         idemq._duration_percentile((SELECT s.counts FROM summed s WHERE s.minute = c.minute AND s.measure = 'wait'), 0.95)
  FROM chosen c
  GROUP BY c.minute
  ORDER BY c.minute;
END;
$$;

COMMENT ON FUNCTION idemq.history(interval, text, text) IS
  'Per minute of the last since (at most a day), for a queue, a task or all: attempts started and retried, jobs succeeded and failed, waiting jobs, oldest waiting age, run and wait p50/p95.';

-- ---- sql/functions/flow/hold.sql ----
CREATE OR REPLACE FUNCTION idemq.hold(job_id bigint, attempt int, scope text, until timestamptz,
                                      lease_token uuid DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_queue text;
  v_task text;
  v_key text;
  v_held timestamptz;
BEGIN
  IF hold.job_id IS NULL OR hold.attempt IS NULL OR hold.scope IS NULL OR hold.until IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('hold: %s must not be NULL',
                       CASE WHEN hold.job_id IS NULL THEN 'job_id' WHEN hold.attempt IS NULL THEN 'attempt'
                            WHEN hold.scope IS NULL THEN 'scope' ELSE 'until' END),
      HINT = 'Pass the held job''s job_id and attempt (and lease_token), the scope (''queue'', ''task'' or ''key'') and when the API accepts calls again.';
  END IF;
  IF hold.scope NOT IN ('queue', 'task', 'key') THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('hold: scope must be ''queue'', ''task'' or ''key'', not %s', idemq._excerpt(hold.scope)),
      HINT = 'Hold the job''s queue (every task sharing the API), its task, or its concurrency key (one customer''s API key).';
  END IF;
  PERFORM idemq._check_instant('hold', 'until', hold.until);
  IF hold.until > now() + make_interval(days => idemq._limit('duration_days')::int) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('hold: until must be at most %s days ahead (duration_days), not %s',
                       idemq._limit('duration_days'), hold.until),
      HINT = 'A Retry-After that far ahead is likely a parsing error; hold for the API''s real window, or pause() the queue.';
  END IF;
  IF hold.scope = 'key' THEN
    -- The key's runnable jobs, locked before the job's row and the key's
    -- lock, the order a cancel of one of them takes (its row, then the key's
    -- lock in _count_jobs); by id, as another hold of the key locks them.
    -- A job's key never changes, so it is read unlocked.
    PERFORM FROM idemq.jobs k
    WHERE k.concurrency_key = (SELECT h.concurrency_key FROM idemq.jobs h WHERE h.id = hold.job_id)
      AND k.state IN ('enqueued', 'scheduled')
    ORDER BY k.id
    FOR UPDATE;
  END IF;
  UPDATE idemq.jobs AS j
  SET state = 'scheduled', run_at = hold.until, uncounted = j.uncounted + 1,
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = hold.job_id AND j.attempt = hold.attempt
    AND j.lease_token IS NOT DISTINCT FROM hold.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.queue, j.task, j.concurrency_key INTO v_queue, v_task, v_key;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(hold.job_id, hold.attempt, 'hold');
  END IF;
  IF hold.scope = 'key' AND v_key IS NULL THEN
    -- Raised after the fence (a stale attempt gets IQ410 first); the snooze
    -- above rolls back with the error.
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('hold: job %s has no concurrency_key, so scope ''key'' has nothing to hold', hold.job_id),
      HINT = 'Enqueue the job with a concurrency_key (concurrencyKey) to hold one key, or hold its ''queue'' or ''task''.';
  END IF;
  IF hold.until <= now() THEN
    PERFORM idemq._notify_waiting(v_queue);
    RETURN hold.until;
  END IF;
  -- Rows that held nothing but a hold now past (claim and the jobs trigger
  -- ignore them; this keeps limits as small as the limits set, and
  -- key_holds as small as the keys held now).
  DELETE FROM idemq.limits l
  WHERE l.held_until <= now() AND NOT l.paused
    AND l.concurrency IS NULL AND l.rate IS NULL AND l.per_key IS NULL;
  DELETE FROM idemq.key_holds h WHERE h.held_until <= now();
  IF hold.scope = 'key' THEN
    -- Under the key's lock (the job's UPDATE above took it already, in
    -- _count_jobs): an admission or a retry of the key in flight commits
    -- first and is moved below, or comes after and sees the hold.
    PERFORM idemq._key_lock(ARRAY[v_key]);
    INSERT INTO idemq.key_holds AS h (concurrency_key, held_until)
    VALUES (v_key, hold.until)
    ON CONFLICT (concurrency_key) DO UPDATE SET held_until = greatest(h.held_until, hold.until)
    RETURNING h.held_until INTO v_held;
    UPDATE idemq.jobs AS j SET run_at = v_held, state = 'scheduled'
    WHERE j.concurrency_key = v_key AND j.state IN ('enqueued', 'scheduled') AND j.run_at < v_held;
    RETURN v_held;
  END IF;
  INSERT INTO idemq.limits AS l (kind, name, held_until)
  VALUES (hold.scope, CASE WHEN hold.scope = 'queue' THEN v_queue ELSE v_task END, hold.until)
  ON CONFLICT ON CONSTRAINT limits_scope DO UPDATE
    SET held_until = greatest(l.held_until, hold.until), updated_at = now()
  RETURNING l.held_until INTO v_held;
  RETURN v_held;
END;
$$;

COMMENT ON FUNCTION idemq.hold(bigint, int, text, timestamptz, uuid) IS
  'Back-pressure (a 429): snooze the held job to until without spending an attempt, and hold back its queue, task or concurrency key from every claim until then.';

-- ---- sql/functions/reads/job.sql ----
CREATE OR REPLACE FUNCTION idemq.job(job_id bigint)
RETURNS SETOF idemq.job_row
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_payloads boolean;
BEGIN
  IF job.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'job: job_id must not be NULL',
      HINT = 'Pass the id enqueue() returned.';
  END IF;
  -- session_user, not current_user: inside SECURITY DEFINER current_user is
  -- the owner. A session that may SET ROLE away from its login can SET it
  -- back, so the login's privilege is the one that counts.
  v_payloads := has_table_privilege(session_user, 'idemq.jobs', 'SELECT');
  RETURN QUERY
  SELECT j.id, j.task, j.queue, CASE WHEN v_payloads THEN j.payload END, j.state, j.priority,
         j.run_at, j.attempt, j.uncounted, j.max_attempts, j.idempotency_key, j.locked_by,
         j.locked_at, j.lease_expires_at, j.errors, j.result, j.created_at, j.finished_at,
         j.expires_at, j.concurrency_key,
         CASE WHEN j.state = 'awaiting' THEN
                -- The gate of wait_for_children is the row (j.id, j.id).
                CASE WHEN EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id AND d.parent_id = j.id)
                       THEN 'children'::idemq.waiting_reason
                     WHEN EXISTS (SELECT FROM idemq.job_dependencies d WHERE d.child_id = j.id)
                       THEN 'parents'::idemq.waiting_reason
                     WHEN j.concurrency_key IS NOT NULL THEN 'concurrency_key' END
              -- The probe of limits_scope first: _scope_waits() reads
              -- limits(), every scope's use (a few index scans per scope),
              -- which a job whose queue and task have no flow control does
              -- not need (and `idemq jobs` calls job() per row).
              WHEN j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
                   AND (j.expires_at IS NULL OR j.expires_at > now())
                   AND EXISTS (SELECT FROM idemq.limits l
                               WHERE (l.kind, l.name) IN (('queue', j.queue), ('task', j.task))) THEN
                (SELECT min(w.waiting_for) FROM idemq._scope_waits() w
                 WHERE w.queue = j.queue OR w.task = j.task)
         END,
         j.progress
  FROM idemq.jobs j
  WHERE j.id = job.job_id;
END;
$$;

COMMENT ON FUNCTION idemq.job(bigint) IS
  'One job''s state and outcome (no row when it does not exist); the payload only for a login that may read idemq.jobs.';

-- ---- sql/functions/results/job_result.sql ----
CREATE OR REPLACE FUNCTION idemq.job_result(job_id bigint, notify boolean DEFAULT false)
RETURNS TABLE(state idemq.job_state, result jsonb, last_error jsonb, finished_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF job_result.job_id IS NULL OR job_result.notify IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('job_result: %s must not be NULL', CASE WHEN job_result.job_id IS NULL THEN 'job_id' ELSE 'notify' END),
      HINT = 'Pass the id enqueue() returned, and notify => true only to be sent NOTIFY idemq_results when it finishes.';
  END IF;
  IF job_result.notify THEN
    UPDATE idemq.jobs AS j SET result_watched = true, has_children = true
    WHERE j.id = job_result.job_id AND j.finished_at IS NULL
      AND NOT (j.result_watched AND j.has_children);
  END IF;
  RETURN QUERY
  SELECT j.state,
         CASE WHEN j.state = 'succeeded' THEN j.result END,
         CASE WHEN j.finished_at IS NOT NULL AND j.state <> 'succeeded' THEN j.errors -> -1 END,
         j.finished_at
  FROM idemq.jobs j
  WHERE j.id = job_result.job_id;
END;
$$;

COMMENT ON FUNCTION idemq.job_result(bigint, boolean) IS
  'A job''s state and outcome (result, or its latest error); notify => true: NOTIFY idemq_results with its id when it finishes.';

-- ---- sql/functions/flow/limits.sql ----
CREATE OR REPLACE FUNCTION idemq.limits()
RETURNS TABLE(queue text, task text, concurrency int, rate int, per interval, per_key int, paused boolean,
              held_until timestamptz,
              running int, started int, updated_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE WHEN l.kind = 'queue' THEN l.name END, CASE WHEN l.kind = 'task' THEN l.name END,
         l.concurrency, l.rate, l.per, l.per_key, l.paused,
         CASE WHEN l.held_until > now() THEN l.held_until END,
         CASE WHEN l.concurrency IS NOT NULL THEN
           ((SELECT coalesce(sum(s.held), 0) FROM idemq.limit_slots s WHERE s.limit_id = l.id)
            - (SELECT coalesce(sum(r.n), 0) FROM idemq.limit_releases r WHERE r.limit_id = l.id))::int END,
         CASE WHEN l.rate IS NOT NULL THEN
           (SELECT count(*) FROM idemq.limit_starts r WHERE r.limit_id = l.id AND r.started_at > now() - r.per)::int END,
         l.updated_at
  FROM idemq.limits l
  ORDER BY l.kind, l.name;
$$;

COMMENT ON FUNCTION idemq.limits() IS
  'Every queue and task with a limit, a pause or a hold: its limits, paused, and its use now (slots held, starts in the last period).';

-- ---- sql/functions/reads/overview.sql ----
CREATE OR REPLACE FUNCTION idemq.overview(recent interval DEFAULT '15 minutes', exact_up_to bigint DEFAULT 10000)
RETURNS TABLE(queue text, task text, metric text, value bigint, exact boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_state idemq.job_state;
  v_count bigint;
  v_estimate numeric;
BEGIN
  IF recent IS NULL OR exact_up_to IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'overview: recent and exact_up_to must not be NULL',
      HINT = 'Leave an argument out to take its default.';
  END IF;
  IF recent <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: recent must be positive, not %s', recent),
      HINT = 'Give the window of recent finishes, e.g. recent => ''15 minutes''.';
  END IF;
  PERFORM idemq._check_duration('overview', 'recent', recent);
  IF exact_up_to NOT BETWEEN 0 AND 10000000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('overview: exact_up_to must be from 0 to 10000000, not %s', exact_up_to),
      HINT = 'Totals over it are estimated; counting up to any cap costs the same (kept counts).';
  END IF;

  RETURN QUERY
  SELECT c.queue, c.task, c.state::text, c.jobs, true
  FROM idemq._job_counts() c
  WHERE c.state = ANY (idemq.active_states())
  UNION ALL
  -- "state = 'processing'" is jobs_leases' predicate: the expired leases alone are read.
  SELECT j.queue, j.task, 'lease_expired', count(*), true
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT r.queue, r.task, 'oldest_runnable_seconds', r.oldest_seconds, true
  FROM idemq._oldest_runnable() r
  UNION ALL
  -- The terminal states as constants and finished_at bounded: jobs_by_finish
  -- (state, finished_at) over finished rows, read for the window only.
  SELECT j.queue, j.task, j.state::text || '_recent', count(*), true
  FROM idemq.jobs j
  WHERE j.state IN ('succeeded', 'failed', 'expired', 'cancelled')
    AND j.finished_at IS NOT NULL AND j.finished_at >= now() - recent
  GROUP BY j.queue, j.task, j.state
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint, true
  FROM idemq.counters c
  GROUP BY c.task, c.event;

  -- Totals per terminal state: exact from the kept counts; over the cap,
  -- the estimate the contract promises (as before the counts were kept).
  FOR v_state, v_count IN
    SELECT t.state, coalesce(sum(c.jobs), 0)::bigint
    FROM unnest(idemq.terminal_states()) WITH ORDINALITY AS t(state, ord)
    LEFT JOIN idemq._job_counts() c ON c.state = t.state
    GROUP BY t.state, t.ord
    ORDER BY t.ord
  LOOP
    CONTINUE WHEN v_count = 0;
    queue := NULL;
    task := NULL;
    metric := v_state::text;
    IF v_count <= exact_up_to THEN
      value := v_count;
      exact := true;
    ELSE
      SELECT c.reltuples * s.most_common_freqs[array_position(s.most_common_vals::text::text[], v_state::text)]
      INTO v_estimate
      FROM pg_class c
      LEFT JOIN pg_stats s
        ON s.schemaname = 'idemq' AND s.tablename = 'jobs' AND s.attname = 'state'
      WHERE c.oid = 'idemq.jobs'::regclass AND c.reltuples > 0;
      value := greatest(exact_up_to + 1, coalesce(round(v_estimate), 0))::bigint;
      exact := false;
    END IF;
    RETURN NEXT;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq.overview(interval, bigint) IS
  'Dashboard overview: exact active counts and recent finishes per queue and task, terminal totals exact up to a cap and estimated beyond it.';

-- ---- sql/functions/flow/pause.sql ----
CREATE OR REPLACE FUNCTION idemq.pause(queue text DEFAULT NULL, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('pause', pause.queue, pause.task) s;
  INSERT INTO idemq.limits AS l (kind, name, paused)
  VALUES (v_kind, v_name, true)
  ON CONFLICT ON CONSTRAINT limits_scope DO UPDATE SET paused = true, updated_at = now()
  WHERE NOT l.paused;
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.pause(text, text) IS
  'Pause one queue or task: claims hand out none of its jobs until resume(); running jobs finish, enqueue works. True when it was not paused.';

-- ---- sql/functions/attempts/progress.sql ----
CREATE OR REPLACE FUNCTION idemq.progress(job_id bigint, attempt int, value int, lease_token uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF progress.job_id IS NULL OR progress.attempt IS NULL OR progress.value IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'progress: job_id, attempt and value must not be NULL',
      HINT = 'Pass the held job''s id and attempt (claim() returned them) and a percentage 0..100.';
  END IF;
  IF progress.value NOT BETWEEN 0 AND 100 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('progress: value must be a percentage from 0 to 100, got %s', progress.value),
      HINT = 'Report how far the attempt has got as a whole percentage, e.g. round(100 * done / total).';
  END IF;
  UPDATE idemq.jobs AS j
  SET progress = progress.value
  WHERE j.id = progress.job_id AND j.attempt = progress.attempt
    AND j.lease_token IS NOT DISTINCT FROM progress.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by);
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(progress.job_id, progress.attempt, 'progress');
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.progress(bigint, int, int, uuid) IS
  'Record a held attempt''s progress (a percentage 0..100), fenced like complete(); cleared by the next claim.';

-- ---- sql/functions/flow/resume.sql ----
CREATE OR REPLACE FUNCTION idemq.resume(queue text DEFAULT NULL, task text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('resume', resume.queue, resume.task) s;
  DELETE FROM idemq.limits l
  WHERE l.kind = v_kind AND l.name = v_name AND (l.paused OR l.held_until > now())
    AND l.concurrency IS NULL AND l.rate IS NULL AND l.per_key IS NULL;
  IF FOUND THEN
    RETURN true;
  END IF;
  UPDATE idemq.limits l SET paused = false, held_until = NULL, updated_at = now()
  WHERE l.kind = v_kind AND l.name = v_name AND (l.paused OR l.held_until > now());
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.resume(text, text) IS
  'End the pause (and a hold) of one queue or task: claims hand out its jobs again, within its limits. True when it was paused.';

-- ---- sql/functions/admin/retry.sql ----
CREATE OR REPLACE FUNCTION idemq.retry(job_id bigint)
RETURNS idemq.job_state
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_job idemq.jobs;
  v_holder record;
  v_state idemq.job_state;
BEGIN
  -- The concurrency key never changes: read it unlocked, lock the key first.
  PERFORM idemq._key_lock(ARRAY(SELECT j.concurrency_key FROM idemq.jobs j WHERE j.id = retry.job_id));
  v_job := idemq._lock_job(retry.job_id, 'retry');
  IF v_job.state <> ALL (idemq._unsuccessful_states()) THEN
    RAISE EXCEPTION USING ERRCODE = 'IQ412',
      MESSAGE = format('retry: job %s is %s; only failed, cancelled or expired jobs can be retried', v_job.id, v_job.state),
      DETAIL = jsonb_build_object('job_id', v_job.id, 'state', v_job.state)::text,
      HINT = CASE WHEN v_job.state = 'succeeded' THEN 'A succeeded job''s effect happened; enqueue new work instead.'
                  ELSE 'The job has not finished; wait for it, or cancel it first.' END;
  END IF;

  IF v_job.idempotency_key IS NOT NULL THEN
    SELECT k.job_id, k.finished_state INTO v_holder
    FROM idemq.keys k WHERE k.key = v_job.idempotency_key FOR NO KEY UPDATE;
    IF FOUND AND v_holder.job_id <> v_job.id AND v_holder.finished_state IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'IQ409',
        MESSAGE = format('retry: idempotency key "%s" of job %s is held by active job %s',
                         idemq._excerpt(v_job.idempotency_key), v_job.id, v_holder.job_id),
        DETAIL = jsonb_build_object('key', v_job.idempotency_key, 'existing_job_id', v_holder.job_id,
                                    'existing_state', (SELECT j.state FROM idemq.jobs j WHERE j.id = v_holder.job_id),
                                    'policy', NULL)::text,
        HINT = format('Job %s already does this work; cancel it first to retry job %s.', v_holder.job_id, v_job.id);
    END IF;
    INSERT INTO idemq.keys AS k (key, job_id, task, payload_md5, retention)
    VALUES (v_job.idempotency_key, v_job.id, v_job.task, md5(v_job.payload::text),
            (idemq._job_defaults()->>'key_retention')::interval)
    ON CONFLICT ON CONSTRAINT keys_pkey DO UPDATE
      SET job_id = EXCLUDED.job_id, task = EXCLUDED.task, payload_md5 = EXCLUDED.payload_md5,
          finished_state = NULL, finished_at = NULL;
  END IF;

  IF v_job.concurrency_key IS NOT NULL THEN
    -- Parents it no longer waits for (the override) must not hold it.
    DELETE FROM idemq.job_dependencies AS d WHERE d.child_id = v_job.id;
  END IF;
  UPDATE idemq.jobs AS j
  SET state = CASE WHEN j.concurrency_key IS NULL THEN 'enqueued' ELSE 'awaiting' END::idemq.job_state, run_at = now(), finished_at = NULL, uncounted = j.attempt,
      errors = idemq._append_error(j.errors, jsonb_build_object(
        'attempt', j.attempt, 'class', 'Retried',
        'message', format('retried by an operator after the job was %s', j.state),
        'previous_state', j.state, 'finished_at', j.finished_at, 'retried_at', now())),
      expires_at = CASE WHEN j.state = 'expired' OR j.expires_at <= now() THEN NULL ELSE j.expires_at END
  WHERE j.id = v_job.id;
  IF v_job.concurrency_key IS NOT NULL THEN
    PERFORM idemq._key_promote(ARRAY[v_job.concurrency_key]);
    SELECT j.state INTO v_state FROM idemq.jobs j WHERE j.id = v_job.id;
    RETURN v_state;
  END IF;
  PERFORM idemq._notify_waiting(v_job.queue);
  RETURN 'enqueued';
END;
$$;

COMMENT ON FUNCTION idemq.retry(bigint) IS
  'Run a failed, cancelled or expired job again with fresh attempts; IQ409 if its key is held by another active job.';

-- ---- sql/functions/attempts/retry_horizon.sql ----
CREATE OR REPLACE FUNCTION idemq.retry_horizon(backoff jsonb, counted_attempts int, max_attempts int)
RETURNS interval
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_cap constant numeric := 36500 * 86400::numeric; -- 100 years of 365 days, in seconds
  v_last int;
  v_problem text := idemq._backoff_problem(backoff);
  v_total numeric := 0;
  v_delay numeric;
  v_previous numeric;
BEGIN
  IF counted_attempts IS NULL OR max_attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'retry_horizon: counted_attempts and max_attempts must not be NULL',
      HINT = 'Pass the job''s attempt - uncounted (0 before its first attempt) and its max_attempts.';
  END IF;
  IF counted_attempts < 0 OR max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_horizon: counted_attempts must be at least 0 and max_attempts at least 1, not %s and %s',
                       counted_attempts, max_attempts),
      HINT = 'Pass the job''s attempt - uncounted (0 before its first attempt) and its max_attempts.';
  END IF;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_horizon: %s', v_problem),
      HINT = 'Pass a job''s backoff column, or NULL for the default.';
  END IF;
  v_last := max_attempts - 1;
  FOR v_failure IN greatest(counted_attempts, 1) .. v_last LOOP
    v_delay := extract(epoch FROM idemq._backoff_delay(backoff, v_failure, draw => 1));
    IF v_delay = v_previous THEN
      -- Constant from here on: multiply.
      v_total := v_total + v_delay * (v_last - v_failure + 1);
      EXIT;
    END IF;
    v_total := v_total + v_delay;
    v_previous := v_delay;
    -- A slowly growing exponential (factor near 1) reaches neither the cap nor
    -- a constant delay: 100,000 delays are plenty for a diagnosis.
    EXIT WHEN v_total >= v_cap OR v_failure - counted_attempts > 100000;
  END LOOP;
  RETURN make_interval(secs => least(v_total, v_cap)::float8);
END;
$$;

COMMENT ON FUNCTION idemq.retry_horizon(jsonb, int, int) IS
  'Longest time the remaining retries of a job can take (the worst-case backoff delays summed, at most 100 years).';

-- ---- sql/functions/admin/retry_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq.retry_jobs(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_batch record;
  v_id bigint;
BEGIN
  SELECT * INTO v_batch FROM idemq._bulk_batch('retry_jobs', filter, 'retry', before_id, max_jobs);
  touched := 0;
  FOREACH v_id IN ARRAY v_batch.job_ids LOOP
    BEGIN
      PERFORM idemq.retry(v_id);
      touched := touched + 1;
    EXCEPTION WHEN SQLSTATE 'IQ409' THEN
      NULL; -- its key is held by another active job: retry() changed nothing
    END;
  END LOOP;
  skipped := v_batch.batch - touched;
  more := v_batch.more;
  next_before_id := v_batch.next_before_id;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.retry_jobs(jsonb, bigint, int) IS
  'Retry the failed, cancelled or expired jobs a filter matches, one batch of at most max_jobs per call (retry() each).';

-- ---- sql/functions/reads/roll_up.sql ----
CREATE OR REPLACE FUNCTION idemq.roll_up()
RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planner trap: the estimates of the sample (generate_series guessed at
-- 1,000 minutes, 100 rows each) and of _oldest_runnable()'s recursion pass
-- jit_above_cost, and compiling took 370 of a 420 ms call that ran 2 ms
-- of queries (auto_explain, 20 groups, PostgreSQL 15); without JIT: a few ms.
SET jit = off
AS $$
#variable_conflict error
DECLARE
  v_now constant timestamptz := now();
  v_minute constant timestamptz := idemq._minute_of(now());
  v_overlap constant interval := '2 minutes';
  v_first constant interval := '1 hour';
  v_sample constant int := 100;
  -- Every worker calls it each minute; one roll-up a minute is enough.
  v_every constant interval := '50 seconds';
  v_mark timestamptz;
  v_from timestamptz;
  v_written int;
  v_sampled int;
  v_deleted int;
BEGIN
  -- Inserted by the first call; only then, as an insert that meets the row
  -- would wait for a caller's update of it (SKIP LOCKED below must not wait).
  IF NOT EXISTS (SELECT FROM idemq.job_minutes_mark) THEN
    INSERT INTO idemq.job_minutes_mark (rolled_at) VALUES ('-infinity') ON CONFLICT (one_row) DO NOTHING;
  END IF;
  SELECT m.rolled_at INTO v_mark FROM idemq.job_minutes_mark m FOR UPDATE SKIP LOCKED;
  IF NOT FOUND OR v_mark > v_now - v_every THEN
    RETURN 0;
  END IF;
  v_from := idemq._minute_of(greatest(v_mark - v_overlap, v_now - v_first));

  WITH sample AS MATERIALIZED (
    SELECT g.minute, s.queue, s.task,
           greatest(extract(epoch FROM s.finished_at - s.locked_at) * 1000, 0) AS run_ms,
           greatest(extract(epoch FROM s.locked_at - s.run_at) * 1000, 0) AS wait_ms
    FROM generate_series(v_from, v_now, interval '1 minute') g(minute)
    CROSS JOIN unnest('{succeeded,failed}'::idemq.job_state[]) st(state)
    CROSS JOIN LATERAL (
      -- A range of jobs_by_finish (state, finished_at), its first rows only.
      SELECT j.queue, j.task, j.locked_at, j.run_at, j.finished_at
      FROM idemq.jobs j
      WHERE j.state = st.state AND j.finished_at >= g.minute AND j.finished_at < g.minute + interval '1 minute'
      ORDER BY j.finished_at
      LIMIT v_sample
    ) s
    WHERE s.locked_at IS NOT NULL
  ), buckets AS (
    SELECT b.minute, b.queue, b.task, b.measure, jsonb_object_agg(b.bucket, b.n) AS counts
    FROM (SELECT x.minute, x.queue, x.task, v.measure, width_bucket(v.ms, idemq._duration_buckets()) AS bucket, count(*) AS n
          FROM sample x CROSS JOIN LATERAL (VALUES ('run', x.run_ms), ('wait', x.wait_ms)) v(measure, ms)
          GROUP BY 1, 2, 3, 4, 5) b
    GROUP BY b.minute, b.queue, b.task, b.measure
  ), fresh AS MATERIALIZED (
    SELECT k.minute, k.queue, k.task,
           coalesce((SELECT b.counts FROM buckets b
                     WHERE (b.minute, b.queue, b.task, b.measure) = (k.minute, k.queue, k.task, 'run')), '{}') AS run_buckets,
           coalesce((SELECT b.counts FROM buckets b
                     WHERE (b.minute, b.queue, b.task, b.measure) = (k.minute, k.queue, k.task, 'wait')), '{}') AS wait_buckets
    FROM (SELECT DISTINCT b.minute, b.queue, b.task FROM buckets b) k
  ), rows AS (
    SELECT f.minute, f.queue, f.task, f.run_buckets, f.wait_buckets FROM fresh f
    UNION ALL
    -- A minute in the window whose jobs are gone (purged) has none now.
    SELECT m.minute, m.queue, m.task, '{}'::jsonb, '{}'::jsonb
    FROM idemq.job_minutes m
    WHERE m.minute >= v_from AND (m.run_buckets <> '{}' OR m.wait_buckets <> '{}')
      AND NOT EXISTS (SELECT FROM fresh f WHERE (f.minute, f.queue, f.task) = (m.minute, m.queue, m.task))
  )
  INSERT INTO idemq.job_minutes AS m (minute, queue, task, run_buckets, wait_buckets)
  SELECT r.minute, r.queue, r.task, r.run_buckets, r.wait_buckets
  FROM rows r
  ORDER BY r.minute, r.queue, r.task
  ON CONFLICT (minute, queue, task) DO UPDATE
  SET run_buckets = excluded.run_buckets, wait_buckets = excluded.wait_buckets
  WHERE (m.run_buckets, m.wait_buckets) IS DISTINCT FROM (excluded.run_buckets, excluded.wait_buckets);
  GET DIAGNOSTICS v_written = ROW_COUNT;

  -- The sample: this minute's waiting jobs, per queue and task.
  UPDATE idemq.job_minutes m SET waiting = 0, oldest_waiting_seconds = 0
  WHERE m.minute = v_minute AND m.waiting IS DISTINCT FROM 0;
  WITH waiting AS (
    SELECT c.queue, c.task, sum(c.jobs) AS jobs
    FROM idemq._job_counts() c
    WHERE c.state IN ('enqueued', 'scheduled')
    GROUP BY c.queue, c.task
  )
  INSERT INTO idemq.job_minutes AS m (minute, queue, task, waiting, oldest_waiting_seconds)
  SELECT v_minute, w.queue, w.task, w.jobs, coalesce(o.oldest_seconds, 0)
  FROM waiting w
  LEFT JOIN idemq._oldest_runnable() o ON (o.queue, o.task) = (w.queue, w.task)
  ORDER BY w.queue, w.task
  ON CONFLICT (minute, queue, task) DO UPDATE
  SET waiting = excluded.waiting, oldest_waiting_seconds = excluded.oldest_waiting_seconds;
  GET DIAGNOSTICS v_sampled = ROW_COUNT;

  DELETE FROM idemq.job_minutes m WHERE m.minute < v_now - idemq._history_kept();
  GET DIAGNOSTICS v_deleted = ROW_COUNT;

  UPDATE idemq.job_minutes_mark SET rolled_at = v_now;
  RETURN v_written + v_sampled + v_deleted;
END;
$$;

COMMENT ON FUNCTION idemq.roll_up() IS
  'Dashboard history (idemq.job_minutes): run and wait time buckets from a bounded sample of recent finishes, waiting jobs sampled, minutes older than a day deleted.';

-- ---- sql/functions/admin/run_jobs_now.sql ----
CREATE OR REPLACE FUNCTION idemq.run_jobs_now(filter jsonb, before_id bigint DEFAULT NULL, max_jobs int DEFAULT 1000)
RETURNS TABLE(touched int, skipped int, more boolean, next_before_id bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_batch record;
  v_id bigint;
BEGIN
  SELECT * INTO v_batch FROM idemq._bulk_batch('run_jobs_now', filter, 'run_now', before_id, max_jobs);
  FOREACH v_id IN ARRAY v_batch.job_ids LOOP
    PERFORM idemq.reschedule(v_id, now());
  END LOOP;
  touched := cardinality(v_batch.job_ids);
  skipped := v_batch.batch - touched;
  more := v_batch.more;
  next_before_id := v_batch.next_before_id;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.run_jobs_now(jsonb, bigint, int) IS
  'Enqueue the scheduled jobs a filter matches now (reschedule() each), one batch of at most max_jobs per call.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.schedules;
-- ---- sql/functions/schedules/schedules.sql ----
CREATE OR REPLACE FUNCTION idemq.schedules()
RETURNS TABLE(name text, cron text, timezone text, task text, queue text, payload jsonb,
              priority int, max_attempts int, overlap idemq.schedule_overlap, misfire idemq.schedule_misfire,
              misfire_grace interval, next_at timestamptz, last_slot_at timestamptz, last_job_id bigint,
              last_job_state idemq.job_state, skipped bigint, created_at timestamptz, updated_at timestamptz,
              last_error text, last_error_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  -- session_user, as job() (inside SECURITY DEFINER current_user is the owner).
  SELECT s.name, s.cron, s.timezone, s.task, s.queue,
         CASE WHEN has_table_privilege(session_user, 'idemq.schedules', 'SELECT') THEN s.payload END, s.priority, s.max_attempts, s.overlap,
         s.misfire, s.misfire_grace, s.next_at, s.last_slot_at, s.last_job_id, j.state, s.skipped,
         s.created_at, s.updated_at, s.last_error, s.last_error_at
  FROM idemq.schedules s
  LEFT JOIN idemq.jobs j ON j.id = s.last_job_id
  ORDER BY s.name;
$$;

COMMENT ON FUNCTION idemq.schedules() IS
  'List the recurring schedules, with the state of each one''s latest job.';

-- ---- sql/functions/install/schema_version.sql ----
CREATE OR REPLACE FUNCTION idemq.schema_version()
RETURNS text
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT m.name::text FROM idemq_meta.migrations m ORDER BY m.run_on DESC, m.id DESC LIMIT 1
$$;

COMMENT ON FUNCTION idemq.schema_version() IS
  'The latest migration applied to this database (its release is in the name), for version checks at start.';

-- ---- sql/functions/flow/set_limit.sql ----
CREATE OR REPLACE FUNCTION idemq.set_limit(queue text DEFAULT NULL, task text DEFAULT NULL, concurrency int DEFAULT NULL,
                                           rate int DEFAULT NULL, per interval DEFAULT NULL, per_key int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_kind text;
  v_name text;
  v_row idemq.limits;
  v_rows int;
  v_first int;
  v_created boolean := false;
BEGIN
  SELECT s.kind, s.name INTO v_kind, v_name FROM idemq._limit_scope('set_limit', set_limit.queue, set_limit.task) s;
  IF set_limit.concurrency IS NULL AND set_limit.rate IS NULL AND set_limit.per IS NULL AND set_limit.per_key IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'set_limit: give at least one limit: concurrency, rate with per, or per_key',
      HINT = 'e.g. set_limit(queue => ''emails'', concurrency => 5, rate => 100, per => ''1 minute''); clear_limit removes limits.';
  END IF;
  PERFORM idemq._check_limit_values('set_limit', set_limit.concurrency, set_limit.rate, set_limit.per, set_limit.per_key);

  -- A new concurrency limit must see every job of its scope that is or will
  -- be processing: wait for the claims in flight, hold off new ones. Taken
  -- before this call reads the table (so two calls never hold its ACCESS
  -- SHARE lock and wait for each other's), whenever concurrency is given.
  IF set_limit.concurrency IS NOT NULL THEN
    LOCK TABLE idemq.limits IN ACCESS EXCLUSIVE MODE;
  END IF;
  SELECT l.* INTO v_row FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name;
  IF v_row.id IS NULL THEN
    INSERT INTO idemq.limits AS l (kind, name, concurrency, rate, per, per_key)
    VALUES (v_kind, v_name, set_limit.concurrency, set_limit.rate, set_limit.per, set_limit.per_key)
    ON CONFLICT ON CONSTRAINT limits_scope DO NOTHING
    RETURNING l.* INTO v_row;
    IF v_row.id IS NOT NULL THEN
      v_created := true;
    ELSE
      SELECT l.* INTO v_row FROM idemq.limits l WHERE l.kind = v_kind AND l.name = v_name;
    END IF;
  END IF;
  -- Slots and starts before the limits row: a slot's release takes them in
  -- that order too.
  PERFORM FROM idemq.limit_slots s WHERE s.limit_id = v_row.id ORDER BY s.slot FOR UPDATE;
  IF set_limit.rate IS NOT NULL THEN
    PERFORM FROM idemq.limit_starts r WHERE r.limit_id = v_row.id ORDER BY r.n FOR UPDATE;
  END IF;
  SELECT l.* INTO v_row FROM idemq.limits l WHERE l.id = v_row.id FOR UPDATE;
  IF v_created THEN
    -- Inserted above with the limits given: it has no slot or start yet.
    v_row.concurrency := NULL;
    v_row.rate := NULL;
  END IF;

  IF set_limit.concurrency IS NOT NULL THEN
    IF v_row.concurrency IS NULL THEN
      -- A new limit: the jobs of the scope processing now hold slots of its
      -- first stripe (they name none of its stripes: a job's release goes
      -- to first_slot when it names an older one or none). Releases left of
      -- an earlier limit of the scope name stripes gone with it.
      DELETE FROM idemq.limit_releases r WHERE r.limit_id = v_row.id;
      INSERT INTO idemq.limit_slots (limit_id, slot, size, held)
      SELECT v_row.id, nextval('idemq.limit_slot_numbers'), 0, count(*)
      FROM idemq.jobs j
      WHERE j.state = 'processing'
        AND ((v_kind = 'queue' AND j.queue = v_name) OR (v_kind = 'task' AND j.task = v_name))
      RETURNING slot INTO v_first;
    END IF;
    UPDATE idemq.limits AS l SET concurrency = set_limit.concurrency, first_slot = coalesce(v_first, l.first_slot)
    WHERE l.id = v_row.id;
    -- Raised: room for the new slots; lowered below what runs: no room until
    -- fewer than the new limit run (_size_slots).
    PERFORM idemq._size_slots(v_row.id, set_limit.concurrency);
    v_row.concurrency := set_limit.concurrency;
  END IF;

  IF set_limit.rate IS NOT NULL THEN
    v_rows := coalesce(v_row.rate, 0);
    IF set_limit.rate > v_rows THEN
      INSERT INTO idemq.limit_starts (limit_id, n, per)
      SELECT v_row.id, coalesce((SELECT max(r.n) FROM idemq.limit_starts r WHERE r.limit_id = v_row.id), 0) + g, set_limit.per
      FROM generate_series(1, set_limit.rate - v_rows) g;
    ELSIF set_limit.rate < v_rows THEN
      -- Keep the rows used last: a start after the change waits for one of
      -- them, and every row deleted was used before all of them.
      DELETE FROM idemq.limit_starts r
      WHERE r.limit_id = v_row.id
        AND r.n IN (SELECT o.n FROM idemq.limit_starts o WHERE o.limit_id = v_row.id
                    ORDER BY o.started_at, o.n LIMIT v_rows - set_limit.rate);
    END IF;
    UPDATE idemq.limit_starts r SET per = set_limit.per WHERE r.limit_id = v_row.id AND r.per <> set_limit.per;
    v_row.rate := set_limit.rate;
    v_row.per := set_limit.per;
  END IF;

  UPDATE idemq.limits l
  SET concurrency = v_row.concurrency, rate = v_row.rate, per = v_row.per,
      per_key = coalesce(set_limit.per_key, l.per_key), updated_at = now()
  WHERE l.id = v_row.id;
  -- A raised per_key: the scope's keys with jobs waiting get their room now.
  IF set_limit.per_key > 1 THEN
    PERFORM idemq._key_promote(ARRAY(
      SELECT DISTINCT w.concurrency_key FROM idemq.jobs w
      WHERE w.concurrency_key IS NOT NULL AND w.state = 'awaiting'
        AND CASE v_kind WHEN 'queue' THEN w.queue ELSE w.task END = v_name));
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.set_limit(text, text, int, int, interval, int) IS
  'Set the flow control of one queue or task: concurrency (at most N processing), rate per per (starts per period), per_key; fields left NULL are kept.';

-- ---- sql/functions/steps/sleep.sql ----
CREATE OR REPLACE FUNCTION idemq.sleep(job_id bigint, attempt int, name text, wake_at timestamptz,
                                       lease_token uuid DEFAULT NULL)
RETURNS TABLE(parked boolean, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_step record;
BEGIN
  PERFORM idemq._check_step('sleep', sleep.job_id, sleep.name, NULL);
  IF sleep.wake_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('sleep: job %s, step "%s": wake_at must not be NULL', sleep.job_id, idemq._excerpt(sleep.name)),
      HINT = 'Pass when the sleep ends, e.g. now() + interval ''1 hour''.';
  END IF;
  PERFORM idemq._check_instant('sleep', 'wake_at', sleep.wake_at);
  PERFORM idemq._lock_held('sleep', sleep.job_id, sleep.attempt, sleep.lease_token);

  INSERT INTO idemq.job_steps AS s (job_id, name, kind, status, attempt, wake_at)
  VALUES (sleep.job_id, sleep.name, 'sleep', 'sleeping', sleep.attempt, sleep.wake_at)
  ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING;
  SELECT s.kind, s.wake_at INTO v_step FROM idemq.job_steps s
  WHERE s.job_id = sleep.job_id AND s.name = sleep.name;
  IF v_step.kind <> 'sleep' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('sleep: job %s recorded step "%s" as a %s, not a sleep', sleep.job_id,
                       idemq._excerpt(sleep.name), v_step.kind),
      HINT = 'The handler no longer takes its steps in the order its recorded ones were taken: name the sleep, '
             'or keep the old handler for jobs already running (docs/worker.md, "Changing a workflow").';
  END IF;
  run_at := v_step.wake_at;
  parked := v_step.wake_at > now();
  IF parked THEN
    PERFORM idemq.snooze(sleep.job_id, sleep.attempt, v_step.wake_at, sleep.lease_token);
  END IF;
  RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION idemq.sleep(bigint, int, text, timestamptz, uuid) IS
  'Durable sleep of a held job: record the wake time once, park the job until then without spending an attempt, or say it is over.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.snooze;
-- ---- sql/functions/attempts/snooze.sql ----
CREATE OR REPLACE FUNCTION idemq.snooze(job_id bigint, attempt int, run_at timestamptz, lease_token uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_queue text;
BEGIN
  IF snooze.run_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'snooze: run_at must not be NULL',
      HINT = 'Pass when the job should run again, e.g. now() + interval ''1 minute''.';
  END IF;
  PERFORM idemq._check_instant('snooze', 'run_at', snooze.run_at);
  UPDATE idemq.jobs AS j
  SET state = 'scheduled', run_at = snooze.run_at, uncounted = j.uncounted + 1,
      locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = snooze.job_id AND j.attempt = snooze.attempt
    AND j.lease_token IS NOT DISTINCT FROM snooze.lease_token
    AND idemq._held(j.lease_expires_at, j.locked_by)
  RETURNING j.queue INTO v_queue;
  IF NOT FOUND THEN
    PERFORM idemq._raise_not_held(snooze.job_id, snooze.attempt, 'snooze');
  END IF;
  IF snooze.run_at <= now() THEN
    PERFORM idemq._notify_waiting(v_queue);
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.snooze(bigint, int, timestamptz, uuid) IS
  'Reschedule a held job without spending an attempt (rate limits, dependencies).';

-- ---- sql/functions/children/spawn.sql ----
CREATE OR REPLACE FUNCTION idemq.spawn(job_id bigint, attempt int, children jsonb, lease_token uuid DEFAULT NULL,
                                       fail_fast boolean DEFAULT false)
RETURNS TABLE(name text, child_job_id bigint, state idemq.job_state, result jsonb, last_error jsonb, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict error
DECLARE
  v_problem text;
  v_new jsonb;
  v_new_names text[];
  v_parsed record;
  v_planned idemq._planned_job[];
  v_refused record;
  v_message text;
BEGIN
  IF spawn.children IS NULL OR spawn.fail_fast IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('spawn: %s must not be NULL', CASE WHEN spawn.children IS NULL THEN 'children' ELSE 'fail_fast' END),
      HINT = 'Pass children as a JSON array like [{"name": "a", "task": "resize", "payload": {}}].';
  END IF;
  IF jsonb_typeof(spawn.children) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('spawn: children must be a JSON array of objects, not %s', jsonb_typeof(spawn.children)),
      HINT = 'Pass children as a JSON array like [{"name": "a", "task": "resize", "payload": {}}].';
  END IF;
  -- One pass over the elements (a hash of the names); only a call that
  -- fails it looks for its first bad element, in order.
  IF EXISTS (SELECT FROM jsonb_array_elements(spawn.children) AS x(e)
             WHERE jsonb_typeof(x.e) <> 'object' OR jsonb_typeof(x.e -> 'name') IS DISTINCT FROM 'string'
                OR x.e ->> 'name' = '' OR length(x.e ->> 'name') > 200)
     OR EXISTS (SELECT FROM jsonb_array_elements(spawn.children) AS x(e)
                GROUP BY x.e ->> 'name' HAVING count(*) > 1) THEN
    SELECT format('children[%s] %s', x.ord, CASE
             WHEN jsonb_typeof(x.e) <> 'object' THEN format('must be an object, not %s', jsonb_typeof(x.e))
             WHEN NOT x.e ? 'name' THEN 'has no "name"'
             WHEN jsonb_typeof(x.e -> 'name') <> 'string' THEN format('has a name that is not a string: %s', idemq._excerpt((x.e -> 'name')::text))
             WHEN x.e ->> 'name' = '' THEN 'has an empty name'
             WHEN length(x.e ->> 'name') > 200 THEN format('has a name of %s characters, over 200', length(x.e ->> 'name'))
             ELSE format('has the name "%s" of an earlier element', idemq._excerpt(x.e ->> 'name')) END)
    INTO v_problem
    FROM (SELECT y.e, y.ord, row_number() OVER (PARTITION BY y.e -> 'name' ORDER BY y.ord) AS nth
          FROM jsonb_array_elements(spawn.children) WITH ORDINALITY AS y(e, ord)) x
    WHERE jsonb_typeof(x.e) <> 'object' OR jsonb_typeof(x.e -> 'name') IS DISTINCT FROM 'string'
       OR x.e ->> 'name' = '' OR length(x.e ->> 'name') > 200 OR x.nth > 1
    ORDER BY x.ord
    LIMIT 1;
  END IF;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'spawn: ' || v_problem,
      HINT = 'Each child is an object with a unique "name" (1 to 200 characters; a replay finds the child by it) and enqueue_many''s fields.';
  END IF;

  PERFORM idemq._lock_held('spawn', spawn.job_id, spawn.attempt, spawn.lease_token);
  UPDATE idemq.jobs AS j SET has_children = true WHERE j.id = spawn.job_id AND NOT j.has_children;

  -- The children not linked yet, without their names, in the call's order.
  SELECT jsonb_agg(x.e - 'name' ORDER BY x.ord), array_agg(x.e ->> 'name' ORDER BY x.ord)
  INTO v_new, v_new_names
  FROM jsonb_array_elements(spawn.children) WITH ORDINALITY AS x(e, ord)
  WHERE NOT EXISTS (SELECT FROM idemq.job_children c WHERE c.parent_id = spawn.job_id AND c.name = x.e ->> 'name');

  IF v_new IS NOT NULL THEN
    BEGIN
      v_parsed := idemq._parse_jobs(v_new);
    EXCEPTION WHEN SQLSTATE '22023' OR SQLSTATE '22004' THEN
      GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'spawn: ' || v_message,
        HINT = 'jobs[N] is the N-th child of this call not spawned before; each child takes enqueue_many''s fields besides its name.';
    END;
    v_planned := idemq._enqueue_planned(v_parsed.planned, v_parsed.keyed, v_parsed.parents, as_children => true);
    SELECT p.ordinal, p.idempotency_key, p.outcome, p.job_id, p.existing_state INTO v_refused
    FROM unnest(v_planned) p
    WHERE p.outcome NOT IN ('created', 'deduplicated')
    ORDER BY p.ordinal
    LIMIT 1;
    IF FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'IQ409',
        MESSAGE = format('spawn: child "%s" of job %s was not enqueued: its idempotency key "%s" %s',
                         idemq._excerpt(v_new_names[v_refused.ordinal]), spawn.job_id, idemq._excerpt(v_refused.idempotency_key),
                         CASE WHEN v_refused.outcome = 'conflict' THEN 'is held by an active job doing different work'
                              ELSE 'is refused by its duplicate policy' END),
        DETAIL = jsonb_build_object('key', v_refused.idempotency_key, 'existing_job_id', v_refused.job_id,
                                    'existing_state', v_refused.existing_state, 'name', v_new_names[v_refused.ordinal])::text,
        HINT = 'Give the child another key, or none (its name already makes the spawn idempotent); nothing was spawned.';
    END IF;

  END IF;
  -- With nothing new (a replay) it links nothing and only sets fail_fast.
  PERFORM idemq._link_children(spawn.job_id, v_planned, v_new_names, spawn.fail_fast);

  RETURN QUERY
  SELECT c.name, c.child_id, coalesce(c.state, j.state), c.result, c.last_error, coalesce(p.outcome, 'existing')
  FROM jsonb_array_elements(spawn.children) WITH ORDINALITY AS x(e, ord)
  JOIN idemq.job_children c ON c.parent_id = spawn.job_id AND c.name = x.e ->> 'name'
  LEFT JOIN idemq.jobs j ON j.id = c.child_id
  LEFT JOIN (SELECT v_new_names[q.ordinal] AS name, q.outcome FROM unnest(v_planned) q) p ON p.name = c.name
  ORDER BY x.ord;
END;
$$;

COMMENT ON FUNCTION idemq.spawn(bigint, int, jsonb, uuid, boolean) IS
  'Fan-out: enqueue named child jobs of the held job (idempotent by name) and count them for its wait_for_children.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.stats;
-- ---- sql/functions/reads/stats.sql ----
CREATE OR REPLACE FUNCTION idemq.stats()
RETURNS TABLE(queue text, task text, metric text, value bigint, waiting_for idemq.waiting_reason)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  -- limits() once for every (queue, task), not once per row.
  WITH waits AS MATERIALIZED (
    SELECT w.queue, w.task, w.waiting_for FROM idemq._scope_waits() w WHERE w.waiting_for IS NOT NULL
  )
  SELECT c.queue, c.task, c.state::text, c.jobs,
         CASE WHEN c.state = 'enqueued' THEN
           (SELECT min(w.waiting_for) FROM waits w WHERE w.queue = c.queue OR w.task = c.task) END
  FROM idemq._job_counts() c
  UNION ALL
  -- "state = 'processing'" is the predicate of jobs_leases: a range scan of
  -- the leases that ran out, whatever else the table holds.
  SELECT j.queue, j.task, 'lease_expired', count(*), NULL::idemq.waiting_reason
  FROM idemq.jobs j
  WHERE j.state = 'processing' AND j.lease_expires_at < now()
  GROUP BY j.queue, j.task
  UNION ALL
  SELECT r.queue, r.task, 'oldest_runnable_seconds', r.oldest_seconds,
         (SELECT min(w.waiting_for) FROM waits w WHERE w.queue = r.queue OR w.task = r.task)
  FROM idemq._oldest_runnable() r
  UNION ALL
  SELECT NULL, c.task, c.event, sum(c.n)::bigint, NULL
  FROM idemq.counters c
  GROUP BY c.task, c.event
  ORDER BY 1, 2, 3;
END;
$$;

COMMENT ON FUNCTION idemq.stats() IS
  'Counts per queue, task and state, expired leases, oldest runnable age (with why runnable jobs wait: waiting_for), and duplicate/rejection events per task.';

-- ---- sql/functions/steps/step_record.sql ----
CREATE OR REPLACE FUNCTION idemq.step_record(job_id bigint, attempt int, name text, result jsonb DEFAULT NULL,
                                             lease_token uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  PERFORM idemq._check_step('step_record', step_record.job_id, step_record.name, step_record.result);
  PERFORM idemq._lock_held('step_record', step_record.job_id, step_record.attempt, step_record.lease_token);
  INSERT INTO idemq.job_steps AS s (job_id, name, kind, status, result, attempt)
  VALUES (step_record.job_id, step_record.name, 'step', 'done', step_record.result, step_record.attempt)
  ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '23505',
      MESSAGE = format('step_record: job %s already recorded step "%s"', step_record.job_id,
                       idemq._excerpt(step_record.name)),
      DETAIL = jsonb_build_object('job_id', step_record.job_id, 'name', step_record.name)::text,
      HINT = 'A step is recorded once: read the job''s steps (idemq.steps) first and use the recorded result.';
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq.step_record(bigint, int, text, jsonb, uuid) IS
  'Record a held job''s completed step with its result, fenced like complete(); in the transaction of the step''s writes.';

-- ---- sql/functions/steps/steps.sql ----
CREATE OR REPLACE FUNCTION idemq.steps(job_id bigint)
RETURNS TABLE(name text, kind text, status text, result jsonb, attempt int, recorded_at timestamptz,
              wake_at timestamptz, event text, event_key text, over boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF steps.job_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'steps: job_id must not be NULL',
      HINT = 'Pass the id of the job whose steps to read.';
  END IF;
  RETURN QUERY
  SELECT s.name, s.kind, s.status, s.result, s.attempt, s.recorded_at, s.wake_at, s.event, s.event_key,
         s.status IN ('done', 'received', 'timed_out') OR (s.status = 'sleeping' AND s.wake_at <= now())
  FROM idemq.job_steps s
  WHERE s.job_id = steps.job_id
  ORDER BY s.recorded_at, s.name;
END;
$$;

COMMENT ON FUNCTION idemq.steps(bigint) IS
  'A job''s step ledger (steps, sleeps, event waits) with results, oldest first; over: a replay passes it without a call.';

-- ---- sql/functions/workers/unserved_jobs.sql ----
CREATE OR REPLACE FUNCTION idemq.unserved_jobs(seen_within interval)
RETURNS TABLE(queue text, task text, jobs bigint, oldest_runnable_seconds bigint, last_seen_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_since timestamptz;
BEGIN
  IF seen_within IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'unserved_jobs: seen_within must not be NULL',
      HINT = 'Pass how recently a worker must have been seen to count, e.g. ''2 minutes''.';
  END IF;
  IF seen_within <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('unserved_jobs: seen_within must be positive, not %s', seen_within),
      HINT = 'Workers refresh their row every 15 seconds by default: pass a few times that, e.g. ''2 minutes''.';
  END IF;
  PERFORM idemq._check_duration('unserved_jobs', 'seen_within', seen_within);
  v_since := now() - seen_within;

  RETURN QUERY
  SELECT r.queue, r.task, r.jobs, r.oldest_seconds, c.last_seen_at
  FROM idemq._runnable_jobs() r
  LEFT JOIN LATERAL (
    SELECT max(w.last_seen_at) AS last_seen_at
    FROM idemq.workers w
    -- A stopped worker's row is kept for the dashboard (worker_stopped): it serves nothing.
    WHERE w.stopped_at IS NULL
      AND (w.queues IS NULL OR r.queue = ANY (w.queues))
      AND (w.tasks IS NULL OR r.task = ANY (w.tasks))) c ON true
  WHERE c.last_seen_at IS NULL OR c.last_seen_at < v_since
  ORDER BY r.oldest_seconds DESC, r.queue, r.task;
END;
$$;

COMMENT ON FUNCTION idemq.unserved_jobs(interval) IS
  'Runnable jobs per queue and task that no worker seen within seen_within claims (count, oldest age, last seen).';

-- ---- sql/functions/children/wait_for_children.sql ----
CREATE OR REPLACE FUNCTION idemq.wait_for_children(job_id bigint, attempt int, lease_token uuid DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_wait record;
BEGIN
  SELECT w.pending, w.failed, w.fail_fast INTO v_wait
  FROM idemq.child_waits w
  WHERE w.parent_id = wait_for_children.job_id
  FOR UPDATE;
  IF NOT FOUND OR v_wait.pending = 0 OR (v_wait.fail_fast AND v_wait.failed > 0) THEN
    PERFORM idemq._lock_held('wait_for_children', wait_for_children.job_id, wait_for_children.attempt,
                             wait_for_children.lease_token);
    RETURN false;
  END IF;
  -- The gate first: the UPDATE's trigger (_count_jobs) may promote waiting
  -- jobs of the job's concurrency key, and must not take this one.
  INSERT INTO idemq.job_dependencies (parent_id, child_id)
  VALUES (wait_for_children.job_id, wait_for_children.job_id)
  ON CONFLICT DO NOTHING;
  PERFORM idemq._lock_held('wait_for_children', wait_for_children.job_id, wait_for_children.attempt,
                           wait_for_children.lease_token);
  UPDATE idemq.jobs AS j
  SET state = 'awaiting', uncounted = j.uncounted + 1, locked_by = NULL, lease_expires_at = NULL
  WHERE j.id = wait_for_children.job_id;
  RETURN true;
END;
$$;

COMMENT ON FUNCTION idemq.wait_for_children(bigint, int, uuid) IS
  'Fan-in: park the held job (awaiting, attempt not spent) until its spawned children have finished; false when none is left to wait for.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.worker_seen;
-- ---- sql/functions/workers/worker_seen.sql ----
CREATE OR REPLACE FUNCTION idemq.worker_seen(
  worker_id text,
  queues text[] DEFAULT NULL,
  tasks text[] DEFAULT NULL,
  host text DEFAULT NULL,
  pid int DEFAULT NULL,
  concurrency int DEFAULT NULL,
  refresh_every interval DEFAULT NULL,
  outages int DEFAULT NULL,
  outage_ms bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_names bigint := idemq._limit('worker_names');
  v_task text;
BEGIN
  IF worker_id IS NULL OR worker_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN worker_id IS NULL THEN '22004' ELSE '22023' END,
      MESSAGE = 'worker_seen: worker_id must be a non-empty string',
      HINT = 'Pass the worker id the worker claims with (claim''s worker_id).';
  END IF;
  PERFORM idemq._check_size('worker_seen', 'worker_id', worker_id, 'worker_id_bytes',
    'Use a shorter worker id, e.g. hostname:pid; claim() refuses the same.');
  IF coalesce(cardinality(queues), 0) + coalesce(cardinality(tasks), 0) > v_names THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: %s queue and task names, over the limit of %s (worker_names)',
                       coalesce(cardinality(queues), 0) + coalesce(cardinality(tasks), 0), v_names),
      HINT = 'Pass NULL for every queue or any task, or raise worker_names in idemq.settings.';
  END IF;
  IF NOT idemq._names_valid(queues)
     OR EXISTS (SELECT 1 FROM unnest(queues) q WHERE length(q) > idemq._queue_name_limit()) THEN
    PERFORM idemq._raise_bad_names('worker_seen', 'queues', queues, 'every queue',
      'Pass the queues the worker claims from, as claim() gets them.', idemq._queue_name_limit());
  END IF;
  IF NOT idemq._names_valid(tasks) THEN
    PERFORM idemq._raise_bad_names('worker_seen', 'tasks', tasks, 'any task',
      'Pass the task names the worker has, as claim() gets them.');
  END IF;
  IF host = '' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'worker_seen: host must not be empty',
      HINT = 'Pass the host name the worker runs on, or NULL when it is not known.';
  END IF;
  PERFORM idemq._check_size('worker_seen', 'host', host, 'worker_id_bytes',
    'Pass the host name the worker runs on (the worker id holds it too).');
  IF pid < 1 OR concurrency < 1 OR outages < 0 OR outage_ms < 0 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: pid and concurrency must be at least 1, outages and outage_ms at least 0; got pid %s, concurrency %s, outages %s, outage_ms %s',
                       pid, concurrency, outages, outage_ms),
      HINT = 'Pass the process id, the jobs the worker runs at once, and the outages it counted since it started (NULL when not known).';
  END IF;
  IF refresh_every <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('worker_seen: refresh_every must be positive, not %s', refresh_every),
      HINT = 'Pass how often the worker calls worker_seen, e.g. ''15 seconds''.';
  END IF;
  PERFORM idemq._check_duration('worker_seen', 'refresh_every', refresh_every);
  FOREACH v_task IN ARRAY coalesce(tasks, '{}') LOOP
    PERFORM idemq._check_size('worker_seen', 'a task name', v_task, 'task_bytes',
      'Task names longer than task_bytes cannot be enqueued: no job needs this one.');
  END LOOP;

  INSERT INTO idemq.workers AS w (worker_id, queues, tasks, host, pid, concurrency, refresh_every, outages, outage_ms, last_outage_at)
  VALUES (worker_seen.worker_id,
          (SELECT array_agg(DISTINCT q ORDER BY q) FROM unnest(worker_seen.queues) q),
          (SELECT array_agg(DISTINCT t ORDER BY t) FROM unnest(worker_seen.tasks) t),
          worker_seen.host, worker_seen.pid, worker_seen.concurrency, worker_seen.refresh_every,
          coalesce(worker_seen.outages, 0), coalesce(worker_seen.outage_ms, 0),
          CASE WHEN worker_seen.outages > 0 THEN now() END)
  ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
    SET queues = excluded.queues, tasks = excluded.tasks, last_seen_at = now(),
        started_at = CASE WHEN w.stopped_at IS NULL THEN w.started_at ELSE now() END, stopped_at = NULL,
        host = coalesce(worker_seen.host, w.host), pid = coalesce(worker_seen.pid, w.pid),
        concurrency = coalesce(worker_seen.concurrency, w.concurrency),
        refresh_every = coalesce(worker_seen.refresh_every, w.refresh_every),
        outages = coalesce(worker_seen.outages, w.outages),
        outage_ms = coalesce(worker_seen.outage_ms, w.outage_ms),
        last_outage_at = CASE WHEN worker_seen.outages > w.outages THEN now() ELSE w.last_outage_at END;
END;
$$;

COMMENT ON FUNCTION idemq.worker_seen(text, text[], text[], text, int, int, interval, int, bigint) IS
  'Register or refresh a worker''s presence (idemq.workers): its queues and tasks, host, pid, concurrency, refresh interval and outages lived through, last_seen_at = now().';

-- ---- sql/functions/workers/worker_stopped.sql ----
CREATE OR REPLACE FUNCTION idemq.worker_stopped(worker_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  IF worker_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = 'worker_stopped: worker_id must not be NULL',
      HINT = 'Pass the worker id the worker registered with worker_seen().';
  END IF;
  UPDATE idemq.workers w SET stopped_at = now()
  WHERE w.worker_id = worker_stopped.worker_id AND w.stopped_at IS NULL;
  RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION idemq.worker_stopped(text) IS
  'Mark a cleanly stopped worker''s presence row (idemq.workers) stopped, kept for stopped_worker_seconds; true when it had a live one.';

-- The signature changed: CREATE OR REPLACE cannot change it.
DROP FUNCTION idemq.workers;
-- ---- sql/functions/workers/workers.sql ----
CREATE OR REPLACE FUNCTION idemq.workers()
RETURNS TABLE(worker_id text, queues text[], tasks text[], started_at timestamptz, last_seen_at timestamptz,
              host text, pid int, concurrency int, refresh_every interval, late boolean,
              outages int, outage_ms bigint, last_outage_at timestamptz, stopped_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
BEGIN
  RETURN QUERY
  SELECT w.worker_id, w.queues, w.tasks, w.started_at, w.last_seen_at,
         w.host, w.pid, w.concurrency, w.refresh_every,
         CASE WHEN w.stopped_at IS NULL THEN w.last_seen_at < now() - 2 * w.refresh_every ELSE false END,
         w.outages, w.outage_ms, w.last_outage_at, w.stopped_at
  FROM idemq.workers w
  ORDER BY w.stopped_at IS NOT NULL, w.last_seen_at DESC, w.worker_id;
END;
$$;

COMMENT ON FUNCTION idemq.workers() IS
  'The workers registered with worker_seen(): queues, tasks, started_at, last_seen_at, host, pid, concurrency, whether late, outages lived through, when stopped (stale and recently stopped rows included).';

-- Private helpers are for the public functions only.
REVOKE EXECUTE ON FUNCTION idemq._action_states FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._bulk_batch FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_claimer FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_event FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_job_filter FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_limit_values FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_result FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._check_step FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._child_finished FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._claim_capped FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._claim_gate FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._claim_take FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._count_jobs FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._duration_buckets FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._duration_percentile FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._event_lock FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._history_kept FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._job_counts FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._key_admits FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._key_lock FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._key_promote FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._lease_until FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._limit_scope FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._link_children FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._lock_held FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._lock_slots FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._matching_jobs FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._minute_of FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._oldest_runnable FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._payload_problem FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._per_key FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._prune_events FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._release_waiting FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._repair_slots FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._result_limit FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._scope_waits FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._search_walk FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._size_slots FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._stripe_counts FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._stripe_of FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._enqueue_planned FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._insert_jobs FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idemq._pairs_by_id FROM PUBLIC;

-- PUBLIC gets nothing, the idemq roles what their names say (functions created here included).
SELECT count(*) FROM idemq._grant_roles();

-- ==== hand-written: after the functions (kept when migration:new amends this file) ====
-- This installation's roles, named, created (when this role may), granted,
-- and the cluster-wide roles' privileges here revoked.
SELECT count(*) FROM idemq._grant_roles();
-- The counts start from the jobs there are. The lock (CREATE TRIGGER's own)
-- waits for every transaction that wrote jobs and makes later writers wait
-- until this migration commits, so no write falls between the count and the
-- triggers, not even one made by a 0.1.0 function still running: a write
-- waiting here fires the triggers once it goes on. Readers are not blocked.
-- The count reads every job once (bench/migrate-locks.mjs measures it).
LOCK TABLE idemq.jobs IN SHARE ROW EXCLUSIVE MODE;
CREATE TRIGGER jobs_count_inserts AFTER INSERT ON idemq.jobs
    REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION idemq._count_jobs();
CREATE TRIGGER jobs_count_updates AFTER UPDATE ON idemq.jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION idemq._count_jobs();
CREATE TRIGGER jobs_count_deletes AFTER DELETE ON idemq.jobs
    REFERENCING OLD TABLE AS old_jobs FOR EACH STATEMENT EXECUTE FUNCTION idemq._count_jobs();
CREATE TRIGGER jobs_count_truncate AFTER TRUNCATE ON idemq.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION idemq._count_jobs();
INSERT INTO idemq.job_counts (queue, task, state, n)
SELECT j.queue, j.task, j.state, count(*) FROM idemq.jobs j GROUP BY j.queue, j.task, j.state;
-- Last: this ALTER TABLE takes an ACCESS EXCLUSIVE lock on idemq.jobs (a
-- catalog change only: a nullable column without a default rewrites
-- nothing), held until the commit, which follows at once. The functions
-- above that read the column are PL/pgSQL, resolved when they run.
ALTER TABLE idemq.jobs ADD COLUMN lease_token uuid;
-- Concurrency keys: the column and its two partial indexes (empty until a
-- job names a key, so they build at once).
ALTER TABLE idemq.jobs ADD COLUMN concurrency_key text;
CREATE INDEX jobs_key_admitted ON idemq.jobs USING btree (concurrency_key) WHERE ((concurrency_key IS NOT NULL) AND (state = ANY (ARRAY['enqueued'::idemq.job_state, 'scheduled'::idemq.job_state, 'processing'::idemq.job_state])));
CREATE INDEX jobs_key_waiting ON idemq.jobs USING btree (concurrency_key, priority DESC, run_at, id) WHERE ((concurrency_key IS NOT NULL) AND (state = 'awaiting'::idemq.job_state));
-- Planner trap: 0.1.0's jobs_awaiting (id) WHERE state = 'awaiting' (made
-- for a count the dashboard now reads from job_counts; every other read of
-- awaiting jobs is by id, which the primary key serves) let the planner
-- answer "a key's best waiting job" by walking every awaiting job and
-- filtering the key, whenever the statistics were taken while few jobs
-- waited (a table of finished jobs, then a keyed backlog): EXPLAIN ANALYZE,
-- 20,000 finished jobs analyzed, then 10,000 keyed jobs waiting: Index Scan
-- using jobs_awaiting, Rows Removed by Filter: 10480 per key, an
-- enqueue_many of 1,000 keyed jobs 19 ms growing to 74 ms as the backlog
-- grew (10.5 ms, flat, without the index). bench/FINDINGS.md, "The keyed
-- completion's cost". Dropped: the key's lookups can then only use
-- jobs_key_waiting.
DROP INDEX idemq.jobs_awaiting;
-- A job's time limit (enqueue(..., timeout)): the same lock, at the same
-- moment; NOT VALID, so the jobs there are (all NULL) are not scanned.
ALTER TABLE idemq.jobs ADD COLUMN timeout interval,
    ADD CONSTRAINT jobs_timeout_positive CHECK ((timeout > '00:00:00'::interval)) NOT VALID;
-- Flow control: the slots claim() gave the attempt (schema.sql says why).
ALTER TABLE idemq.jobs ADD COLUMN queue_slot integer, ADD COLUMN task_slot integer;
-- A held attempt's progress (progress()); NOT VALID as above: every row is NULL.
ALTER TABLE idemq.jobs ADD COLUMN progress smallint,
    ADD CONSTRAINT jobs_progress_percent CHECK (((progress >= 0) AND (progress <= 100))) NOT VALID;
-- Durable steps: how long an emitted event is kept for waits reached later.
INSERT INTO idemq.settings (name, value, min_value, max_value, description) VALUES
  ('event_retention_seconds', 604800, 60, 3153600000, 'how long an emitted event is kept for waits reached after it (await_event), in seconds (default 7 days)');
-- Results (issue 28): a job a client waits for (job_result(..., notify =>
-- true)) NOTIFYs idemq_results when it finishes. A constant default: no
-- rewrite, the same lock as the columns above.
ALTER TABLE idemq.jobs ADD COLUMN result_watched boolean DEFAULT false NOT NULL;
-- ==== end hand-written ====
