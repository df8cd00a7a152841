-- sql/schema.sql: schema idemq as every migration leaves it, in one file for
-- a reader: the types, tables, columns, constraints, indexes, table settings,
-- triggers, comments and the settings rows. The functions are in
-- sql/functions/ (the trigger functions too); this file has what they work on.
--
-- Hand-edited, like sql/functions/. A schema change is made twice: here, and
-- in the unreleased migration's hand-written part (npm run migration:new);
-- test/install/schema-file.test.ts holds the two equal, object by object, and
-- names the object that differs.
--
-- Applied (by that test, into an empty database) in three steps, like a
-- migration's parts: this file down to the line "-- ==== after the
-- functions ====", then every file of sql/functions/ (private helpers first,
-- scripts/migration-new.mjs's creationOrder), then the rest of this file,
-- with the setting idemq.installing = on, as `idemq migrate` sets it for a
-- fresh install. What is after the functions needs them: an index on
-- _name_key(), the triggers, the rows the triggers copy, and the grants.
--
-- Grants: the roles are this installation's own (idemq_<database>_producer,
-- _worker, _admin, _viewer; src/roles.ts), so no role is named here:
-- idemq._grant_roles(), called last, creates them and grants everything
-- (and revokes EXECUTE from PUBLIC on every function).
--
-- Not here: schema idemq_meta, the migration runner's (node-pg-migrate's
-- table of applied migrations, which schema_version() reads); the runner
-- creates it.

CREATE SCHEMA idemq;

-- ==== Types ====

-- A job's state. Order matters to nobody but readers of enum_range(): the
-- active states first, then the terminal ones (active_states(),
-- terminal_states() and src/contract.ts list them). A new value goes in a
-- migration of its own (docs/design.md, "Migrations and releases").
CREATE TYPE idemq.job_state AS ENUM (
    'scheduled',
    'enqueued',
    'processing',
    'awaiting',
    'succeeded',
    'failed',
    'expired',
    'cancelled'
);

-- What enqueue does with an idempotency key whose job has finished (the first
-- value is enqueue()'s default; the matrix is _policy_rejects).
CREATE TYPE idemq.duplicate_policy AS ENUM (
    'allow_after_failed',
    'reject_if_failed',
    'reject_always',
    'reject_if_succeeded'
);

-- A schedule's policies: a slot due while its previous job still runs
-- (overlap), and slots missed while nothing ticked (misfire).
CREATE TYPE idemq.schedule_overlap AS ENUM (
    'skip',
    'allow',
    'queue_one'
);

CREATE TYPE idemq.schedule_misfire AS ENUM (
    'once',
    'skip',
    'all'
);

-- Why a job that is not running waits (job()'s waiting_for, stats()'s). An
-- awaiting job: 'parents' (a parent in its `after` has not succeeded),
-- 'concurrency_key' (every place of its key is taken). A runnable one (its
-- scope's, from limits(): idemq._scope_waits): 'paused', 'held' (a hold
-- not yet over), 'concurrency' (every slot held), 'rate' (no start left in
-- the period). The scope reasons are in precedence order: a job whose queue
-- and task both hold it back says the first (min()). src/contract.ts lists
-- them (WAITING_REASONS).
CREATE TYPE idemq.waiting_reason AS ENUM (
    'parents',
    'concurrency_key',
    'children',
    'paused',
    'held',
    'concurrency',
    'rate'
);

-- A row claim() returns. Columns are only ever appended (a reader by position
-- keeps working): id is the deprecated name of job_id, kept where 0.1.0's
-- workers read it; lease_token is the fencing token of claim(..., token => true).
CREATE TYPE idemq.claimed_job AS (
	id bigint,
	task text,
	queue text,
	payload jsonb,
	attempt integer,
	max_attempts integer,
	idempotency_key text,
	lease_expires_at timestamp with time zone,
	reclaimed boolean,
	traceparent text,
	lease_token uuid,
	job_id bigint,
	timeout interval,
	concurrency_key text
);

-- What job() returns: a type, not RETURNS TABLE, because a TABLE column may
-- not share its name with the parameter job_id.
CREATE TYPE idemq.job_row AS (
	job_id bigint,
	task text,
	queue text,
	payload jsonb,
	state idemq.job_state,
	priority integer,
	run_at timestamp with time zone,
	attempt integer,
	uncounted integer,
	max_attempts integer,
	idempotency_key text,
	locked_by text,
	locked_at timestamp with time zone,
	lease_expires_at timestamp with time zone,
	errors jsonb,
	result jsonb,
	created_at timestamp with time zone,
	finished_at timestamp with time zone,
	expires_at timestamp with time zone,
	concurrency_key text,
	waiting_for idemq.waiting_reason,
	progress smallint
);

-- One job on its way through the enqueue pipeline (enqueue, enqueue_many):
-- the plan fields (ordinal .. existing_state), then the job's fields in
-- enqueue()'s parameter order (_enqueue_fields() reads them from here).
CREATE TYPE idemq._planned_job AS (
	ordinal integer,
	job_id bigint,
	outcome text,
	existing_state idemq.job_state,
	task text,
	payload jsonb,
	queue text,
	run_at timestamp with time zone,
	priority integer,
	max_attempts integer,
	idempotency_key text,
	duplicate_policy idemq.duplicate_policy,
	backoff jsonb,
	expires_at timestamp with time zone,
	after bigint[],
	key_retention interval,
	traceparent text,
	concurrency_key text,
	timeout interval
);

-- The limits an enqueue checks, read as one value (the row of
-- idemq.enqueue_limits, below, is of this type).
CREATE TYPE idemq._enqueue_limits AS (
	payload_bytes bigint,
	key_bytes bigint,
	task_bytes bigint,
	parents_per_job bigint,
	jobs_per_call bigint,
	duration_days bigint
);

-- ==== Jobs ====

CREATE TABLE idemq.jobs (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    task text NOT NULL,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    state idemq.job_state NOT NULL,
    priority integer NOT NULL,
    run_at timestamp with time zone NOT NULL,
    -- attempt counts every claim; uncounted the ones that did not spend an
    -- attempt (snoozes), so max_attempts bounds attempt - uncounted.
    attempt integer DEFAULT 0 NOT NULL,
    uncounted integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    idempotency_key text,
    backoff jsonb,
    -- The lease: set while processing, and only then (jobs_lease_iff_processing).
    locked_by text,
    locked_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    lease_lost boolean DEFAULT false NOT NULL,
    -- Its finish must run the jobs trigger (_on_job_finished) for others:
    -- jobs enqueued `after` it, a parent it is the spawned child of
    -- (job_children), its own children (spawn), or a client waiting for its
    -- result (result_watched). A completion with retention 0 keeps it.
    has_children boolean DEFAULT false NOT NULL,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    result jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    expires_at timestamp with time zone,
    traceparent text,
    -- The fencing token of claim(..., token => true); NULL on a job claimed
    -- without one, which then matches only a call without one (0.1.0 workers).
    lease_token uuid,
    -- Flow control's concurrency key (enqueue's concurrency_key): at most K
    -- jobs of one key are admitted (enqueued, scheduled or processing) at
    -- once; the others wait in `awaiting` (docs/design.md, "Concurrency keys").
    concurrency_key text,
    -- How long one attempt may run (enqueue(..., timeout)); NULL: no limit.
    -- claim() and heartbeat() never set a lease past locked_at + timeout.
    timeout interval,
    -- Flow control: the stripe (idemq.limit_slots.slot) of the job's queue's
    -- and task's concurrency limits whose slot claim() gave this attempt,
    -- NULL for none; the jobs trigger gives the slot back to that stripe
    -- when the attempt leaves processing (_stripe_of).
    queue_slot integer,
    task_slot integer,
    -- The attempt's progress, a percentage its handler reports (progress()):
    -- kept after the attempt ends, cleared by the next claim.
    progress smallint,
    -- A client waits for the job's outcome (job_result(..., notify => true)):
    -- its finish sends NOTIFY idemq_results with its id (_on_job_finished).
    -- Set together with has_children, which makes that trigger run and a
    -- retention of 0 keep the row for the reader.
    result_watched boolean DEFAULT false NOT NULL,
    CONSTRAINT jobs_errors_is_array CHECK ((jsonb_typeof(errors) = 'array'::text)),
    CONSTRAINT jobs_lease_iff_processing CHECK (((state = 'processing'::idemq.job_state) = ((lease_expires_at IS NOT NULL) AND (locked_by IS NOT NULL)))),
    CONSTRAINT jobs_max_attempts_positive CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_queue_not_empty CHECK ((queue <> ''::text)),
    CONSTRAINT jobs_task_not_empty CHECK ((task <> ''::text))
)
-- One table, not hot plus history (moving each finished row would cost an
-- insert per job); fillfactor 50 keeps a claim's and a completion's new row
-- versions on the job's page (less WAL).
WITH (fillfactor='50');

-- Statistics sampled from one queue made an equality on it look like it kept
-- every row; a fixed estimate keeps filtered claims' plans sane
-- (docs/design.md, "Schema idemq").
ALTER TABLE ONLY idemq.jobs ALTER COLUMN task SET (n_distinct=100);
ALTER TABLE ONLY idemq.jobs ALTER COLUMN queue SET (n_distinct=100);

-- NOT VALID, as the pre-release migrations added them to tables that held
-- jobs: every write is checked, the rows then present were not scanned.
-- pg_constraint records it, so a fresh install says the same as an upgraded one.
ALTER TABLE idemq.jobs
    ADD CONSTRAINT jobs_attempt_in_range CHECK (((0 <= uncounted) AND (uncounted <= attempt) AND (attempt <= (max_attempts + uncounted)))) NOT VALID;
ALTER TABLE idemq.jobs
    ADD CONSTRAINT jobs_finished_iff_terminal CHECK (((state = ANY ('{succeeded,failed,expired,cancelled}'::idemq.job_state[])) = (finished_at IS NOT NULL))) NOT VALID;
ALTER TABLE idemq.jobs
    ADD CONSTRAINT jobs_progress_percent CHECK (((progress >= 0) AND (progress <= 100))) NOT VALID;
ALTER TABLE idemq.jobs
    ADD CONSTRAINT jobs_timeout_positive CHECK ((timeout > '00:00:00'::interval)) NOT VALID;
ALTER TABLE idemq.jobs
    ADD CONSTRAINT jobs_traceparent_w3c CHECK ((traceparent ~ '^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$'::text)) NOT VALID;

-- Partial indexes, each over the few jobs one operation looks for (the
-- literal state lists are checked against the enum by test/contract/contract.test.ts).
-- rescue(): expired leases.
CREATE INDEX jobs_leases ON idemq.jobs USING btree (lease_expires_at) WHERE (state = 'processing'::idemq.job_state);
-- rescue(): waiting jobs past expires_at.
CREATE INDEX jobs_deadlines ON idemq.jobs USING btree (expires_at) WHERE ((expires_at IS NOT NULL) AND (state = ANY (ARRAY['enqueued'::idemq.job_state, 'scheduled'::idemq.job_state, 'awaiting'::idemq.job_state])));
-- Concurrency keys: the admitted jobs of a key (counted under the key's lock),
-- and the jobs waiting for a place, in the order they are promoted. No index
-- holds awaiting jobs alone: the planner would walk it for a key's next job
-- (migration 0002 drops 0.1.0's jobs_awaiting and says why); awaiting jobs
-- are otherwise read by id.
CREATE INDEX jobs_key_admitted ON idemq.jobs USING btree (concurrency_key) WHERE ((concurrency_key IS NOT NULL) AND (state = ANY (ARRAY['enqueued'::idemq.job_state, 'scheduled'::idemq.job_state, 'processing'::idemq.job_state])));
CREATE INDEX jobs_key_waiting ON idemq.jobs USING btree (concurrency_key, priority DESC, run_at, id) WHERE ((concurrency_key IS NOT NULL) AND (state = 'awaiting'::idemq.job_state));
-- Retention and purge: finished jobs by state and age.
CREATE INDEX jobs_by_finish ON idemq.jobs USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
-- The dashboard's jobs with errors.
CREATE INDEX jobs_with_errors ON idemq.jobs USING btree (id) WHERE (errors <> '[]'::jsonb);
-- (jobs_runnable_by_task_queue, claim's index, is after the functions: it indexes _name_key().)

-- A child job waits (awaiting) for each of its parents.
CREATE TABLE idemq.job_dependencies (
    parent_id bigint NOT NULL,
    child_id bigint NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX job_dependencies_child ON idemq.job_dependencies USING btree (child_id);

-- Fan-out and fan-in (spawn, enqueue_batch; docs/design.md, "Children and
-- batches"): a parent's children by name. The link is written with the
-- child and is the spawn's idempotency (a replay names the same children,
-- which are linked already); when the child finishes, the jobs trigger
-- (_child_finished) copies its outcome here, so the parent reads it even
-- after retention deleted the child. Deleted with the parent (_delete_jobs).
CREATE TABLE idemq.job_children (
    parent_id bigint NOT NULL,
    name text NOT NULL,
    child_id bigint NOT NULL,
    -- The child's terminal state, result (succeeded) or latest error entry
    -- (the others), copied when it finished; NULL while it is active.
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
-- The trigger's look-up: the unfinished links of a child that finishes.
CREATE INDEX job_children_active_child ON idemq.job_children USING btree (child_id) WHERE (state IS NULL);

-- A parent's count of unfinished and unsuccessful children, one row per
-- parent that spawned: the finishing child that takes pending to 0 (or,
-- with fail_fast, makes failed 1) releases a parent parked by
-- wait_for_children. Updated in place under its row lock, so exactly one
-- finishing child sees the count reach 0 (see docs/design.md).
CREATE TABLE idemq.child_waits (
    parent_id bigint PRIMARY KEY,
    pending integer NOT NULL,
    failed integer DEFAULT 0 NOT NULL,
    fail_fast boolean DEFAULT false NOT NULL,
    CONSTRAINT child_waits_counts_not_negative CHECK (((pending >= 0) AND (failed >= 0)))
) WITH (fillfactor = 50);

-- Job counts per (queue, task, state), for stats() and overview(): rows the
-- trigger function _count_jobs appends (its triggers are after the
-- functions), summed by _job_counts(), folded by apply_retention().
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

-- ==== Idempotency keys, guards and effects ====

-- The key ledger: a key is held by its job while the job is active, and
-- decides duplicates by its finished state afterwards, until prune_keys
-- releases it after its retention. Jobs deleted by retention leave it here.
CREATE TABLE idemq.keys (
    key text PRIMARY KEY,
    job_id bigint NOT NULL,
    task text NOT NULL,
    payload_md5 text NOT NULL,
    finished_state idemq.job_state,
    finished_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    retention interval NOT NULL,
    CONSTRAINT keys_finished_consistent CHECK (((finished_state IS NULL) = (finished_at IS NULL))),
    CONSTRAINT keys_key_not_empty CHECK ((key <> ''::text)),
    CONSTRAINT keys_retention_not_negative CHECK ((retention >= '00:00:00'::interval))
);
-- NOT VALID: see the jobs' checks above.
ALTER TABLE idemq.keys
    ADD CONSTRAINT keys_finished_state_terminal CHECK ((finished_state = ANY ('{succeeded,failed,expired,cancelled}'::idemq.job_state[]))) NOT VALID;
-- prune_keys: finished keys by age.
CREATE INDEX keys_finished_at ON idemq.keys USING btree (finished_at) WHERE (finished_at IS NOT NULL);

-- guard(): one row per effect done, committed with the caller's own writes.
CREATE TABLE idemq.processed (
    key text PRIMARY KEY,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT processed_key_not_empty CHECK ((key <> ''::text))
);

-- effect_claim/done/release: the claim-first record of an external effect.
CREATE TABLE idemq.effects (
    key text PRIMARY KEY,
    owner text NOT NULL,
    status text NOT NULL,
    claimed_at timestamp with time zone NOT NULL,
    reclaims integer DEFAULT 0 NOT NULL,
    done_at timestamp with time zone,
    result jsonb,
    job_id bigint,
    attempt integer,
    CONSTRAINT effects_done_iff_done_at CHECK (((status = 'done'::text) = (done_at IS NOT NULL))),
    CONSTRAINT effects_job_and_attempt_together CHECK (((job_id IS NULL) = (attempt IS NULL))),
    CONSTRAINT effects_key_not_empty CHECK ((key <> ''::text)),
    CONSTRAINT effects_status_known CHECK ((status = ANY (ARRAY['claimed'::text, 'done'::text])))
);

-- Duplicate, rejection and guard-duplicate events per task, append-only
-- counts for stats() (prune_keys folds them).
CREATE TABLE idemq.counters (
    task text NOT NULL,
    event text NOT NULL,
    n bigint NOT NULL,
    CONSTRAINT counters_event_known CHECK ((event = ANY (ARRAY['deduplicated'::text, 'rejected'::text, 'conflict'::text, 'guard_duplicate'::text]))),
    CONSTRAINT counters_n_positive CHECK ((n > 0))
);

-- ==== Schedules ====

CREATE TABLE idemq.schedules (
    name text PRIMARY KEY,
    cron text NOT NULL,
    timezone text NOT NULL,
    task text NOT NULL,
    payload jsonb NOT NULL,
    queue text NOT NULL,
    priority integer NOT NULL,
    max_attempts integer NOT NULL,
    overlap idemq.schedule_overlap NOT NULL,
    misfire idemq.schedule_misfire NOT NULL,
    misfire_grace interval NOT NULL,
    next_at timestamp with time zone NOT NULL,
    last_slot_at timestamp with time zone,
    last_job_id bigint,
    skipped bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    -- Why tick() could not enqueue the schedule's job (a limit lowered after
    -- schedule() accepted it): _tick records it and goes on with the others.
    last_error text,
    last_error_at timestamp with time zone,
    CONSTRAINT schedules_cron_not_empty CHECK ((cron <> ''::text)),
    CONSTRAINT schedules_error_has_time CHECK (((last_error IS NULL) = (last_error_at IS NULL))),
    CONSTRAINT schedules_last_job_has_slot CHECK (((last_job_id IS NULL) OR (last_slot_at IS NOT NULL))),
    CONSTRAINT schedules_max_attempts_positive CHECK ((max_attempts >= 1)),
    CONSTRAINT schedules_misfire_grace_in_range CHECK (((misfire_grace >= '00:00:01'::interval) AND (misfire_grace <= '1 day'::interval))),
    CONSTRAINT schedules_name_length CHECK ((length(name) <= 200)),
    CONSTRAINT schedules_name_not_empty CHECK ((name <> ''::text)),
    CONSTRAINT schedules_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT schedules_queue_not_empty CHECK ((queue <> ''::text)),
    CONSTRAINT schedules_skipped_not_negative CHECK ((skipped >= 0)),
    CONSTRAINT schedules_task_not_empty CHECK ((task <> ''::text))
);
-- tick(): the due schedules.
CREATE INDEX schedules_due ON idemq.schedules USING btree (next_at);

-- ==== Settings and retention ====

-- The limits and defaults an admin may tune (UPDATE of value only), each
-- within its range; the rows are after the functions.
CREATE TABLE idemq.settings (
    name text PRIMARY KEY,
    value bigint NOT NULL,
    min_value bigint NOT NULL,
    max_value bigint NOT NULL,
    description text NOT NULL,
    CONSTRAINT settings_value_in_range CHECK (((value >= min_value) AND (value <= max_value)))
);

-- The settings an enqueue checks, as one row kept by a trigger on
-- idemq.settings, so an enqueue reads one row instead of six.
CREATE TABLE idemq.enqueue_limits OF idemq._enqueue_limits (
    payload_bytes NOT NULL,
    key_bytes NOT NULL,
    task_bytes NOT NULL,
    parents_per_job NOT NULL,
    jobs_per_call NOT NULL,
    duration_days NOT NULL
);
COMMENT ON TABLE idemq.enqueue_limits IS 'The limits an enqueue checks, one row kept from idemq.settings by the trigger settings_keep_enqueue_limits; change idemq.settings, not this.';
CREATE UNIQUE INDEX enqueue_limits_one_row ON idemq.enqueue_limits USING btree ((true));

-- Retention overrides of a terminal state for one queue or one task
-- (set_retention); the defaults are the settings retention_<state>_seconds.
CREATE TABLE idemq.retention (
    queue text,
    task text,
    state idemq.job_state NOT NULL,
    keep interval NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT retention_keep_not_negative CHECK ((keep >= '00:00:00'::interval)),
    CONSTRAINT retention_queue_not_empty CHECK ((queue <> ''::text)),
    CONSTRAINT retention_queue_or_task CHECK (((queue IS NULL) <> (task IS NULL))),
    CONSTRAINT retention_state_terminal CHECK ((state = ANY (ARRAY['succeeded'::idemq.job_state, 'failed'::idemq.job_state, 'expired'::idemq.job_state, 'cancelled'::idemq.job_state]))),
    CONSTRAINT retention_task_not_empty CHECK ((task <> ''::text)),
    CONSTRAINT retention_queue_state UNIQUE (queue, state),
    CONSTRAINT retention_task_state UNIQUE (task, state)
);

-- Which succeeded jobs are deleted by their own completion (retention 0),
-- one row kept by triggers on idemq.settings and idemq.retention, so a
-- completion reads one row.
CREATE TABLE idemq.success_retention (
    default_zero boolean NOT NULL,
    zero_tasks text[] NOT NULL,
    kept_tasks text[] NOT NULL,
    zero_queues text[] NOT NULL,
    kept_queues text[] NOT NULL
);
COMMENT ON TABLE idemq.success_retention IS 'Which succeeded jobs have retention 0, one row kept from idemq.settings and idemq.retention by triggers; change those, not this.';
CREATE UNIQUE INDEX success_retention_one_row ON idemq.success_retention USING btree ((true));

-- ==== Flow control ====

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

-- ==== History ====

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

-- ==== Workers ====

-- Presence (worker_seen, worker_stopped): which queues and tasks each
-- running worker serves, for unserved_jobs() and the dashboard. Since 0.2.0
-- also where it runs (host, pid), how many jobs it runs at once, how often it
-- refreshes its row (refresh_every: workers() calls a row late after two),
-- and the database outages it lived through (count, time down, when the
-- latest ended: last_outage_at, set by worker_seen when the count rises).
-- stopped_at: a clean stop (worker_stopped) keeps the row, stopped, for
-- stopped_worker_seconds, so the dashboard lists recently stopped workers.
CREATE TABLE idemq.workers (
    worker_id text PRIMARY KEY,
    queues text[],
    tasks text[],
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    host text,
    pid integer,
    concurrency integer,
    refresh_every interval,
    outages integer DEFAULT 0 NOT NULL,
    outage_ms bigint DEFAULT 0 NOT NULL,
    last_outage_at timestamp with time zone,
    stopped_at timestamp with time zone,
    CONSTRAINT workers_id_not_empty CHECK ((worker_id <> ''::text)),
    CONSTRAINT workers_queues_not_empty CHECK ((cardinality(queues) > 0)),
    CONSTRAINT workers_tasks_not_empty CHECK ((cardinality(tasks) > 0)),
    CONSTRAINT workers_pid_positive CHECK ((pid > 0)),
    CONSTRAINT workers_concurrency_positive CHECK ((concurrency > 0)),
    CONSTRAINT workers_refresh_every_positive CHECK ((refresh_every > '00:00:00'::interval)),
    CONSTRAINT workers_outages_not_negative CHECK (((outages >= 0) AND (outage_ms >= 0)))
);

-- ==== The installation ====

-- Each installation's own roles: the cluster-wide idemq_producer,
-- idemq_worker and idemq_admin of 0.1.0 gave a login made a member for one
-- database the same rights in every database of the server with idemq.
-- _grant_roles() fills this row once (the names are chosen at install). The
-- viewer (a read-only operator) is new in 0.2.0: no cluster-wide counterpart.
CREATE TABLE idemq.installation (
    one_row boolean PRIMARY KEY DEFAULT true CONSTRAINT installation_one_row CHECK (one_row),
    producer_role name NOT NULL,
    worker_role name NOT NULL,
    admin_role name NOT NULL,
    shared_members_pending boolean NOT NULL,
    viewer_role name NOT NULL,
    CONSTRAINT installation_roles_distinct CHECK (((producer_role <> worker_role) AND (worker_role <> admin_role) AND (producer_role <> admin_role) AND (viewer_role <> producer_role) AND (viewer_role <> worker_role) AND (viewer_role <> admin_role))),
    CONSTRAINT installation_roles_not_shared CHECK ((NOT (ARRAY[(producer_role)::text, (worker_role)::text, (admin_role)::text, (viewer_role)::text] && ARRAY['idemq_producer'::text, 'idemq_worker'::text, 'idemq_admin'::text])))
);
COMMENT ON TABLE idemq.installation IS 'This installation''s role names, chosen once at install (_grant_roles); shared_members_pending: upgraded from 0.1.0, the cluster-wide roles'' members not yet moved to these roles.';

-- ==== Durable steps ====

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

-- ==== after the functions ====

-- claim()'s index, walked one (task, queue) pair at a time. Keyed by a
-- 64-bit hash of each name (_name_key), not the names: with the
-- variable-width names first every insertion compared them; a walk compares
-- the names too. Without btree deduplication, which cannot merge entries
-- that each end in an id, and cost a bulk enqueue 2% trying.
CREATE INDEX jobs_runnable_by_task_queue ON idemq.jobs USING btree (idemq._name_key(task), idemq._name_key(queue), priority DESC, run_at, id) WITH (deduplicate_items=off) WHERE (state = ANY (ARRAY['enqueued'::idemq.job_state, 'scheduled'::idemq.job_state]));

-- A job entering a terminal state finishes its key and releases (or cancels)
-- its children; only jobs with a key or children fire it.
CREATE TRIGGER jobs_finished AFTER UPDATE OF state ON idemq.jobs FOR EACH ROW WHEN (((new.state = ANY (ARRAY['succeeded'::idemq.job_state, 'failed'::idemq.job_state, 'expired'::idemq.job_state, 'cancelled'::idemq.job_state])) AND (old.state <> ALL (ARRAY['succeeded'::idemq.job_state, 'failed'::idemq.job_state, 'expired'::idemq.job_state, 'cancelled'::idemq.job_state])) AND ((new.idempotency_key IS NOT NULL) OR new.has_children))) EXECUTE FUNCTION idemq._on_job_finished();

-- The job counts, per statement (transition tables): one appended row per
-- (queue, task, state) a statement changed, in the writer's transaction.
CREATE TRIGGER jobs_count_inserts AFTER INSERT ON idemq.jobs REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION idemq._count_jobs();
CREATE TRIGGER jobs_count_updates AFTER UPDATE ON idemq.jobs REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION idemq._count_jobs();
CREATE TRIGGER jobs_count_deletes AFTER DELETE ON idemq.jobs REFERENCING OLD TABLE AS old_jobs FOR EACH STATEMENT EXECUTE FUNCTION idemq._count_jobs();
CREATE TRIGGER jobs_count_truncate AFTER TRUNCATE ON idemq.jobs FOR EACH STATEMENT EXECUTE FUNCTION idemq._count_jobs();

-- The one-row tables derived from the settings and the retention overrides.
CREATE TRIGGER settings_keep_enqueue_limits AFTER INSERT OR DELETE OR UPDATE ON idemq.settings FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_enqueue_limits();
CREATE TRIGGER settings_keep_success_retention AFTER INSERT OR DELETE OR UPDATE ON idemq.settings FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_success_retention();
CREATE TRIGGER retention_keep_success_retention AFTER INSERT OR DELETE OR UPDATE OR TRUNCATE ON idemq.retention FOR EACH STATEMENT EXECUTE FUNCTION idemq._keep_success_retention();

-- The settings and their defaults (the triggers above fill idemq.enqueue_limits
-- and idemq.success_retention from them).
INSERT INTO idemq.settings (name, value, min_value, max_value, description) VALUES
  ('worker_id_bytes', 256, 1, 1000, 'longest worker_id claim() accepts, in bytes of UTF-8'),
  ('error_history', 20, 1, 100, 'errors kept per job: the latest entries of its history'),
  ('error_message_chars', 4096, 100, 65536, 'longest class and message of a recorded error (and its other fields together), in characters'),
  ('error_stack_chars', 16384, 100, 262144, 'longest stack of a recorded error, in characters'),
  ('duration_days', 36500, 1, 1000000, 'longest retention or staleness (purge, prune_keys older_than; effect_claim stale_after), in days'),
  ('task_bytes', 256, 1, 2000, 'longest task name enqueue accepts, in bytes of UTF-8'),
  ('jobs_per_call', 50000, 1, 1000000, 'most jobs one enqueue_many call accepts'),
  ('parents_per_job', 1000, 1, 100000, 'most parents one job may wait for (enqueue''s after)'),
  ('key_bytes', 512, 1, 2000, 'longest idempotency key, guard key, effect key and effect owner, in bytes of UTF-8'),
  ('payload_bytes', 1048576, 1, 268435455, 'largest job payload, in bytes of its JSON text'),
  ('retention_succeeded_seconds', 604800, 0, 3153600000, 'how long a succeeded job is kept, in seconds (default 7 days; 0: deleted by its completion)'),
  ('retention_failed_seconds', 2592000, 0, 3153600000, 'how long a failed job is kept, in seconds (default 30 days)'),
  ('retention_cancelled_seconds', 2592000, 0, 3153600000, 'how long a cancelled job is kept, in seconds (default 30 days)'),
  ('retention_expired_seconds', 2592000, 0, 3153600000, 'how long an expired job is kept, in seconds (default 30 days)'),
  ('worker_names', 10000, 1, 100000, 'most queue and task names one worker_seen() call may list, together'),
  ('worker_retention_seconds', 86400, 60, 3153600000, 'how long the row of a worker not seen is kept in idemq.workers, in seconds (default a day)'),
  ('stopped_worker_seconds', 3600, 60, 3153600000, 'how long the row of a cleanly stopped worker is kept in idemq.workers, in seconds (default an hour)'),
  ('event_retention_seconds', 604800, 60, 3153600000, 'how long an emitted event is kept for waits reached after it (await_event), in seconds (default 7 days)');

-- The installation's roles: named, created (when this role may) and granted;
-- PUBLIC gets EXECUTE on no function.
SELECT count(*) FROM idemq._grant_roles();
