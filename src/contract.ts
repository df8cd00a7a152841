// The TypeScript side of the contract in docs/design.md: every name that mirrors
// SQL (states, policies, backoff kinds, error codes, the NOTIFY channel) is
// defined here once. Contract tests compare these lists with the catalog.
// This module is the vocabulary and imports nothing: reading a value
// (durations: duration.ts; backoffs and other call arguments: encode.ts) and
// the error classes (errors.ts) build on it, never the other way round.
// SQL defaults (queue 'default', max_attempts 10, lease 30 s, key retention
// 14 days in prune_keys...) are NOT repeated here: the client leaves unset
// options out of its calls so each of them lives once, in SQL.

// ---------------------------------------------------------------- states

/** Every value of `idemq.job_state`, in the enum's declaration order. */
export const JOB_STATES = [
  "scheduled",
  "enqueued",
  "processing",
  "awaiting",
  "succeeded",
  "failed",
  "expired",
  "cancelled",
] as const;
export type JobState = (typeof JOB_STATES)[number];

export const ACTIVE_STATES = ["scheduled", "enqueued", "processing", "awaiting"] as const satisfies readonly JobState[];
export type ActiveState = (typeof ACTIVE_STATES)[number];

export const TERMINAL_STATES = ["succeeded", "failed", "expired", "cancelled"] as const satisfies readonly JobState[];
export type TerminalState = (typeof TERMINAL_STATES)[number];

export function isJobState(value: unknown): value is JobState {
  return (JOB_STATES as readonly unknown[]).includes(value);
}
export function isActiveState(state: JobState): state is ActiveState {
  return (ACTIVE_STATES as readonly JobState[]).includes(state);
}
export function isTerminalState(state: JobState): state is TerminalState {
  return (TERMINAL_STATES as readonly JobState[]).includes(state);
}

// ------------------------------------------------------ waiting reasons

/**
 * Every value of `idemq.waiting_reason`, in the enum's order: why a job that
 * is not running waits (job()'s and stats()'s waiting_for). An awaiting job:
 * "parents", "concurrency_key", "children" (parked by wait_for_children). A runnable one, held back by its queue or
 * task: "paused", "held", "concurrency" (no slot free), "rate" (no start left
 * in the period), in precedence order (the first that holds is said). A
 * runnable job with none of them (waiting_for null) waits for a worker.
 */
export const WAITING_REASONS = ["parents", "concurrency_key", "children", "paused", "held", "concurrency", "rate"] as const;
export type WaitingReason = (typeof WAITING_REASONS)[number];

/** The reasons a runnable job waits for its queue or task (the rest of WAITING_REASONS are an awaiting job's). */
export const SCOPE_WAITING_REASONS = ["paused", "held", "concurrency", "rate"] as const satisfies readonly WaitingReason[];
export type ScopeWaitingReason = (typeof SCOPE_WAITING_REASONS)[number];

/**
 * Why runnable jobs wait, as the CLI, the dashboard and the metrics label it:
 * a scope's reason, or "worker" where waiting_for is NULL (nothing holds
 * them back).
 */
export const RUNNABLE_WAITS = [...SCOPE_WAITING_REASONS, "worker"] as const;
export type RunnableWait = (typeof RUNNABLE_WAITS)[number];

// ------------------------------------------------------ duplicate policies

/** Every value of `idemq.duplicate_policy`; the first is the SQL default. */
export const DUPLICATE_POLICIES = [
  "allow_after_failed",
  "reject_if_failed",
  "reject_always",
  "reject_if_succeeded",
] as const;
export type DuplicatePolicy = (typeof DUPLICATE_POLICIES)[number];

export function isDuplicatePolicy(value: unknown): value is DuplicatePolicy {
  return (DUPLICATE_POLICIES as readonly unknown[]).includes(value);
}

// ------------------------------------------------------ schedule policies

/** Every value of `idemq.schedule_overlap`: what a slot does while the schedule's latest job is active. The first is schedule()'s SQL default. */
export const SCHEDULE_OVERLAPS = ["skip", "allow", "queue_one"] as const;
export type ScheduleOverlap = (typeof SCHEDULE_OVERLAPS)[number];

/** Every value of `idemq.schedule_misfire`: what slots missed while tick() was not called do. The first is schedule()'s SQL default. */
export const SCHEDULE_MISFIRES = ["once", "skip", "all"] as const;
export type ScheduleMisfire = (typeof SCHEDULE_MISFIRES)[number];

export function isScheduleOverlap(value: unknown): value is ScheduleOverlap {
  return (SCHEDULE_OVERLAPS as readonly unknown[]).includes(value);
}
export function isScheduleMisfire(value: unknown): value is ScheduleMisfire {
  return (SCHEDULE_MISFIRES as readonly unknown[]).includes(value);
}

/**
 * schedule()'s non-NULL DEFAULTs, as its SQL signature declares them, for
 * help texts and docs only: the client leaves unset options out of the call,
 * so SQL applies its own. test/contract holds this equal to the signature.
 */
export const SCHEDULE_SQL_DEFAULTS = {
  timezone: "UTC",
  overlap: SCHEDULE_OVERLAPS[0],
  misfire: SCHEDULE_MISFIRES[0],
  misfireGrace: "1 minute",
} as const;

// ------------------------------------------------------ other vocabularies

/** Row outcomes of `enqueue_many`. */
export const ENQUEUE_OUTCOMES = ["created", "deduplicated", "rejected", "conflict"] as const;
export type EnqueueOutcome = (typeof ENQUEUE_OUTCOMES)[number];

/** `status` values of `effect_claim`. */
export const EFFECT_STATUSES = ["claimed", "reclaimed", "done", "busy"] as const;
export type EffectStatus = (typeof EFFECT_STATUSES)[number];

/** `metric` values of `stats()` besides the state names. */
export const STATS_EVENT_METRICS = [
  "deduplicated",
  "rejected",
  "conflict",
  "guard_duplicate",
  "lease_expired",
  "oldest_runnable_seconds",
] as const;
export type StatsMetric = JobState | (typeof STATS_EVENT_METRICS)[number];

/** NOTIFY channel on which a runnable job is announced (payload: queue name). */
export const NOTIFY_CHANNEL = "idemq_jobs";

/**
 * NOTIFY channel on which a job marked by job_result(..., notify => true)
 * announces that it finished (payload: its id); Client.result listens.
 */
export const RESULTS_CHANNEL = "idemq_results";

// ------------------------------------------------------------ error codes

/** The SQLSTATEs idemq raises, with their meaning (docs/design.md, "Error codes"). */
export const ERROR_CODES = {
  IQ400: "bad argument",
  IQ404: "no such job",
  IQ409: "enqueue rejected by the duplicate policy",
  IQ410: "lease lost: this (job_id, attempt, lease_token) no longer holds the job, or an effect claim is not this owner's",
  IQ412: "the job's state does not allow this operation",
  IQ422: "idempotency key reused for different work while its job is active",
} as const;
export type IdemqErrorCode = keyof typeof ERROR_CODES;

/** PostgreSQL's own class of data exceptions, also treated as a bad argument. */
export const BAD_ARGUMENT_SQLSTATE_CLASS = "22";

// ------------------------------------------------- client-side defaults

/**
 * The bounds of a flow-control limit, as set_limit checks them
 * (_check_limit_values) and the CHECKs of idemq.limits hold them; a contract
 * test holds them equal to those CHECKs.
 */
export const LIMIT_BOUNDS = {
  concurrency: { min: 1, max: 10_000 },
  rate: { min: 1, max: 100_000 },
  perKey: { min: 1, max: 10_000 },
  /** The shortest period of a rate limit. */
  perMinMs: 1_000,
} as const;

/**
 * A job's progress (ctx.progress, idemq.progress): a whole percentage. The
 * CHECK jobs_progress_percent and progress()'s 22023 hold the same bounds;
 * test/sql/progress.test.ts holds them equal.
 */
export const PROGRESS_BOUNDS = { min: 0, max: 100 } as const;

/**
 * The largest job result, step result or event payload (a handler's return
 * value, ctx.step, ctx.waitFor, emit), in bytes of its JSON text:
 * idemq._result_limit(), which complete, step_record and emit enforce;
 * test/sql/steps.test.ts holds the two equal.
 */
export const RESULT_BYTES = 1_048_576;

/** The `kind` and `status` values of a job's step ledger (idemq.steps(), the CHECK job_steps_status_of_kind). */
export const STEP_KINDS = ["step", "sleep", "wait"] as const;
export type StepKind = (typeof STEP_KINDS)[number];
export const STEP_STATUSES = ["done", "sleeping", "waiting", "received", "timed_out"] as const;
export type StepStatus = (typeof STEP_STATUSES)[number];

/**
 * The fields of a job filter (find_jobs, count_jobs, the bulk actions): the
 * TypeScript name (JobFilter) -> the SQL field of the filter object, which
 * sql/functions/search/_check_job_filter.sql defines and checks;
 * test/sql/find-jobs.test.ts holds the two lists equal.
 */
export const JOB_FILTER_FIELDS = {
  ids: "ids",
  state: "state",
  task: "task",
  queue: "queue",
  key: "key",
  concurrencyKey: "concurrency_key",
  errorText: "error",
  createdAfter: "created_after",
  createdBefore: "created_before",
  finishedAfter: "finished_after",
  finishedBefore: "finished_before",
  payload: "payload",
} as const;

/** The bulk actions (count_jobs' action, _action_states; the CLI's jobs retry|cancel|delete|run-now); test/sql/find-jobs.test.ts holds them equal. */
export const BULK_ACTIONS = ["retry", "cancel", "delete", "run_now"] as const;
export type BulkAction = (typeof BULK_ACTIONS)[number];

/**
 * Defaults that exist only on the client side (timers, page sizes). Anything
 * SQL has a DEFAULT for is deliberately absent: e.g. a worker with no key
 * retention configured calls `prune_keys()` without `older_than`, so the
 * 14 days live only in SQL.
 */
export const CLIENT_DEFAULTS = {
  /** Rows returned by `Client.listJobs` when no limit is given. */
  listLimit: 100,
} as const;

// -------------------------------------------------------------- durations

/**
 * A duration: a number of milliseconds, or a string such as "250ms", "2s",
 * "5m", "1h", "2 days", "1h30m", "1 hour 30 minutes", or PostgreSQL's own interval
 * output ("00:00:30", "1 day 02:00:00").
 */
export type Duration = number | string;

// ---------------------------------------------------------------- backoff

export const BACKOFF_KINDS = ["polynomial", "exponential", "fixed"] as const;
export type BackoffKind = (typeof BACKOFF_KINDS)[number];

/** The fields each backoff kind takes (_backoff_problem's lists; test/contract/contract.test.ts holds them equal). */
export const BACKOFF_FIELDS = {
  polynomial: ["kind"],
  exponential: ["kind", "initial", "factor", "max", "jitter"],
  fixed: ["kind", "delays"],
} as const satisfies Record<BackoffKind, readonly string[]>;

/** The retry schedule of a job (`backoff` jsonb); leave it out for the SQL default. */
export type Backoff =
  | { kind: "polynomial" }
  | { kind: "exponential"; initial: Duration; factor?: number; max?: Duration; jitter?: number }
  | { kind: "fixed"; delays: readonly [Duration, ...Duration[]] | readonly Duration[] };

/** The jsonb form of a backoff, as `idemq.enqueue(backoff => ...)` takes it. */
export type BackoffJson =
  | { kind: "polynomial" }
  | { kind: "exponential"; initial: string; factor?: number; max?: string; jitter?: number }
  | { kind: "fixed"; delays: string[] };
