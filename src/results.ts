// Client.result: waits for a job's outcome without polling. One LISTEN
// connection per Client (pg-listen: its own connection, outside the pool,
// reconnected after a loss), opened by the first wait and kept until
// close(); each wait marks its job (job_result(..., notify => true)) after
// the LISTEN is in place, so the job's finish NOTIFYs idemq_results with its
// id and no finish between the two is missed. A notification only wakes
// the wait, which reads the outcome again (job_result); so does every
// (re)connect, since NOTIFYs sent while the connection was down are lost.
//
// Behind a transaction pooler (PgBouncer, pool_mode = transaction) LISTEN
// cannot work: give the Client a listenConnectionString to a direct
// connection, or pass `pollInterval` to poll job_result instead.
import type pg from "pg";
import { RESULTS_CHANNEL, type Duration, type JobState } from "./contract.ts";
import { toMilliseconds } from "./duration.ts";
import { JobNotFoundError, JobNotSucceededError, ResultTimeoutError } from "./errors.ts";
import { toJobId, type JobIdInput } from "./encode.ts";
import * as sql from "./sql/index.ts";
import { createSubscriber } from "./worker/wake-ups/listener.ts";

type Subscriber = ReturnType<typeof createSubscriber>;

export interface ResultOptions {
  /** Give up after this long with a ResultTimeoutError (the job goes on); default: wait as long as it takes. */
  timeout?: Duration | undefined;
  /** Poll job_result this often instead of LISTENing (behind a transaction pooler). */
  pollInterval?: Duration | undefined;
}

/** The LISTEN connection's application_name. */
const APPLICATION_NAME = "idemq-results";

export class ResultWaiter {
  private subscriber: Subscriber | undefined;
  private listening: Promise<void> | undefined;
  /** Per job id, the wake-ups of the waits for it. */
  private readonly waits = new Map<string, Set<() => void>>();
  private closed = false;

  constructor(
    private readonly db: sql.Queryable,
    private readonly connection: pg.ClientConfig,
    private readonly onError: (error: Error) => void,
  ) {}

  /** The job's result once it succeeded; rejects with JobNotSucceededError, ResultTimeoutError or JobNotFoundError. */
  async wait(jobId: JobIdInput, opts: ResultOptions = {}): Promise<unknown> {
    const id = toJobId(jobId);
    const timeoutMs = opts.timeout === undefined ? undefined : toMilliseconds(opts.timeout);
    const pollMs = opts.pollInterval === undefined ? undefined : toMilliseconds(opts.pollInterval);
    const deadline = timeoutMs === undefined ? Number.POSITIVE_INFINITY : Date.now() + timeoutMs;
    let wake: (() => void) | undefined;
    let woken = false;
    const waker = (): void => {
      woken = true;
      wake?.();
    };
    if (pollMs === undefined) {
      await this.listen();
      let set = this.waits.get(id);
      if (set === undefined) this.waits.set(id, (set = new Set()));
      set.add(waker);
    }
    try {
      let notify = pollMs === undefined;
      for (;;) {
        woken = false;
        const outcome = await sql.jobResult(this.db, id, notify);
        notify = false;
        if (outcome === undefined) throw new JobNotFoundError(`job ${id} does not exist (never enqueued, or deleted by retention or purge)`, { code: "IQ404" });
        if (outcome.finishedAt !== null) return settle(id, outcome.state, outcome.result, outcome.lastError);
        const left = deadline - Date.now();
        if (left <= 0) throw new ResultTimeoutError(id, timeoutMs!, outcome.state);
        if (woken) continue; // a notification (or a reconnect) came while reading
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, Math.min(left, pollMs ?? left));
          wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wake = undefined;
      }
    } finally {
      const set = this.waits.get(id);
      set?.delete(waker);
      if (set?.size === 0) this.waits.delete(id);
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    const subscriber = this.subscriber;
    this.subscriber = undefined;
    this.listening = undefined;
    for (const set of this.waits.values()) for (const wake of set) wake();
    if (subscriber !== undefined) await subscriber.close().catch((error: unknown) => this.onError(error as Error));
  }

  private listen(): Promise<void> {
    if (this.closed) return Promise.reject(new Error("idemq Client is closed"));
    return (this.listening ??= this.connect().catch((error: unknown) => {
      this.listening = undefined;
      throw error;
    }));
  }

  private async connect(): Promise<void> {
    const subscriber = createSubscriber(
      { fallback_application_name: APPLICATION_NAME, ...this.connection },
      { retryTimeout: 0, parse: (payload: string) => payload },
    );
    subscriber.events.on("notification", ({ channel, payload }) => {
      if (channel !== RESULTS_CHANNEL) return;
      for (const wake of this.waits.get(String(payload)) ?? []) wake();
    });
    // NOTIFYs sent while it was disconnected are lost: every wait reads again.
    subscriber.events.on("connected", () => {
      for (const set of this.waits.values()) for (const wake of set) wake();
    });
    subscriber.events.on("error", (error) => this.onError(error));
    this.subscriber = subscriber;
    try {
      await subscriber.connect();
      await subscriber.listenTo(RESULTS_CHANNEL);
    } catch (error) {
      this.subscriber = undefined;
      await subscriber.close().catch(() => {});
      throw error;
    }
  }
}

function settle(id: string, state: JobState, result: unknown, lastError: Record<string, unknown> | null): unknown {
  if (state === "succeeded") return result;
  throw new JobNotSucceededError(id, state as Exclude<JobState, "succeeded">, lastError);
}
