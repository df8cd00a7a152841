// The public API of idemq: only what users use.

export { Client } from "./client.ts";
export type {
  ClientEvents,
  ClientOptions,
  ClientPayloads,
  EnqueueArgs,
  EnqueueRejectedEvent,
  InTransaction,
  TaskName,
} from "./client.ts";

// The worker.
export { createWorker, defineTasks, EffectBusyError, Worker, WorkerConfigError } from "./worker/index.ts";
export type {
  EffectOptions,
  ErrorInfo,
  JobContext,
  JobInfo,
  LogEntry,
  TaskConfig,
  TaskDefinition,
  TaskPayload,
  TaskPayloads,
  Tasks,
  TasksFor,
  TransactionalJobContext,
  WorkerEvents,
  WorkerOptions,
} from "./worker/index.ts";

export {
  BadArgumentError,
  ChildFailedError,
  DuplicateJobError,
  EffectClaimLostError,
  IdemqError,
  InvalidStateError,
  JobNotFoundError,
  JobNotSucceededError,
  KeyReuseError,
  LeaseLostError,
  PermanentError,
  RateLimitedError,
  ResultTimeoutError,
  SchemaMissingError,
  StepError,
  TimeoutError,
  WaitTimeoutError,
} from "./errors.ts";
export { JobParked } from "./worker/steps.ts";
export type { ExternalStepOptions, SleepOptions, StepContext, TransactionalStepOptions, WaitForOptions } from "./worker/steps.ts";

export {
  ACTIVE_STATES,
  BACKOFF_KINDS,
  DUPLICATE_POLICIES,
  ERROR_CODES,
  JOB_STATES,
  NOTIFY_CHANNEL,
  RESULTS_CHANNEL,
  SCHEDULE_MISFIRES,
  SCHEDULE_OVERLAPS,
  RESULT_BYTES,
  TERMINAL_STATES,
  WAITING_REASONS,
} from "./contract.ts";
export { toPgInterval } from "./duration.ts";
export type {
  Backoff,
  BackoffKind,
  BulkAction,
  Duration,
  DuplicatePolicy,
  EffectStatus,
  EnqueueOutcome,
  IdemqErrorCode,
  JobState,
  ScheduleMisfire,
  ScheduleOverlap,
  StatsMetric,
  WaitingReason,
} from "./contract.ts";

export type {
  EnqueueManyJob,
  EnqueueManyResult,
  EnqueueOptions,
  EnqueueResult,
  Instant,
  JobIdInput,
  PayloadMap,
  Queryable,
  Schedule,
  ScheduleDefinition,
  ScheduleNextOptions,
  StatsRow,
  ChildJob,
  ChildOutcome,
  JobOutcome,
  SpawnedChild,
  StepRow,
} from "./sql/index.ts";
export type { Job, JobFilter, ListJobsFilter } from "./job-reads.ts";
export type { BulkOptions, BulkProgress } from "./bulk-actions.ts";
export type { RateLimitScope } from "./errors.ts";

// Prometheus metrics (prom-client, an optional peer dependency, loaded only when used).
export { collectDatabaseMetrics, collectWorkerMetrics, MetricsUnavailableError, serveMetrics } from "./metrics/index.ts";
export type {
  DatabaseMetricsOptions,
  MetricsHandle,
  MetricsRegistry,
  MetricsServer,
  ServeMetricsOptions,
  WorkerMetricsOptions,
} from "./metrics/index.ts";
