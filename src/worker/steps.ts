// Durable steps (docs/design.md and docs/worker.md, "Durable steps"): ctx.step,
// ctx.sleep, ctx.sleepUntil and ctx.waitFor, replayed from the job's step
// ledger (idemq.steps), read once per attempt, on the first step's call.
//
//   ctx.step(name, fn)                    recorded: return its result, fn not called
//                                         else: BEGIN; fn(tx); step_record; COMMIT
//   ctx.step(name, fn, { external: true }) recorded: return its result
//                                         else: ctx.effect's claim-first protocol
//                                         on a key of the job and step (fn(key)),
//                                         then effect_done and step_record in one
//                                         transaction (one WAL flush)
//   ctx.sleep / ctx.sleepUntil            recorded and over: return
//                                         else: sleep() -> over: return;
//                                         parked: the attempt ends (JobParked)
//   ctx.waitFor(event, { key, timeout })  received: its payload; timed_out: WaitTimeoutError
//                                         recorded for another event: StepError
//                                         else: await_event() -> the same, or
//                                         parked: the attempt ends (JobParked)
//
// Sleeps and waits are named by their order in the run ("sleep:1",
// "wait:1") unless given a name. A parked job's lease went with the park,
// so the attempt is over at once: the worker records nothing more for it.
import { createHash } from "node:crypto";
import type { Duration } from "../contract.ts";
import { RESULT_BYTES } from "../contract.ts";
import { toMilliseconds, toPgInterval } from "../duration.ts";
import { StepError, WaitTimeoutError } from "../errors.ts";
import * as sql from "../sql/index.ts";
import type { StepRow } from "../sql/index.ts";
import { runEffect } from "./effect.ts";
import type { HeldJob } from "./held-jobs.ts";
import type { EffectOptions } from "./types.ts";
import type { WorkerState } from "./worker-state.ts";

/** A transactional step: fn runs in the step's own transaction, which commits with the step's record. */
export interface TransactionalStepOptions {
  external?: false | undefined;
}

/** An external step: claim-first as ctx.effect, fn(key) gets the provider idempotency key of the job and step. */
export interface ExternalStepOptions<T> extends Omit<EffectOptions<T>, never> {
  external: true;
}

export interface SleepOptions {
  /** The sleep's name in the ledger; default "sleep:N", N its order among the run's sleeps. */
  name?: string | undefined;
}

export interface WaitForOptions {
  /** Which event of the name: e.g. the order id. Leave out for an event without a key (a NULL key matches only NULL). */
  key?: string | undefined;
  /** How long to wait at most, from the first time the job reached the wait; then WaitTimeoutError. */
  timeout: Duration;
  /** The wait's name in the ledger; default "wait:N", N its order among the run's waits. */
  name?: string | undefined;
}

/** What ctx adds for durable steps (a plain task only: a transactional task's writes commit at its end). */
export interface StepContext {
  /**
   * Runs the step `name` once per job: the first attempt that completes it
   * records its JSON result (at most RESULT_BYTES), every later attempt
   * returns the recorded result without calling fn. Transactional (default):
   * fn(tx) runs in the step's own transaction, whose writes commit exactly
   * once, with the record. External ({ external: true }): fn(key) calls
   * the outside world under ctx.effect's claim-first protocol; key is the
   * provider idempotency key for this job's step. A result of undefined is
   * recorded and returned as null.
   */
  step<T>(name: string, fn: (tx: import("pg").PoolClient) => Promise<T> | T, options?: TransactionalStepOptions): Promise<T>;
  step<T>(name: string, fn: (key: string) => Promise<T> | T, options: ExternalStepOptions<T>): Promise<T>;
  /** Durable sleep: ends the attempt without spending it, holding no worker slot; the job replays and passes it once due. */
  sleep(delay: Duration, options?: SleepOptions): Promise<void>;
  /** ctx.sleep until an instant. */
  sleepUntil(until: Date, options?: SleepOptions): Promise<void>;
  /**
   * Waits for idemq.emit(event, key) (or client.emit): returns its payload.
   * Parks the job meanwhile (no attempt spent, no slot held); an event
   * emitted before the wait was reached counts (docs/design.md has the
   * rule). Past the timeout: WaitTimeoutError, on every later attempt too.
   */
  waitFor<T = unknown>(event: string, options: WaitForOptions): Promise<T>;
}

/**
 * Thrown by ctx.sleep and ctx.waitFor when the database parked the job: the
 * attempt is over (its lease went with the park). Catching it changes
 * nothing: the worker records no outcome for a parked attempt.
 */
export class JobParked extends Error {
  constructor(
    readonly jobId: string,
    readonly step: string,
    readonly until: Date,
  ) {
    super(`job ${jobId} parked at step "${step}" until ${until.toISOString()} at the latest`);
    this.name = "JobParked";
  }
}

/** The parked attempts, with when they run again at the latest (run-job reads it after the handler). */
const parkedUntil = new WeakMap<HeldJob, Date>();

/** The attempt parked its job (ctx.sleep, ctx.waitFor): when it runs again at the latest; undefined when it did not. */
export function parkedAt(held: HeldJob): Date | undefined {
  return parkedUntil.get(held);
}

export function makeStepContext(state: WorkerState, held: HeldJob, transactional: boolean): StepContext {
  let ledger: Promise<Map<string, StepRow>> | undefined;
  const used = new Set<string>();
  let sleeps = 0;
  let waits = 0;
  const jobId = held.job.id;
  const attempt = { jobId, attempt: held.job.attempt, leaseToken: held.job.leaseToken };

  const recorded = async (name: string): Promise<StepRow | undefined> => {
    ledger ??= sql.steps(state.calls, jobId).then((rows) => new Map(rows.map((r) => [r.name, r])));
    return (await ledger).get(name);
  };
  const begin = (name: string): void => {
    if (typeof name !== "string" || name === "") throw new StepError(jobId, String(name), "a step name must be a non-empty string");
    if (transactional) {
      throw new StepError(jobId, name, "durable steps need a plain task: a transactional task's writes commit only at its end, so it has nothing to resume from");
    }
    if (used.has(name)) throw new StepError(jobId, name, "this step name is used twice in one run; give each step (and each named sleep or wait) its own name");
    used.add(name);
    // A lost lease (or a shutdown past its timeout): start no new step.
    if (held.abortedBy !== undefined) throw held.abortedBy;
  };
  const mismatch = (row: StepRow, name: string, kind: string): StepError =>
    new StepError(
      jobId,
      name,
      `recorded as a ${row.kind}, but this run takes it as a ${kind}: the handler no longer takes its steps in the order its recorded ones were ` +
        `taken (see docs/worker.md, "Changing a workflow")`,
    );
  const otherEvent = (row: StepRow, name: string, event: string, key: string | null): StepError =>
    new StepError(
      jobId,
      name,
      `recorded as a wait for event ${describeEvent(row.event, row.eventKey)}, but this run waits for event ${describeEvent(event, key)}: ` +
        `the workflow changed while the job was parked; deploy the changed workflow as a new task name and keep the old handler ` +
        `until its parked jobs have finished, or name the wait (see docs/design.md, "Changing a workflow while jobs are parked")`,
    );
  const park = (name: string, until: Date): never => {
    parkedUntil.set(held, until);
    state.held.finish(held); // the lease went with the park: a heartbeat that misses the job now changes nothing
    throw new JobParked(jobId, name, until);
  };

  /**
   * An external step's outcome: effect_done and step_record in one
   * transaction, one WAL flush for both (two round trips, as before). When
   * the step cannot be recorded (this attempt lost its lease: IQ410) the
   * transaction rolls back to the savepoint after effect_done and commits
   * that alone, so the attempt that took over finds the effect done and does
   * not call the provider again. The effect's row stays locked from
   * effect_done to that commit: another attempt's effect_claim waits for it
   * and never sees the claim without its outcome.
   */
  async function recordEffectAndStep(key: string, owner: string, name: string, result: unknown): Promise<void> {
    const client = await state.pool.connect();
    let broken: unknown;
    let effectWritten = false;
    try {
      await sql.beginWithEffectDone(client, key, owner, result);
      effectWritten = true;
      await sql.stepRecordAndCommit(client, attempt, name, result, "SAVEPOINT step");
    } catch (error) {
      try {
        await client.query(effectWritten ? "ROLLBACK TO SAVEPOINT step; COMMIT" : "ROLLBACK");
      } catch (endError) {
        broken = endError;
        state.report(`effect_done of "${key}" (the claim stays and goes stale; the next attempt reconciles)`, endError);
      }
      throw error;
    } finally {
      client.release(broken as Error | undefined);
    }
  }

  async function step<T>(name: string, fn: (arg: never) => Promise<T> | T, options?: TransactionalStepOptions | ExternalStepOptions<T>): Promise<T> {
    begin(name);
    if (typeof fn !== "function") throw new StepError(jobId, name, "fn must be a function");
    const row = await recorded(name);
    if (row !== undefined) {
      if (row.kind !== "step") throw mismatch(row, name, "step");
      return row.result as T;
    }
    if (options?.external === true) {
      const { external: _external, ...effectOptions } = options;
      let recorded = false;
      const result = await runEffect(
        state,
        held,
        stepEffectKey(jobId, name),
        async (key) => checkedResult(jobId, name, await (fn as (key: string) => Promise<T> | T)(key)),
        effectOptions as EffectOptions<T>,
        async (key, owner, value) => {
          await recordEffectAndStep(key, owner, name, value);
          recorded = true;
        },
      );
      // An effect done before (an earlier attempt's call, its step not recorded): its result, recorded now.
      if (!recorded) await sql.stepRecord(state.calls, attempt, name, result);
      return result;
    }
    const client = await state.pool.connect();
    let broken: unknown;
    try {
      await client.query("BEGIN");
      const result = checkedResult(jobId, name, await (fn as (tx: import("pg").PoolClient) => Promise<T> | T)(client));
      await sql.stepRecord(client, attempt, name, result);
      await client.query("COMMIT");
      return result;
    } catch (error) {
      try {
        await client.query("ROLLBACK");
      } catch (rollbackError) {
        broken = rollbackError;
      }
      throw error;
    } finally {
      client.release(broken as Error | undefined);
    }
  }

  async function sleepFor(name: string | undefined, when: { delay: Duration } | { wakeAt: Date }): Promise<void> {
    const stepName = name ?? `sleep:${++sleeps}`;
    begin(stepName);
    const row = await recorded(stepName);
    if (row !== undefined && row.kind !== "sleep") throw mismatch(row, stepName, "sleep");
    if (row?.over === true) return;
    const { parked, runAt } = await sql.sleep(state.calls, attempt, stepName, when);
    if (parked) park(stepName, runAt);
  }

  return {
    step: step as StepContext["step"],
    sleep: (delay, options) => {
      toPgInterval(delay); // a bad duration throws here, as a failure of the handler
      return sleepFor(options?.name, { delay });
    },
    sleepUntil: (until, options) => {
      if (!(until instanceof Date) || Number.isNaN(until.getTime())) return Promise.reject(new TypeError("ctx.sleepUntil: until must be a valid Date"));
      return sleepFor(options?.name, { wakeAt: until });
    },
    waitFor: async <T>(event: string, options: WaitForOptions): Promise<T> => {
      const name = options?.name ?? `wait:${++waits}`;
      if (typeof event !== "string" || event === "") throw new StepError(jobId, name, "ctx.waitFor: event must be a non-empty string");
      if (options?.timeout === undefined) throw new StepError(jobId, name, "ctx.waitFor needs a timeout (e.g. { timeout: '3 days' })");
      toMilliseconds(options.timeout);
      begin(name);
      const key = options.key ?? null;
      const row = await recorded(name);
      if (row !== undefined && row.kind !== "wait") throw mismatch(row, name, "wait");
      // Checked here, from the ledger, so it fails as a StepError (permanent):
      // await_event's 22023 for it would be a BadArgumentError, which the
      // worker retries, and every retry would meet the same record.
      if (row !== undefined && (row.event !== event || row.eventKey !== key)) throw otherEvent(row, name, event, key);
      if (row?.status === "received") return row.result as T;
      if (row?.status === "timed_out") throw new WaitTimeoutError(jobId, name, event, key);
      const answer = await sql.awaitEvent(state.calls, attempt, name, event, key, options.timeout);
      if (answer.status === "received") return answer.payload as T;
      if (answer.status === "timed_out") throw new WaitTimeoutError(jobId, name, event, key);
      const until = row?.wakeAt ?? new Date(Date.now() + toMilliseconds(options.timeout));
      return park(name, until);
    },
  };
}

/** An event as a message names it: "name" with key "k", or without a key. */
function describeEvent(event: string | null, key: string | null): string {
  return `${JSON.stringify(event)} ${key === null ? "without a key" : `with key ${JSON.stringify(key)}`}`;
}

/**
 * The effect key (and provider idempotency key) of an external step: the job
 * and a digest of the step's name, so it is short whatever the name (Stripe
 * takes 255 characters) and names one step of one job for good.
 */
export function stepEffectKey(jobId: string, name: string): string {
  return `idemq-job-${jobId}-step-${createHash("sha256").update(name).digest("hex").slice(0, 32)}`;
}

/** A step's result as the ledger will give it back: JSON (undefined becomes null), at most RESULT_BYTES. */
function checkedResult<T>(jobId: string, name: string, value: T): T {
  if (value === undefined) return null as T;
  const problem = notJson(value, "the result");
  if (problem !== undefined) throw new StepError(jobId, name, `${problem}; return JSON (objects, arrays, strings, finite numbers, booleans, null)`);
  const bytes = Buffer.byteLength(JSON.stringify(value));
  if (bytes > RESULT_BYTES) {
    throw new StepError(jobId, name, `the result is ${bytes} bytes of JSON, over the limit of ${RESULT_BYTES}; store bulky data in a table and return its key`);
  }
  return value;
}

/** Why a value would not come back from the ledger as it is (a Date as a string, NaN as null, a Map as {}); undefined when it would. */
function notJson(value: unknown, path: string, seen = new Set<object>()): string | undefined {
  if (value === null || typeof value === "string" || typeof value === "boolean") return undefined;
  if (typeof value === "number") return Number.isFinite(value) ? undefined : `${path} is ${value}, which JSON cannot hold`;
  if (typeof value !== "object") return `${path} is a ${typeof value}, not JSON`;
  if (seen.has(value)) return `${path} refers to itself`;
  seen.add(value);
  try {
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) {
        if (value[i] === undefined) return `${path}[${i}] is undefined, not JSON`;
        const problem = notJson(value[i], `${path}[${i}]`, seen);
        if (problem !== undefined) return problem;
      }
      return undefined;
    }
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) return `${path} is a ${(value as object).constructor?.name ?? "class instance"}, not a plain object`;
    for (const [k, v] of Object.entries(value)) {
      if (v === undefined) continue; // left out, as JSON.stringify leaves it
      const problem = notJson(v, `${path}.${k}`, seen);
      if (problem !== undefined) return problem;
    }
    return undefined;
  } finally {
    seen.delete(value);
  }
}
