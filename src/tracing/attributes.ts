// The span names and attributes idemq writes, defined once. Names follow the
// OpenTelemetry messaging semantic conventions ("{operation} {destination}",
// messaging.* attributes; copied, not imported: they live in the unstable
// entry point of @opentelemetry/semantic-conventions), and idemq's own
// attributes say what the conventions have no name for.

export const MESSAGING_SYSTEM = "idemq";
/** The instrumentation scope: trace.getTracer(TRACER_NAME). */
export const TRACER_NAME = "idemq";

export const OPERATIONS = {
  /** The client's enqueue / enqueueMany: a PRODUCER span. */
  enqueue: { name: "enqueue", type: "send" },
  /** One attempt of a job in a worker: a CONSUMER span. */
  process: { name: "process", type: "process" },
} as const;

export const TRACE_ATTRIBUTES = {
  system: "messaging.system",
  operationName: "messaging.operation.name",
  operationType: "messaging.operation.type",
  /** The queue. */
  destination: "messaging.destination.name",
  /** The job id. */
  messageId: "messaging.message.id",
  batchCount: "messaging.batch.message_count",
  errorType: "error.type",
  task: "idemq.task",
  queue: "idemq.queue",
  jobId: "idemq.job_id",
  /** The worker running the attempt (locked_by). */
  workerId: "idemq.worker_id",
  /** The attempt number (with the job id, the fencing token). */
  attempt: "idemq.attempt",
  /** The previous attempt lost its lease (its effect may have happened). */
  reclaimed: "idemq.reclaimed",
  /**
   * enqueue: the idempotency key was held by an active job (deduplicated);
   * attempt: the guard row says the effect was already committed (job:duplicate).
   */
  duplicate: "idemq.duplicate",
  /** enqueueMany: how many elements were deduplicated against existing jobs. */
  duplicates: "idemq.duplicates",
  /** How the attempt ended: succeeded, retry, failed, snoozed, cancelled, lease-lost, duplicate, released. */
  outcome: "idemq.outcome",
} as const;

export function spanName(operation: keyof typeof OPERATIONS, queue: string | undefined): string {
  return queue === undefined ? OPERATIONS[operation].name : `${OPERATIONS[operation].name} ${queue}`;
}
