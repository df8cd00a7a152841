// Runs one claimed job and records how its attempt ended.
//
// Plain task: handler -> complete_many through the Completer (or complete()
// when it returned a result to store).
// Transactional task: on one pooled connection
//   BEGIN; guard(guardKey(payload) ?? the job's idempotency key, task)
//     false -> complete in the same transaction, COMMIT: job:duplicate, the handler never runs
//     true  -> handler with ctx.tx; complete(job_id, attempt) in the same transaction; COMMIT
//   IQ410 from complete (a newer attempt took the job, or an operator
//   cancelled it) rolls the whole transaction back, the handler's writes
//   included: job:lease-lost, or job:cancelled (lost.ts).
//   A transactional task with neither a guardKey nor a job key runs unguarded
//   (its writes still commit only together with complete()).
//   While the handler runs, each heartbeat that kept the job's lease also
//   keeps its transaction busy (keepTransactionBusy), so the server's idle
//   timeout (beginStatement) ends the session of a frozen worker only.
// A failed attempt is recorded by fail(): not retryable for PermanentError or
// exceptOn/onlyOn; the task's own maxAttempts and backoff, when it has them,
// go to fail(), which applies them to the counted attempts (snoozes do not
// count) on the database clock (else the job's own, in SQL).
// With tracing on, the whole attempt runs in its span (src/tracing/spans.ts),
// and each end below tells the span how the attempt ended (held.trace).
import type pg from "pg";
import { RESULT_BYTES } from "../contract.ts";
import { toMilliseconds } from "../duration.ts";
import { BadArgumentError, EffectClaimLostError, LeaseLostError, PermanentError, RateLimitedError, TimeoutError } from "../errors.ts";
import * as sql from "../sql/index.ts";
import { parkJob } from "./children.ts";
import type { Completer } from "./completer.ts";
import { EffectBusyError } from "./effect.ts";
import { asError, errorInfo, leaseLostFields } from "./events.ts";
import { abortAttempt, isReleased, type HeldJob } from "./held-jobs.ts";
import { makeContext } from "./job-context.ts";
import { parkedAt } from "./steps.ts";
import { asLost, attemptLost } from "./lost.ts";
import { jitter } from "./timers.ts";
import type { NormalizedTask } from "./task-config.ts";
import { durationOf, jobEvent, type WorkerState } from "./worker-state.ts";

/** The job names a task this worker does not have. Retryable: another worker may have it. */
export class UnknownTaskError extends Error {
  constructor(task: string, known: readonly string[]) {
    super(`this worker has no task "${task}" (it has: ${known.join(", ")})`);
    this.name = "UnknownTaskError";
  }
}

/**
 * The server ended a transactional job's session because its transaction sat
 * idle past idle_in_transaction_session_timeout (SQLSTATE 25P03). Recorded as
 * the attempt's error instead of pg's "Client has encountered a connection
 * error and is not queryable", which the handler's next statement gets.
 */
export class IdleTransactionTimeoutError extends Error {
  constructor(held: HeldJob, timeout: IdleTimeout, options?: ErrorOptions) {
    super(
      `job ${held.job.id} (${held.job.task}, attempt ${held.job.attempt}): the server ended its transaction after it sat idle ` +
        `for ${timeout.ms} ms (idle_in_transaction_session_timeout: the lease, ${timeout.leaseMs} ms, + ${timeout.marginMs} ms), ` +
        `and its writes rolled back. A live worker keeps the transaction busy at every heartbeat, so this worker's heartbeats ` +
        `stopped or failed for that long (a blocked event loop, a frozen process, a lost connection to the database): ` +
        `keep the transaction busy (do not block the event loop; make slow external calls before its first statement or ` +
        `through ctx.effect) or give the task a longer lease`,
      options,
    );
    this.name = "IdleTransactionTimeoutError";
  }
}

/** SQLSTATE idle_in_transaction_session_timeout: the FATAL a session ended by that timeout gets. */
const IDLE_IN_TRANSACTION_TIMEOUT = "25P03";

type Outcome = { ok: true; result: unknown } | { ok: false; error: unknown };

/**
 * Runs a started job: gives its slot back (HeldJobs.freeSlot) once its
 * handler (and, for a transactional task, its transaction) is over, and
 * resolves when its attempt is recorded (a plain success is then queued in
 * the Completer), after calling `over` (the worker forgets the job: its
 * inFlight entry). Never rejects: what escapes is reported (worker:error).
 */
export function runJob(state: WorkerState, held: HeldJob, completer: Completer, over: (held: HeldJob) => void): Promise<void> {
  const tracing = state.tracing;
  // The common case (no tracing, or the API without an SDK or a context manager): one async function per job.
  if (tracing === undefined || tracing.passesThrough) return runAttempt(state, held, completer, over);
  return runTraced(tracing, state, held, completer, over);
}

/**
 * The attempt in its span: the bookkeeping waits for the span's end, and
 * what escapes the attempt marks the span before it is reported.
 */
async function runTraced(
  tracing: NonNullable<WorkerState["tracing"]>,
  state: WorkerState,
  held: HeldJob,
  completer: Completer,
  over: (held: HeldJob) => void,
): Promise<void> {
  try {
    await tracing.run(held.job, (span) => {
      held.trace = span;
      return runAttempt(state, held, completer, undefined);
    });
  } catch (error) {
    state.report(`running job ${held.job.id}`, error);
  } finally {
    jobOver(state, held, over);
  }
}

/**
 * One attempt, from job:start to its outcome recorded or queued. One async
 * function for the whole of it, the worker's bookkeeping included (`over`,
 * when the caller leaves it here): each async layer per job is a frame, a
 * promise and an await more, and the two layers that wrapped it (the
 * worker's, and tracing.run's without an SDK) cost 540 B per job
 * (bench/FINDINGS.md, "The worker's allocations per job"). The microtask
 * before the handler stays: a handler never runs inside startClaimed's loop.
 */
async function runAttempt(state: WorkerState, held: HeldJob, completer: Completer, over: ((held: HeldJob) => void) | undefined): Promise<void> {
  try {
    if (state.listening("job:start")) state.emit("job:start", { ...jobEvent(state, held), reclaimed: held.job.reclaimed });
    if (held.task?.transactional) {
      await runTransactional(state, held, held.task);
      return;
    }
    // The outcome as two locals, not an object: this path runs once per job, and
    // its allocations are the largest share of the worker's (bench/FINDINGS.md,
    // "The worker's allocations per job").
    let failed = false;
    let returned: unknown;
    const limit = timeLimit(held);
    try {
      // claim() passes this worker's tasks, so this is a guard, not a path jobs take.
      if (held.task === undefined) throw new UnknownTaskError(held.job.task, [...state.tasks.keys()]);
      const task = held.task;
      // A microtask later: never inside startClaimed's loop. (`await undefined`,
      // then the handler, allocated more: 1,099 against 873 B/job sampled.)
      const running = Promise.resolve().then(() => task.run(held.job.payload, makeContext(state, held, undefined) as never));
      // Past the time limit the attempt fails whether or not the handler heeds ctx.signal.
      returned = await (limit === undefined ? running : Promise.race([running, limit.expired]));
    } catch (error) {
      failed = true;
      returned = limit?.fired ?? error;
    } finally {
      limit?.clear();
    }
    handlerOver(state, held);
    // Each end below is awaited here, not returned: the finally waits for it.
    if (isReleased(held)) {
      held.trace?.end("released"); // handed back at shutdown; the attempt is already recorded
      return;
    }
    const parked = parkedAt(held);
    if (parked !== undefined) return parkedJob(state, held, parked);
    if (held.snoozeDelay !== undefined) return await snoozeJob(state, held);
    if (held.awaitingChildren !== undefined) return await parkJob(state, held);
    if (failed) return await failJob(state, held, returned);
    // A heartbeat found the lease gone (held.fencedOut): complete anyway. It is
    // fenced, so it changes nothing, and its IQ410 says why (a cancel included).
    const result = storable(state, held, returned);
    if (result === undefined) {
      held.trace?.end("succeeded"); // complete_many follows in a batch, after the span
      completer.add(held);
      return;
    }
    await completeWithResult(state, held, result);
  } catch (error) {
    if (over === undefined) throw error; // runTraced reports it, after the span has seen it
    state.report(`running job ${held.job.id}`, error);
  } finally {
    if (over !== undefined) jobOver(state, held, over);
  }
}

/** The attempt is over, however it ended: its slot is free (already, unless a throw came first), and the worker forgets it. */
function jobOver(state: WorkerState, held: HeldJob, over: (held: HeldJob) => void): void {
  state.held.freeSlot(held);
  over(held);
}

/** complete() with the handler's result, as storable's JSON text (the Completer's batches carry none). */
async function completeWithResult(state: WorkerState, held: HeldJob, resultJson: string): Promise<void> {
  try {
    await sql.complete(state.preparedCalls, held.job.id, held.job.attempt, held.job.leaseToken, resultJson);
    held.trace?.end("succeeded");
    if (state.listening("job:success")) state.emit("job:success", { ...jobEvent(state, held), durationMs: durationOf(held) });
  } catch (caught) {
    const error = asLost(caught);
    if (error instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(error));
    // The lease runs out and rescue() hands the job back: at least once.
    state.report(`complete of job ${held.job.id}`, error);
  } finally {
    state.held.remove(held);
  }
}

/**
 * pool.connect() with `onError` listening from the moment of checkout, not
 * from the next tick: a new connection's ReadyForQuery and a FATAL (a server
 * shutting down sends 57P01 to every session) can arrive in one TCP read, and
 * node-postgres emits the FATAL in the same tick that hands the client over,
 * before an `await pool.connect()` resumes; with no listener that 'error'
 * ends the process (seen in CI during `pg_ctl stop -m fast`).
 */
function checkOutListening(pool: pg.Pool, onError: (error: Error) => void): Promise<pg.PoolClient> {
  return new Promise((resolve, reject) => {
    pool.connect((error, client) => {
      if (error !== undefined && error !== null) return reject(error);
      client!.on("error", onError);
      resolve(client!);
    });
  });
}

/**
 * The attempt's time limit: its task's `timeout`, counted from the
 * attempt's start, and its job's own (enqueue's timeout), counted from its
 * claim as heartbeat() counts it from locked_at; whichever runs out first
 * aborts ctx.signal with a TimeoutError naming its limit (`fired`), and
 * `expired` rejects with it. Undefined when neither is set.
 */
function timeLimit(held: HeldJob): { expired: Promise<never>; fired: TimeoutError | undefined; clear(): void } | undefined {
  // Most jobs have no limit: nothing allocated for them.
  if (held.task?.timeoutMs === undefined && held.job.timeoutMs === null) return undefined;
  const now = performance.now();
  const limits: { limitMs: number; leftMs: number }[] = [];
  if (held.task?.timeoutMs !== undefined) limits.push({ limitMs: held.task.timeoutMs, leftMs: held.task.timeoutMs - (now - held.startedAt) });
  if (held.job.timeoutMs !== null) limits.push({ limitMs: held.job.timeoutMs, leftMs: held.job.timeoutMs - (now - held.claimedAt) });
  if (limits.length === 0) return undefined;
  const { limitMs, leftMs } = limits.reduce((a, b) => (b.leftMs < a.leftMs ? b : a));
  let timer: ReturnType<typeof setTimeout> | undefined;
  const state: { expired: Promise<never>; fired: TimeoutError | undefined; clear(): void } = {
    fired: undefined,
    expired: new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => {
        const error = new TimeoutError(held.job.id, held.job.task, held.job.attempt, limitMs);
        state.fired = error;
        abortAttempt(held, error);
        reject(error);
      }, Math.max(0, leftMs));
    }),
    clear: () => clearTimeout(timer),
  };
  state.expired.catch(() => undefined); // raced, or unused by a transactional attempt
  return state;
}

/** started -> finished, and the slot goes to the next job. */
function handlerOver(state: WorkerState, held: HeldJob): void {
  state.held.finish(held);
  state.held.freeSlot(held);
}

async function runTransactional(state: WorkerState, held: HeldJob, task: NormalizedTask): Promise<void> {
  let broken: Error | undefined;
  // pg-pool drops its idle-client error listener at checkout, and node-postgres
  // emits 'error' on a FATAL message (a terminated backend) or a lost socket:
  // without a listener of our own that ends the process. The attempt's next
  // query fails anyway, and the broken connection is discarded on release.
  const onConnectionError = (error: Error): void => {
    broken ??= error;
  };
  let client: pg.PoolClient;
  try {
    client = await checkOutListening(state.pool, onConnectionError);
  } catch (error) {
    handlerOver(state, held);
    return failJob(state, held, error);
  }
  if (isReleased(held)) {
    // Handed back at shutdown while waiting for a connection.
    client.removeListener("error", onConnectionError);
    client.release(broken);
    state.held.freeSlot(held);
    return;
  }
  held.tx = client;
  const idle = idleTimeout(state, held);
  let outcome: Outcome;
  let duplicateOf: string | undefined;
  try {
    const key = task.guardKey?.(held.job.payload) ?? held.job.idempotencyKey;
    const begin = beginStatement(idle);
    const beginMadeAt = performance.now();
    if (key === null) await client.query(begin);
    else if (!(await sql.beginWithGuard(client, key, held.job.task, begin))) duplicateOf = key;
    state.reached(beginMadeAt);
    let result: unknown;
    if (duplicateOf === undefined) {
      handlerTransactions.set(held, { client, touching: false });
      // A transactional handler owns its connection until it returns: past
      // the time limit ctx.signal aborts, and the attempt fails (rolled back)
      // when the handler returns; the lease is not extended past a job's own
      // limit, so a handler that never returns loses its lease and its session.
      const limit = timeLimit(held);
      try {
        result = await task.run(held.job.payload, makeContext(state, held, client) as never);
      } finally {
        limit?.clear();
        // Before COMMIT or ROLLBACK is queued: no keep-busy statement may follow them onto a connection going back to the pool.
        handlerTransactions.delete(held);
      }
      if (limit?.fired !== undefined) throw limit.fired;
      if (held.snoozeDelay !== undefined) throw new Error("snoozed"); // roll back, then snooze
      if (held.awaitingChildren !== undefined) throw new Error("awaiting children"); // roll back, then park
    }
    if (isReleased(held)) throw new Error("handed back at shutdown");
    // Finished before the commit: a heartbeat that sees the job succeeded is not a loss.
    state.held.finish(held);
    // Fenced: IQ410 when a newer attempt holds the job, and everything above rolls back.
    const commitMadeAt = performance.now();
    await sql.completeAndCommit(client, held.job.id, held.job.attempt, held.job.leaseToken, storable(state, held, result)).catch((error: unknown) => {
      throw asLost(error);
    });
    state.reached(commitMadeAt);
    outcome = { ok: true, result };
  } catch (error) {
    // The server's FATAL reached the connection ('error', so `broken`) or the statement in flight; the
    // handler's next statement only learns that the connection is gone. Say why it went.
    const timedOut = [broken, error].some((e) => hasCode(e, IDLE_IN_TRANSACTION_TIMEOUT));
    outcome = { ok: false, error: timedOut ? new IdleTransactionTimeoutError(held, idle, { cause: broken ?? error }) : error };
    if (!isReleased(held)) {
      try {
        await client.query("ROLLBACK");
      } catch (rollbackError) {
        broken = asError(rollbackError); // the pool discards the connection
      }
    }
  } finally {
    // At shutdown a handed-back job's connection is destroyed by the hand-back.
    if (held.tx === client) {
      held.tx = undefined;
      // A healthy connection goes back to the pool, which listens on it again;
      // a broken one is destroyed and keeps ours, in case it reports more.
      if (broken === undefined) client.removeListener("error", onConnectionError);
      client.release(broken);
    }
    handlerOver(state, held);
  }
  if (isReleased(held)) return held.trace?.end("released");
  if (outcome.ok) {
    if (duplicateOf !== undefined) {
      held.trace?.duplicate();
      state.emit("job:duplicate", { ...jobEvent(state, held), durationMs: durationOf(held), guardKey: duplicateOf });
    } else {
      held.trace?.end("succeeded");
      if (state.listening("job:success")) state.emit("job:success", { ...jobEvent(state, held), durationMs: durationOf(held) });
    }
    state.held.remove(held);
    return;
  }
  if (held.snoozeDelay !== undefined) return snoozeJob(state, held);
  if (held.awaitingChildren !== undefined) return parkJob(state, held);
  return failJob(state, held, outcome.error);
}

/**
 * Records a failed attempt with fail(), or reports the lease lost. An effect
 * claim lost in ctx.effect is a failure like any other: the job's own lease
 * may be intact, so the attempt is recorded and retried.
 */
async function failJob(state: WorkerState, held: HeldJob, error: unknown): Promise<void> {
  // The database said why (an IQ410 naming the job's state, or IQ404). The
  // LeaseLostError ctx.signal aborted with says only that a heartbeat missed
  // the job: then, as for any error of a fenced-out attempt, fail() below asks
  // (fenced, it records nothing; its IQ410 tells a cancel from a lost lease).
  const saidWhy = !(held.fencedOut && error === held.abortedBy);
  if (error instanceof LeaseLostError && !(error instanceof EffectClaimLostError) && saidWhy) {
    return attemptLost(state, held, leaseLostFields(error));
  }
  if (error instanceof EffectBusyError) {
    // "Not yet" is no failure: the job waits for the other run without spending an attempt.
    held.snoozeDelay = Math.round(jitter(state.settings.effectBusySnoozeMs, 0.5));
    return snoozeJob(state, held);
  }
  if (error instanceof RateLimitedError) return holdJob(state, held, error);
  const task = held.task;
  const permanent = isPermanent(task, error);
  const retryable = !permanent;
  // fail() applies the task's maxAttempts and backoff to the counted attempts
  // (snoozes do not count) on the database clock, and returns the run_at it
  // chose: the event reports it and the claim loop wakes for it.
  const info = errorInfo(error);
  try {
    const { state: jobState, runAt } = await sql.fail(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, info, {
      retryable,
      ...(task?.backoff === undefined ? {} : { backoff: task.backoff }),
      ...(task?.maxAttempts === undefined ? {} : { maxAttempts: task.maxAttempts }),
    });
    held.trace?.end(jobState === "failed" ? "failed" : "retry", error);
    if (jobState === "failed") {
      state.emit("job:failed", { ...jobEvent(state, held), durationMs: durationOf(held), error: info, permanent });
    } else {
      state.emit("job:retry", { ...jobEvent(state, held), durationMs: durationOf(held), error: info, retryAt: runAt });
      state.wakeAt(runAt.getTime());
    }
  } catch (caught) {
    const failError = asLost(caught);
    if (failError instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(failError));
    // A heartbeat missed the job, and asking why failed: lost all the same, for a reason unknown.
    if (held.fencedOut) {
      return attemptLost(state, held, { reason: "lost while the handler ran (a heartbeat missed the job); its error is discarded" });
    }
    held.trace?.end("retry", error); // not recorded: rescue() hands the job back when its lease runs out
    state.report(`fail of job ${held.job.id}`, failError);
  } finally {
    state.held.remove(held);
  }
}

/** A transactional attempt's idle_in_transaction_session_timeout, and what it is made of. */
interface IdleTimeout {
  ms: number;
  leaseMs: number;
  marginMs: number;
}

/** The job's lease (the task's, else the worker's) plus idleInTransactionMargin. */
function idleTimeout(state: WorkerState, held: HeldJob): IdleTimeout {
  const leaseMs = held.task?.lease?.ms ?? state.settings.lease.ms;
  const marginMs = state.settings.idleInTransactionMarginMs;
  return { ms: Math.round(leaseMs + marginMs), leaseMs, marginMs };
}

/**
 * BEGIN for a transactional job, with idle_in_transaction_session_timeout a
 * little above the job's lease: the session of a worker that froze or was
 * cut off (its heartbeats stopped, its lease ran out, it can never commit)
 * is ended by the server instead of holding the guard row and its locks for
 * hours. A live worker's handler may leave its transaction idle as long as
 * it likes (an awaited HTTP call between two statements): every heartbeat
 * that kept the lease restarts the server's idle timer
 * (keepTransactionBusy), and heartbeats come every lease / 3. SET LOCAL, so
 * it works through a transaction pooler and ends with the transaction.
 */
function beginStatement(idle: IdleTimeout): string {
  return `BEGIN; SET LOCAL idle_in_transaction_session_timeout = ${idle.ms}`;
}

/**
 * The transactional attempts whose handler runs now, with their transaction's
 * connection; `touching` while a keep-busy statement is queued or running, so
 * a handler blocked in a long statement does not collect one per heartbeat.
 */
const handlerTransactions = new WeakMap<HeldJob, { client: pg.PoolClient; touching: boolean }>();

/**
 * A statement with nothing in it but a comment: the server parses it to
 * nothing and answers EmptyQueryResponse. It cannot fail (not even in a
 * transaction a failed statement aborted), changes nothing, yet restarts the
 * session's idle-in-transaction timer like any statement; pg_stat_activity
 * shows who sent it.
 */
const KEEP_BUSY = "/* idemq: this job's heartbeat keeps its transaction busy */";

/**
 * A heartbeat kept `held`'s lease: when its handler runs in a transaction,
 * restart that session's idle timer, so that the server ends it only once
 * heartbeats stop (beginStatement). pg's Client queues the statement behind
 * a statement of the handler's in flight. A connection already broken
 * rejects it: the handler's own next statement reports that.
 */
export function keepTransactionBusy(held: HeldJob): void {
  const tx = handlerTransactions.get(held);
  if (tx === undefined || tx.touching || held.phase !== "started") return;
  tx.touching = true;
  const done = (): void => {
    tx.touching = false;
  };
  tx.client.query(KEEP_BUSY).then(done, done);
}

/** The error, or one of its causes, has this SQLSTATE. */
function hasCode(error: unknown, code: string): boolean {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    if ((e as { code?: unknown }).code === code) return true;
  }
  return false;
}

function isPermanent(task: NormalizedTask | undefined, error: unknown): boolean {
  if (error instanceof PermanentError) return true;
  // busy means "not yet", never "never": retried whatever onlyOn says.
  if (error instanceof EffectBusyError || task === undefined) return false;
  if (task.exceptOn.some((cls) => error instanceof (cls as unknown as abstract new () => unknown))) return true;
  return task.onlyOn !== undefined && !task.onlyOn.some((cls) => error instanceof (cls as unknown as abstract new () => unknown));
}

async function snoozeJob(state: WorkerState, held: HeldJob): Promise<void> {
  const delay = held.snoozeDelay!;
  try {
    await sql.snooze(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, { delay });
    held.trace?.end("snoozed");
    state.emit("job:snoozed", { ...jobEvent(state, held), durationMs: durationOf(held), delay: String(delay) });
    let ms: number | undefined;
    try {
      ms = toMilliseconds(delay);
    } catch {
      // months and years: the fallback poll finds the job
    }
    if (ms !== undefined) state.wakeAt(Date.now() + ms);
  } catch (caught) {
    const error = asLost(caught);
    if (error instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(error));
    state.report(`snooze of job ${held.job.id}`, error);
  } finally {
    state.held.remove(held);
  }
}

/**
 * ctx.sleep or ctx.waitFor parked the job (sleep(), await_event()): the
 * database already ended the attempt without spending it, so nothing is left
 * to record, whatever the handler did after. The claim loop wakes at `until`
 * (a wait's event wakes it sooner, by NOTIFY).
 */
function parkedJob(state: WorkerState, held: HeldJob, until: Date): void {
  held.trace?.end("snoozed");
  state.emit("job:snoozed", { ...jobEvent(state, held), durationMs: durationOf(held), delay: `${Math.max(0, until.getTime() - Date.now())}ms` });
  state.wakeAt(until.getTime());
  state.held.remove(held);
}

/**
 * The handler threw RateLimitedError (its API said 429 with a Retry-After):
 * hold() holds back the job's queue, task or concurrency key from every
 * claim until then and snoozes the job to that time, its attempt not spent.
 * A transactional attempt's writes rolled back first, as for any error. A
 * hold the database refuses (scope "key" on a job without a concurrency
 * key: 22023, naming the job and the fix) fails the attempt with that
 * error, so it is on the job and the task's retry policy applies.
 */
async function holdJob(state: WorkerState, held: HeldJob, error: RateLimitedError): Promise<void> {
  const delay = `${error.retryAfterMs}ms`;
  try {
    const until = await sql.hold(state.calls, held.job.id, held.job.attempt, held.job.leaseToken, error.scope, delay);
    held.trace?.end("snoozed");
    const name = error.scope === "queue" ? held.job.queue : error.scope === "task" ? held.job.task : null;
    state.emit("job:snoozed", {
      ...jobEvent(state, held),
      durationMs: durationOf(held),
      delay,
      held: { scope: error.scope, name, until },
    });
    state.wakeAt(Date.now() + error.retryAfterMs);
  } catch (caught) {
    const lost = asLost(caught);
    if (lost instanceof LeaseLostError) return attemptLost(state, held, leaseLostFields(lost));
    // Awaited: the job stays held (heartbeats, shutdown) until fail() answers.
    if (lost instanceof BadArgumentError) return await failJob(state, held, lost);
    held.trace?.end("retry", error); // not recorded: rescue() hands the job back when its lease runs out
    state.report(`hold of job ${held.job.id}`, lost);
  } finally {
    state.held.remove(held);
  }
}

/**
 * A handler's return value as the JSON text of its jsonb result (serialized
 * once: measured for the limit, then sent as is); undefined when there is
 * none to store.
 */
function storable(state: WorkerState, held: HeldJob, result: unknown): string | undefined {
  if (result === undefined || result === null) return undefined;
  let text: string | undefined;
  try {
    text = JSON.stringify(result);
  } catch {
    // below
  }
  // complete() would refuse a result over the limit and leave the job held
  // until its lease ran out and it ran again: the work is done, so the job
  // completes and the result is what gives way, with a line saying so.
  const bytes = text === undefined ? 0 : Buffer.byteLength(text);
  if (text !== undefined && bytes <= RESULT_BYTES) return text;
  state.emit("log", {
    level: "warn",
    message:
      text === undefined
        ? "the handler's return value is not JSON; the job completes without a result"
        : `the handler's return value is ${bytes} bytes of JSON, over the limit of ${RESULT_BYTES}; the job completes without a result (keep bulky data in a table and return its key)`,
    workerId: state.settings.workerId,
    jobId: held.job.id,
    task: held.job.task,
    attempt: held.job.attempt,
  });
  return undefined;
}
