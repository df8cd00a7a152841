// Validates the tasks given to createWorker (or exported by a tasks module):
// each is a function or { run, transactional?, guardKey?, maxAttempts?,
// backoff?, exceptOn?, onlyOn?, lease?, concurrencyLimit?, rateLimit? }. A mistake is one WorkerConfigError
// whose message names the task and the option.
import { LIMIT_BOUNDS, type Backoff, type Duration } from "../contract.ts";
import { toMilliseconds, toPgInterval } from "../duration.ts";
import { checkBackoff } from "./backoff.ts";
import type { ErrorClass, Payload, Tasks } from "./types.ts";

/** A mistake in the worker's options or tasks (not a database error, hence no SQLSTATE). */
export class WorkerConfigError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "WorkerConfigError";
  }
}

export interface NormalizedTask {
  name: string;
  run: (payload: Payload, ctx: never) => unknown;
  transactional: boolean;
  guardKey: ((payload: Payload) => string | null | undefined) | undefined;
  maxAttempts: number | undefined;
  /** The task's backoff, checked; fail() applies it on the database clock. */
  backoff: Backoff | undefined;
  exceptOn: readonly ErrorClass[];
  onlyOn: readonly ErrorClass[] | undefined;
  /** The task's lease as an interval literal, and in ms; undefined: the worker's. */
  lease: { interval: string; ms: number } | undefined;
  /** Flow control the task declares (concurrencyLimit, rateLimit), applied at start by declare_limit; undefined: none. */
  limits: DeclaredLimits | undefined;
  /** The task's time limit per attempt in ms; undefined: none (a job's own may still apply). */
  timeoutMs: number | undefined;
}

export interface DeclaredLimits {
  concurrency?: number;
  rate?: number;
  /** The rate's period as an interval literal. */
  per?: string;
}

const TASK_OPTIONS = ["run", "transactional", "guardKey", "maxAttempts", "backoff", "exceptOn", "onlyOn", "lease", "timeout", "concurrencyLimit", "rateLimit"] as const;
type TaskOption = (typeof TASK_OPTIONS)[number];
const isTaskOption = (key: string): key is TaskOption => (TASK_OPTIONS as readonly string[]).includes(key);

const TASK_SHAPE =
  "a function (payload, ctx) => ... or { run, transactional?, guardKey?, maxAttempts?, backoff?, exceptOn?, onlyOn?, lease?, timeout?, concurrencyLimit?, rateLimit? }";

/**
 * Declares a worker's tasks once, so that `createWorker({ tasks })` runs them
 * and `new Client<typeof tasks>()` checks every enqueue against them. Checks
 * the tasks as createWorker does (a WorkerConfigError names the mistake) and
 * returns them unchanged.
 *
 * Each payload type is read from its handler's first parameter
 * (`run: async (p: { orderId: number }, ctx) => ...`); `ctx` and `ctx.tx` are
 * typed from `transactional`. To have `ctx.job.payload` and guardKey's
 * parameter typed too, and handlers' parameters without annotations, give a
 * payload map as the type argument: `defineTasks<TasksFor<{ credit: { orderId: number } }>>({ ... })`.
 */
export function defineTasks<T extends Tasks>(tasks: T): T {
  normalizeTasks(tasks);
  return tasks;
}

/** Validates a tasks object; returns the tasks by name. */
export function normalizeTasks(tasks: unknown): Map<string, NormalizedTask> {
  if (tasks === null || typeof tasks !== "object" || Array.isArray(tasks)) {
    throw new WorkerConfigError(`tasks must be an object mapping task names to handlers, got ${describe(tasks)}`);
  }
  const entries = Object.entries(tasks as Record<string, unknown>);
  if (entries.length === 0) throw new WorkerConfigError("tasks is empty: define at least one task");
  return new Map(entries.map(([name, definition]) => [name, normalizeTask(name, definition)]));
}

function normalizeTask(name: string, definition: unknown): NormalizedTask {
  if (name.trim() === "") throw new WorkerConfigError("a task name must be a non-empty string");
  const what = `task "${name}"`;
  if (typeof definition === "function") {
    return {
      name,
      run: definition as NormalizedTask["run"],
      transactional: false,
      guardKey: undefined,
      maxAttempts: undefined,
      backoff: undefined,
      exceptOn: [],
      onlyOn: undefined,
      lease: undefined,
      limits: undefined,
      timeoutMs: undefined,
    };
  }
  if (definition === null || typeof definition !== "object" || typeof (definition as { run?: unknown }).run !== "function") {
    throw new WorkerConfigError(`${what} is not a function or { run }: got ${describe(definition)}; expected ${TASK_SHAPE}`);
  }
  const config = definition as { [option in TaskOption]?: unknown };
  const unknown = Object.keys(config).find((key) => !isTaskOption(key));
  if (unknown !== undefined) {
    throw new WorkerConfigError(`${what} has an unknown option "${unknown}" (options: ${TASK_OPTIONS.join(", ")})`);
  }
  const transactional = config.transactional ?? false;
  if (typeof transactional !== "boolean") throw new WorkerConfigError(`${what}: transactional must be true or false`);
  const guardKey = config.guardKey;
  if (guardKey !== undefined) {
    if (typeof guardKey !== "function") throw new WorkerConfigError(`${what}: guardKey must be a function (payload) => key`);
    if (!transactional) {
      throw new WorkerConfigError(`${what}: guardKey needs transactional: true (the guard row commits in the job's transaction)`);
    }
  }
  const maxAttempts = config.maxAttempts;
  if (maxAttempts !== undefined && (!Number.isInteger(maxAttempts) || (maxAttempts as number) < 1)) {
    throw new WorkerConfigError(`${what}: maxAttempts must be an integer >= 1, got ${describe(maxAttempts)}`);
  }
  const backoff = config.backoff as Backoff | undefined;
  if (backoff !== undefined) {
    try {
      checkBackoff(backoff, what);
    } catch (error) {
      throw new WorkerConfigError((error as Error).message, { cause: error });
    }
  }
  return {
    name,
    run: config.run as NormalizedTask["run"],
    transactional,
    guardKey: guardKey as NormalizedTask["guardKey"],
    maxAttempts: maxAttempts as number | undefined,
    backoff,
    exceptOn: errorClasses(config.exceptOn, `${what}: exceptOn`) ?? [],
    onlyOn: errorClasses(config.onlyOn, `${what}: onlyOn`),
    lease: config.lease === undefined ? undefined : lease(config.lease as Duration, `${what}: lease`),
    limits: declaredLimits(config.concurrencyLimit, config.rateLimit, what),
    timeoutMs: config.timeout === undefined ? undefined : timeoutMs(config.timeout as Duration, `${what}: timeout`),
  };
}

/** concurrencyLimit and rateLimit, checked against set_limit's ranges, so a worker never starts with one SQL would refuse. */
function declaredLimits(concurrency: unknown, rateLimit: unknown, what: string): DeclaredLimits | undefined {
  const limits: DeclaredLimits = {};
  if (concurrency !== undefined) {
    const { min, max } = LIMIT_BOUNDS.concurrency;
    if (!Number.isInteger(concurrency) || (concurrency as number) < min || (concurrency as number) > max) {
      throw new WorkerConfigError(`${what}: concurrencyLimit must be an integer from ${min} to ${max}, got ${describe(concurrency)}`);
    }
    limits.concurrency = concurrency as number;
  }
  if (rateLimit !== undefined) {
    const shape = `rateLimit must be { rate, per }, e.g. { rate: 100, per: "1 minute" }`;
    if (rateLimit === null || typeof rateLimit !== "object" || Array.isArray(rateLimit)) {
      throw new WorkerConfigError(`${what}: ${shape}, got ${describe(rateLimit)}`);
    }
    const { rate, per, ...rest } = rateLimit as { rate?: unknown; per?: unknown };
    const extra = Object.keys(rest)[0];
    if (extra !== undefined) throw new WorkerConfigError(`${what}: rateLimit has an unknown option "${extra}" (${shape})`);
    if (rate === undefined) throw new WorkerConfigError(`${what}: ${shape}: rate is missing`);
    const { min, max } = LIMIT_BOUNDS.rate;
    if (!Number.isInteger(rate) || (rate as number) < min || (rate as number) > max) {
      throw new WorkerConfigError(`${what}: rateLimit.rate must be an integer from ${min} to ${max}, got ${describe(rate)}`);
    }
    if (per === undefined) throw new WorkerConfigError(`${what}: ${shape}: per is missing`);
    const ms = durationMs(per as Duration, `${what}: rateLimit.per`);
    if (ms < LIMIT_BOUNDS.perMinMs) {
      throw new WorkerConfigError(`${what}: rateLimit.per must be at least 1 second (scale both: 10 per 100 ms is { rate: 100, per: "1s" })`);
    }
    limits.rate = rate as number;
    limits.per = toPgInterval(per as Duration);
  }
  return limits.concurrency === undefined && limits.rate === undefined ? undefined : limits;
}

function errorClasses(value: unknown, what: string): ErrorClass[] | undefined {
  if (value === undefined) return undefined;
  if (!Array.isArray(value) || value.some((c) => typeof c !== "function")) {
    throw new WorkerConfigError(`${what} must be an array of error classes, e.g. [ValidationError]`);
  }
  return value as ErrorClass[];
}

/** A lease: a duration of more than 0 and at most a day (claim's range), as interval text and ms. */
export function lease(value: Duration, what: string): { interval: string; ms: number } {
  const ms = durationMs(value, what);
  if (ms <= 0 || ms > 86_400_000) throw new WorkerConfigError(`${what} must be more than 0 and at most 1 day`);
  return { interval: toPgInterval(value), ms };
}

/** A time limit: a duration of more than 0, finite (setTimeout's range: at most 24.8 days), in ms. */
export function timeoutMs(value: Duration, what: string): number {
  const ms = durationMs(value, what);
  if (!Number.isFinite(ms) || ms <= 0 || ms > 2_147_483_647) {
    throw new WorkerConfigError(`${what} must be more than 0 and at most 24 days (e.g. "30s"), got ${JSON.stringify(value)}`);
  }
  return ms;
}

/** A duration in ms, or a WorkerConfigError naming the option. */
export function durationMs(value: Duration, what: string): number {
  try {
    return toMilliseconds(value);
  } catch (error) {
    throw new WorkerConfigError(`${what}: ${(error as Error).message}`, { cause: error });
  }
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "object") return "an object without a run function";
  if (typeof value === "string") return `the string ${JSON.stringify(value)}`;
  return `${typeof value} ${String(value)}`;
}
