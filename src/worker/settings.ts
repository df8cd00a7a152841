// createWorker's options, validated, with the worker's defaults applied.
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { type Duration } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import { MAX_CLAIM_BATCH, MAX_DELETE_BATCH, WAKE_UP_MODES, WORKER_DEFAULTS, type WakeUpMode } from "./defaults.ts";
import { durationMs, lease, WorkerConfigError } from "./task-config.ts";
import type { ScheduleDefinition } from "../sql/index.ts";
import { normalizeSchedules } from "./schedules.ts";
import type { WorkerOptions } from "./types.ts";
import type { PrefetchBounds } from "./prefetch-window.ts";

export interface Settings {
  workerId: string;
  queues: string[] | undefined;
  concurrency: number;
  /** A fixed prefetch (min = max), or the adaptive window's bounds when `prefetch` is unset. */
  prefetch: PrefetchBounds;
  prefetchBytes: number;
  lease: { interval: string; ms: number };
  heartbeatMs: number;
  wakeUp: WakeUpMode;
  pollMs: number;
  /** poll mode: the shortest gap between claims (at most pollMs). */
  minPollMs: number;
  rescueMs: number;
  tickMs: number;
  pruneMs: number;
  retentionMs: number;
  /** worker_seen() refreshes (maintenance/presence.ts); always on. */
  presenceMs: number;
  retentionBatchSize: number;
  retentionTickBudgetMs: number;
  /** Interval text for prune_keys(older_than); undefined: left out, the SQL default applies. */
  keyRetention: string | undefined;
  shutdownTimeoutMs: number;
  handleSignals: boolean;
  tracing: boolean;
  errorBackoffMs: number;
  callTimeoutMs: number;
  markerCallTimeoutMs: number;
  completionBatch: number;
  idleInTransactionMarginMs: number;
  keepAliveDelayMs: number;
  effectBusySnoozeMs: number;
  /** Upserted by name at start (schedules.ts). */
  schedules: ScheduleDefinition[];
}

export function normalizeSettings(options: WorkerOptions): Settings {
  const concurrency = options.concurrency ?? WORKER_DEFAULTS.concurrency;
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > MAX_CLAIM_BATCH) {
    throw new WorkerConfigError(`concurrency must be an integer from 1 to ${MAX_CLAIM_BATCH}, got ${String(concurrency)}`);
  }
  if (options.prefetch !== undefined) {
    const p = options.prefetch;
    if (!Number.isInteger(p) || p < 0 || p > MAX_CLAIM_BATCH) {
      throw new WorkerConfigError(`prefetch must be an integer from 0 to ${MAX_CLAIM_BATCH}, got ${String(p)}`);
    }
  }
  const prefetchBytes = options.prefetchBytes ?? WORKER_DEFAULTS.prefetchBytes;
  if (!Number.isSafeInteger(prefetchBytes) || prefetchBytes < 0) {
    throw new WorkerConfigError(`prefetchBytes must be a whole number of bytes, 0 or more, got ${String(prefetchBytes)}`);
  }
  const queues = options.queues === undefined ? undefined : [...options.queues];
  if (queues !== undefined && (queues.length === 0 || queues.some((q) => typeof q !== "string" || q.trim() === ""))) {
    throw new WorkerConfigError("queues must be a non-empty list of queue names (leave it out for every queue)");
  }
  const workerId = options.workerId ?? `${hostname()}:${process.pid}:${randomBytes(3).toString("hex")}`;
  if (typeof workerId !== "string" || workerId.trim() === "") throw new WorkerConfigError("workerId must be a non-empty string");
  const workerLease = lease(options.lease ?? WORKER_DEFAULTS.lease, "lease");
  const prefetch: PrefetchBounds =
    options.prefetch === undefined
      ? {
          min: concurrency,
          max: Math.max(concurrency, WORKER_DEFAULTS.prefetchMax),
          // The one statement of the cap: the last buffered job's expected wait
          // (window / completion rate) stays within this share of the lease it was claimed with.
          waitBudgetMs: workerLease.ms * WORKER_DEFAULTS.prefetchLeaseShare,
        }
      : { min: options.prefetch, max: options.prefetch, waitBudgetMs: Infinity };
  const heartbeatMs =
    options.heartbeatInterval === undefined
      ? workerLease.ms / WORKER_DEFAULTS.heartbeatsPerLease
      : positive(options.heartbeatInterval, "heartbeatInterval");
  const wakeUp = options.wakeUp ?? WORKER_DEFAULTS.wakeUp;
  if (!(WAKE_UP_MODES as readonly unknown[]).includes(wakeUp)) {
    throw new WorkerConfigError(`wakeUp must be one of ${WAKE_UP_MODES.map((m) => `"${m}"`).join(", ")}, got ${JSON.stringify(wakeUp)}`);
  }
  if (options.listenConnectionString !== undefined) {
    if (typeof options.listenConnectionString !== "string" || options.listenConnectionString === "") {
      throw new WorkerConfigError("listenConnectionString must be a connection string (leave it out to LISTEN through connectionString)");
    }
    if (wakeUp === "poll") {
      throw new WorkerConfigError('listenConnectionString is for wakeUp "listen": a worker in poll mode holds no LISTEN connection');
    }
  }
  const pollMs = positive(options.pollInterval ?? WORKER_DEFAULTS.pollInterval, "pollInterval");
  let minPollMs: number;
  if (options.minPollInterval === undefined) {
    minPollMs = Math.min(durationMs(WORKER_DEFAULTS.minPollInterval, "minPollInterval"), pollMs);
  } else {
    minPollMs = positive(options.minPollInterval, "minPollInterval");
    if (minPollMs > pollMs) throw new WorkerConfigError(`minPollInterval (${minPollMs} ms) must not be longer than pollInterval (${pollMs} ms)`);
  }
  const retentionBatchSize = options.retentionBatchSize ?? WORKER_DEFAULTS.retentionBatchSize;
  if (!Number.isInteger(retentionBatchSize) || retentionBatchSize < 1 || retentionBatchSize > MAX_DELETE_BATCH) {
    throw new WorkerConfigError(
      `retentionBatchSize must be an integer from 1 to ${MAX_DELETE_BATCH}, got ${String(retentionBatchSize)}`,
    );
  }
  let keyRetention: string | undefined;
  if (options.keyRetention !== undefined) {
    durationMs(options.keyRetention, "keyRetention");
    keyRetention = toPgInterval(options.keyRetention);
  }
  return {
    workerId,
    queues,
    concurrency,
    prefetch,
    prefetchBytes,
    lease: workerLease,
    heartbeatMs,
    wakeUp,
    pollMs,
    minPollMs,
    rescueMs: durationMs(options.rescueInterval ?? WORKER_DEFAULTS.rescueInterval, "rescueInterval"),
    tickMs: durationMs(options.tickInterval ?? WORKER_DEFAULTS.tickInterval, "tickInterval"),
    pruneMs: durationMs(options.pruneInterval ?? WORKER_DEFAULTS.pruneInterval, "pruneInterval"),
    retentionMs: durationMs(options.retentionInterval ?? WORKER_DEFAULTS.retentionInterval, "retentionInterval"),
    presenceMs: positive(options.presenceInterval ?? WORKER_DEFAULTS.presenceInterval, "presenceInterval"),
    retentionBatchSize,
    retentionTickBudgetMs: durationMs(WORKER_DEFAULTS.retentionTickBudget, "retentionTickBudget"),
    keyRetention,
    shutdownTimeoutMs: durationMs(options.shutdownTimeout ?? WORKER_DEFAULTS.shutdownTimeout, "shutdownTimeout"),
    handleSignals: options.handleSignals ?? true,
    tracing: flag(options.tracing, "tracing"),
    errorBackoffMs: durationMs(WORKER_DEFAULTS.errorBackoff, "errorBackoff"),
    callTimeoutMs: durationMs(WORKER_DEFAULTS.callTimeout, "callTimeout"),
    markerCallTimeoutMs: durationMs(WORKER_DEFAULTS.markerCallTimeout, "markerCallTimeout"),
    completionBatch: WORKER_DEFAULTS.completionBatch,
    idleInTransactionMarginMs: durationMs(WORKER_DEFAULTS.idleInTransactionMargin, "idleInTransactionMargin"),
    keepAliveDelayMs: durationMs(WORKER_DEFAULTS.keepAliveDelay, "keepAliveDelay"),
    effectBusySnoozeMs: durationMs(WORKER_DEFAULTS.effectBusySnooze, "effectBusySnooze"),
    schedules: normalizeSchedules(options.schedules),
  };
}

function flag(value: boolean | undefined, what: string): boolean {
  if (value !== undefined && typeof value !== "boolean") throw new WorkerConfigError(`${what} must be true or false, not ${JSON.stringify(value)}`);
  return value ?? true;
}

function positive(value: Duration, what: string): number {
  const ms = durationMs(value, what);
  if (ms <= 0) throw new WorkerConfigError(`${what} must be more than 0`);
  return ms;
}
