// Runs one claimed job and records how its attempt ended.
//
// Plain task: handler -> complete_many through the Completer (or complete()
// when it returned a result to store).
// Transactional task: on one pooled connection
//   BEGIN; guard(guardKey(payload) ?? the job's idempotency key, task)
//     false -> complete in the same transaction, COMMIT: job:duplicate, the handler never runs
//     true  -> handler with ctx.tx; complete(job_id, attempt) in the same transaction; COMMIT
//   IQ410 from complete (a newer attempt took the job) rolls the whole
//   transaction back, the handler's writes included: job:lease-lost.
//   A transactional task with neither a guardKey nor a job key runs unguarded
//   (its writes still commit only together with complete()).
// A failed attempt is recorded by fail(): not retryable for PermanentError or
// exceptOn/onlyOn; the task's own maxAttempts and backoff, when it has them,
// go to fail(), which applies them to the counted attempts (snoozes do not
// count) on the database clock (else the job's own, in SQL).
import type pg from "pg";
import { toMilliseconds } from "../contract.ts";
import { LeaseLostError, PermanentError } from "../errors.ts";
import * as sql from "../sql-api.ts";
import type { Completer } from "./completer.ts";
import { EffectBusyError } from "./effect.ts";
import { asError, errorInfo } from "./events.ts";
import { makeContext } from "./job-context.ts";
import { durationOf, jobEvent, type HeldJob, type Runtime } from "./runtime.ts";
import type { NormalizedTask } from "./task-config.ts";

/** The job names a task this worker does not have. Retryable: another worker may have it. */
export class UnknownTaskError extends Error {
  constructor(task: string, known: readonly string[]) {
    super(`this worker has no task "${task}" (it has: ${known.join(", ")})`);
    this.name = "UnknownTaskError";
  }
}

type Outcome = { ok: true; result: unknown } | { ok: false; error: unknown };

/**
 * Runs the job; calls freeSlot once its handler (and, for a transactional
 * task, its transaction) is over, and resolves when its attempt is recorded
 * (a plain success is then queued in the Completer).
 */
export async function runJob(rt: Runtime, held: HeldJob, completer: Completer, freeSlot: () => void): Promise<void> {
  held.phase = "running";
  held.startedAt = performance.now();
  rt.emit("job:start", { ...jobEvent(rt, held), reclaimed: held.job.reclaimed });
  if (held.task?.transactional) {
    await runTransactional(rt, held, held.task, freeSlot);
    return;
  }
  let outcome: Outcome;
  try {
    // claim() passes this worker's tasks, so this is a guard, not a path jobs take.
    if (held.task === undefined) throw new UnknownTaskError(held.job.task, [...rt.tasks.keys()]);
    outcome = { ok: true, result: await held.task.run(held.job.payload, makeContext(rt, held, undefined) as never) };
  } catch (error) {
    outcome = { ok: false, error };
  }
  held.endedAt = performance.now();
  held.phase = "finishing";
  freeSlot();
  if (held.abandoned) return; // handed back at shutdown; the attempt is already recorded
  if (held.snoozeDelay !== undefined) return snoozeJob(rt, held);
  if (!outcome.ok) return failJob(rt, held, outcome.error);
  if (held.leaseLost) return leaseLost(rt, held, "the lease was lost while the handler ran; its result is discarded");
  const result = storable(rt, held, outcome.result);
  if (result === undefined) {
    completer.add(held);
    return;
  }
  try {
    await sql.complete(rt.pool, held.job.id, held.job.attempt, result);
    rt.emit("job:success", { ...jobEvent(rt, held), durationMs: durationOf(held) });
  } catch (error) {
    if (error instanceof LeaseLostError) return leaseLost(rt, held, error.message);
    // The lease runs out and rescue() hands the job back: at least once.
    rt.report(`complete of job ${held.job.id}`, error);
  } finally {
    release(rt, held);
  }
}

async function runTransactional(
  rt: Runtime,
  held: HeldJob,
  task: NormalizedTask,
  freeSlot: () => void,
): Promise<void> {
  let client: pg.PoolClient;
  try {
    client = await rt.pool.connect();
  } catch (error) {
    held.endedAt = performance.now();
    held.phase = "finishing";
    freeSlot();
    return failJob(rt, held, error);
  }
  if (held.abandoned) {
    // Handed back at shutdown while waiting for a connection.
    client.release();
    freeSlot();
    return;
  }
  held.tx = client;
  let outcome: Outcome;
  let duplicateOf: string | undefined;
  let broken: Error | undefined;
  try {
    const key = task.guardKey?.(held.job.payload) ?? held.job.idempotencyKey;
    if (key === null) await client.query("BEGIN");
    else if (!(await sql.beginWithGuard(client, key, held.job.task))) duplicateOf = key;
    let result: unknown;
    if (duplicateOf === undefined) {
      result = await task.run(held.job.payload, makeContext(rt, held, client) as never);
      if (held.snoozeDelay !== undefined) throw new Error("snoozed"); // roll back, then snooze
    }
    if (held.abandoned) throw new Error("handed back at shutdown");
    held.phase = "finishing";
    // Fenced: IQ410 when a newer attempt holds the job, and everything above rolls back.
    await sql.completeAndCommit(client, held.job.id, held.job.attempt, storable(rt, held, result));
    outcome = { ok: true, result };
  } catch (error) {
    outcome = { ok: false, error };
    if (!held.abandoned) {
      try {
        await client.query("ROLLBACK");
      } catch (rollbackError) {
        broken = asError(rollbackError); // the pool discards the connection
      }
    }
  } finally {
    held.endedAt = performance.now();
    held.phase = "finishing";
    // At shutdown an abandoned job's connection is destroyed by the hand-back.
    if (held.tx === client) {
      held.tx = undefined;
      client.release(broken);
    }
    freeSlot();
  }
  if (held.abandoned) return;
  if (outcome.ok) {
    if (duplicateOf !== undefined) {
      rt.emit("job:duplicate", { ...jobEvent(rt, held), durationMs: durationOf(held), guardKey: duplicateOf });
    } else {
      rt.emit("job:success", { ...jobEvent(rt, held), durationMs: durationOf(held) });
    }
    release(rt, held);
    return;
  }
  if (held.snoozeDelay !== undefined) return snoozeJob(rt, held);
  return failJob(rt, held, outcome.error);
}

/** Records a failed attempt with fail(), or reports the lease lost. */
export async function failJob(rt: Runtime, held: HeldJob, error: unknown): Promise<void> {
  if (error instanceof LeaseLostError && isJobFence(error)) return leaseLost(rt, held, error.message);
  if (held.leaseLost) return leaseLost(rt, held, "the lease was lost while the handler ran; its error is discarded");
  const task = held.task;
  const permanent = isPermanent(task, error);
  const retryable = !permanent;
  // fail() applies the task's maxAttempts and backoff to the counted attempts
  // (snoozes do not count) on the database clock, and returns the run_at it
  // chose: the event reports it and the claim loop wakes for it.
  const info = errorInfo(error);
  try {
    const { state, runAt } = await sql.fail(rt.pool, held.job.id, held.job.attempt, info, {
      retryable,
      ...(task?.backoff === undefined ? {} : { backoff: task.backoff }),
      ...(task?.maxAttempts === undefined ? {} : { maxAttempts: task.maxAttempts }),
    });
    if (state === "failed") {
      rt.emit("job:failed", { ...jobEvent(rt, held), durationMs: durationOf(held), error: info, permanent });
    } else {
      rt.emit("job:retry", { ...jobEvent(rt, held), durationMs: durationOf(held), error: info, retryAt: runAt });
      rt.wakeAt(runAt.getTime());
    }
  } catch (failError) {
    if (failError instanceof LeaseLostError) return leaseLost(rt, held, failError.message);
    rt.report(`fail of job ${held.job.id}`, failError);
  } finally {
    release(rt, held);
  }
}

/** An IQ410 about this job (complete, fail, snooze), not about an effect claim (effect_done). */
function isJobFence(error: LeaseLostError): boolean {
  try {
    return JSON.parse(error.detail ?? "{}").job_id !== undefined;
  } catch {
    return false;
  }
}

function isPermanent(task: NormalizedTask | undefined, error: unknown): boolean {
  if (error instanceof PermanentError) return true;
  // busy means "not yet", never "never": retried whatever onlyOn says.
  if (error instanceof EffectBusyError || task === undefined) return false;
  if (task.exceptOn.some((cls) => error instanceof (cls as unknown as abstract new () => unknown))) return true;
  return task.onlyOn !== undefined && !task.onlyOn.some((cls) => error instanceof (cls as unknown as abstract new () => unknown));
}

async function snoozeJob(rt: Runtime, held: HeldJob): Promise<void> {
  const delay = held.snoozeDelay!;
  try {
    await sql.snooze(rt.pool, held.job.id, held.job.attempt, { delay });
    rt.emit("job:snoozed", { ...jobEvent(rt, held), durationMs: durationOf(held), delay: String(delay) });
    let ms: number | undefined;
    try {
      ms = toMilliseconds(delay);
    } catch {
      // months and years: the fallback poll finds the job
    }
    if (ms !== undefined) rt.wakeAt(Date.now() + ms);
  } catch (error) {
    if (error instanceof LeaseLostError) return leaseLost(rt, held, error.message);
    rt.report(`snooze of job ${held.job.id}`, error);
  } finally {
    release(rt, held);
  }
}

function leaseLost(rt: Runtime, held: HeldJob, reason: string): void {
  rt.emit("job:lease-lost", { ...jobEvent(rt, held), durationMs: durationOf(held), reason });
  release(rt, held);
}

/** This worker no longer holds the job: no more heartbeats for it. */
export function release(rt: Runtime, held: HeldJob): void {
  if (rt.held.get(held.job.id) === held) rt.held.delete(held.job.id);
}

/** A handler's return value as a jsonb result; undefined when there is none to store. */
function storable(rt: Runtime, held: HeldJob, result: unknown): unknown {
  if (result === undefined || result === null) return undefined;
  try {
    if (JSON.stringify(result) !== undefined) return result;
  } catch {
    // below
  }
  rt.emit("log", {
    level: "warn",
    message: "the handler's return value is not JSON; the job completes without a result",
    workerId: rt.settings.workerId,
    jobId: held.job.id,
    task: held.job.task,
    attempt: held.job.attempt,
  });
  return undefined;
}
