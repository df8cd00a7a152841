// A transactional task's attempt: on one pooled connection
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
// A failure, snooze or park is recorded after the rollback (record-outcome.ts).
import type pg from "pg";
import * as sql from "../sql/index.ts";
import { parkJob } from "./children.ts";
import { asError } from "./events.ts";
import { isReleased, type HeldJob } from "./held-jobs.ts";
import { makeContext } from "./job-context.ts";
import { asLost } from "./lost.ts";
import { failJob, handlerOver, snoozeJob, storable } from "./record-outcome.ts";
import type { NormalizedTask } from "./task-config.ts";
import { timeLimit } from "./time-limit.ts";
import { durationOf, jobEvent, type WorkerState } from "./worker-state.ts";

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

export async function runTransactional(state: WorkerState, held: HeldJob, task: NormalizedTask): Promise<void> {
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
