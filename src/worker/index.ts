// The worker's public surface (re-exported by src/index.ts).
export { createWorker, Worker } from "./create-worker.ts";
export { EffectBusyError } from "./effect.ts";
export { JobAwaitingChildren } from "./children.ts";
export { JobSnoozed } from "./job-context.ts";
export { UnknownTaskError } from "./run-job.ts";
export { IdleTransactionTimeoutError } from "./run-transactional.ts";
export { WorkerShutdownError } from "./shutdown.ts";
export { defineTasks, WorkerConfigError } from "./task-config.ts";
export type { ErrorInfo, JobEndEvent, JobEvent, LogEntry, WorkerEvents } from "./events.ts";
export type {
  EffectOptions,
  ErrorClass,
  JobContext,
  JobInfo,
  JobLog,
  ModuleWorkerOptions,
  Payload,
  PlainTaskConfig,
  TaskConfig,
  TaskDefinition,
  TaskHandler,
  TaskPayload,
  TaskPayloads,
  Tasks,
  TasksFor,
  TransactionalJobContext,
  TransactionalTaskConfig,
  TransactionalTaskHandler,
  WorkerOptions,
} from "./types.ts";
