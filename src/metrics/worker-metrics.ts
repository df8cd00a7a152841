// collectWorkerMetrics(): the worker process's own figures, from its events
// (src/worker/events.ts) and, at scrape time, from what it holds. Nothing here
// touches the database or waits: a listener only increments a number, so
// metrics cost job processing nothing measurable.
//
// Labels are bounded: task and queue (a worker claims only its own tasks),
// and the wake-up mode's two values. Never a job id, key, worker id or payload.
import type { Worker } from "../worker/create-worker.ts";
import { WAKE_UP_MODES } from "../worker/defaults.ts";
import { JOB_END_EVENTS, type JobEndEventName, type JobEvent, type WorkerEvents } from "../worker/events.ts";
import { METRICS_DEFAULTS } from "./defaults.ts";
import { loadPromClient, registryOf } from "./prom-client.ts";
import type { MetricsRegistry } from "./registry.ts";

/** Metrics added to a registry; close() takes them off it (and stops listening). */
export interface MetricsHandle {
  readonly registry: MetricsRegistry;
  close(): Promise<void>;
}

export interface WorkerMetricsOptions {
  /** A prom-client Registry to add the metrics to; default: a new one (never the global default registry). */
  registry?: MetricsRegistry;
}

/** One counter per job event: its name, and what it counts. */
const JOB_COUNTERS = {
  "job:start": ["idemq_worker_jobs_started_total", "Attempts this worker started (handlers run, or guards checked)"],
  "job:success": ["idemq_worker_jobs_succeeded_total", "Attempts this worker completed"],
  "job:retry": ["idemq_worker_jobs_retried_total", "Attempts that failed with another attempt scheduled"],
  "job:failed": ["idemq_worker_jobs_failed_total", "Attempts that failed the job for good (out of attempts, or a permanent error)"],
  "job:duplicate": ["idemq_worker_jobs_duplicate_total", "Transactional attempts whose guard key was already done (completed, handler not run)"],
  "job:cancelled": ["idemq_worker_jobs_cancelled_total", "Attempts whose job an operator cancelled while this worker held it: result discarded"],
  "job:lease-lost": ["idemq_worker_jobs_lease_lost_total", "Attempts that no longer held their job (lease ran out, or the job is gone): result discarded"],
  "job:snoozed": ["idemq_worker_jobs_snoozed_total", "Attempts that snoozed (back to scheduled, not counted)"],
} as const satisfies Record<"job:start" | JobEndEventName, readonly [string, string]>;

/**
 * Adds the worker's metrics (docs/worker.md, "Metrics") to a registry and
 * keeps them current from the worker's events. Rejects with
 * MetricsUnavailableError when prom-client is not installed.
 */
export async function collectWorkerMetrics(worker: Worker, options: WorkerMetricsOptions = {}): Promise<MetricsHandle> {
  const prom = await loadPromClient();
  const registry = registryOf(prom, options.registry);
  const registers = [registry];
  const names: string[] = [];
  const listeners: Array<[keyof WorkerEvents, (...args: never[]) => void]> = [];
  const listen = <K extends keyof WorkerEvents>(event: K, listener: (...args: WorkerEvents[K]) => void): void => {
    worker.on(event, listener as never);
    listeners.push([event, listener as never]);
  };
  const named = <M>(name: string, metric: M): M => {
    names.push(name);
    return metric;
  };

  for (const [event, [name, help]] of Object.entries(JOB_COUNTERS) as Array<[keyof typeof JOB_COUNTERS, readonly [string, string]]>) {
    const counter = named(name, new prom.Counter({ name, help, labelNames: ["task", "queue"] as const, registers }));
    listen(event, (e: JobEvent) => counter.inc({ task: e.task, queue: e.queue }));
  }

  const duration = named(
    "idemq_worker_job_duration_seconds",
    new prom.Histogram({
      name: "idemq_worker_job_duration_seconds",
      help: "Attempt durations, from the start of the handler (or guard) to its end, by task; every ended attempt whatever its outcome",
      labelNames: ["task"] as const,
      buckets: [...METRICS_DEFAULTS.durationBuckets],
      registers,
    }),
  );
  const ended = (e: JobEvent & { durationMs: number }): void => duration.observe({ task: e.task }, e.durationMs / 1000);
  for (const event of JOB_END_EVENTS) {
    listen(event, ended);
  }

  const batch = named(
    "idemq_worker_claim_batch_size",
    new prom.Histogram({
      name: "idemq_worker_claim_batch_size",
      help: "Jobs per claim() call, empty claims included (the count is the claims made, the sum the jobs claimed)",
      buckets: [...METRICS_DEFAULTS.claimBatchBuckets],
      registers,
    }),
  );
  listen("worker:claimed", (e) => batch.observe(e.jobs));
  const handed = named(
    "idemq_worker_jobs_handed_total",
    new prom.Counter({
      name: "idemq_worker_jobs_handed_total",
      help: "Jobs a completion handed this worker (the next job of a concurrency key it freed, claimed in the same call: worker:handed)",
      registers,
    }),
  );
  listen("worker:handed", (e) => handed.inc(e.jobs));

  named(
    "idemq_worker_jobs_in_flight",
    new prom.Gauge({
      name: "idemq_worker_jobs_in_flight",
      help: "Jobs whose handlers are running now",
      registers,
      collect() {
        this.set(worker.runningCount);
      },
    }),
  );
  named(
    "idemq_worker_buffered_jobs",
    new prom.Gauge({
      name: "idemq_worker_buffered_jobs",
      help: "Claimed jobs waiting in the buffer for a free slot",
      registers,
      collect() {
        this.set(worker.buffered.jobs);
      },
    }),
  );
  named(
    "idemq_worker_buffered_bytes",
    new prom.Gauge({
      name: "idemq_worker_buffered_bytes",
      help: "Payload bytes (UTF-8 of the JSON text) of the claimed jobs waiting for a slot",
      registers,
      collect() {
        this.set(worker.buffered.bytes);
      },
    }),
  );

  const reconnects = named(
    "idemq_worker_reconnects_total",
    new prom.Counter({ name: "idemq_worker_reconnects_total", help: "Outages the worker came through (worker:reconnected)", registers }),
  );
  listen("worker:reconnected", () => reconnects.inc());
  const errors = named(
    "idemq_worker_errors_total",
    new prom.Counter({
      name: "idemq_worker_errors_total",
      help: "Failures outside a job (worker:error; one per outage for connection failures)",
      registers,
    }),
  );
  listen("worker:error", () => errors.inc());

  named(
    "idemq_worker_wake_up_mode",
    new prom.Gauge({
      name: "idemq_worker_wake_up_mode",
      help: "The wake-up mode in use: 1 for it, 0 for the other (listen mode behind a transaction pooler polls)",
      labelNames: ["mode"] as const,
      registers,
      collect() {
        for (const mode of WAKE_UP_MODES) this.set({ mode }, worker.wakeUp === mode ? 1 : 0);
      },
    }),
  );

  named(
    "idemq_worker_prepared_statements",
    new prom.Gauge({
      name: "idemq_worker_prepared_statements",
      help: "1 while the worker sends its per-job calls as named prepared statements, 0 when it sends them unnamed (poll mode, a transaction pooler, or after a statement was found gone)",
      registers,
      collect() {
        this.set(worker.preparedStatements ? 1 : 0);
      },
    }),
  );

  return {
    registry,
    close: async () => {
      for (const [event, listener] of listeners) worker.off(event, listener as never);
      for (const name of names) registry.removeSingleMetric(name);
    },
  };
}
