// Batched completion of plain tasks: one complete_many for every job that
// finished while the previous call was in flight. When the worker is idle the
// first job is flushed at once, so batching never adds latency; under load
// batches grow by themselves. A second call goes out beside the first once
// SECOND_CALL_AT jobs wait behind it (the completion is then what the worker
// waits on), on another connection. complete_many skips attempts that lost their
// lease; those jobs get job:lease-lost (or job:cancelled) instead of job:success.
// While the worker runs, a batch with a job of a concurrency key is completed
// with complete_and_take_next: a key the batch frees hands its next job to
// this worker in the same statement (claimed there, one write instead of an
// admission and a claim), when this worker's next claim would have taken it
// first; those jobs go to the worker as if claimed. A batch without one
// frees no key, so it goes to complete_many, which costs less per call
// (bench/FINDINGS.md, "Where a batched job's backend time goes").
import { LeaseLostError } from "../errors.ts";
import * as sql from "../sql/index.ts";
import type { ClaimedJob, TakeNextOptions } from "../sql/index.ts";
import { leaseLostFields } from "./events.ts";
import type { HeldJob } from "./held-jobs.ts";
import { asLost, attemptLost } from "./lost.ts";
import { jitter, sleep } from "./timers.ts";
import { durationOf, jobEvent, type WorkerState } from "./worker-state.ts";

/** Failed complete_many calls after which a closing worker gives up; the leases then run out and rescue() hands the jobs back. */
const ATTEMPTS_WHEN_CLOSING = 3;

/**
 * Jobs waiting behind a call in flight that start a second call beside it
 * (never more than two). One call at a time keeps batches large, but it runs
 * on one backend, on one core: with concurrency keys every key's next job
 * comes back in the call that completes its predecessor
 * (complete_and_take_next), so the calls' backend is the worker's bottleneck
 * and the keys' throughput was bound to one core (bench/FINDINGS.md,
 * "Concurrency keys: the hand-off"). Two batches never share a job, and each
 * call locks its rows in id order: they do not wait for each other.
 */
const SECOND_CALL_AT = 64;

/** Where the jobs complete_and_take_next hands over go. */
export interface HandOff {
  /** The worker's claim options while it takes jobs; undefined once it stops (plain complete_many then). */
  options(): TakeNextOptions | undefined;
  /** Jobs handed over with a completion, held now: run them as claimed ones (or give them back when stopping). */
  take(jobs: ClaimedJob[]): Promise<void>;
}

/** A job whose completion may free a concurrency key, and so hand over the key's next job. */
const keyed = (held: HeldJob): boolean => held.job.concurrencyKey !== null;

export class Completer {
  private pending: HeldJob[] = [];
  /** Calls in flight (or waiting out an error), 0 to 2; counted synchronously, so the last one never leaves jobs behind. */
  private flushers = 0;
  private readonly flushing = new Set<Promise<void>>();
  private closing = false;
  private readonly closed = new AbortController();

  constructor(
    private readonly state: WorkerState,
    private readonly handOff?: HandOff,
  ) {}

  add(held: HeldJob): void {
    this.pending.push(held);
    if (this.flushers === 0 || (this.flushers === 1 && this.pending.length >= SECOND_CALL_AT)) {
      this.flushers++;
      const flusher: Promise<void> = this.flushAll().finally(() => this.flushing.delete(flusher));
      this.flushing.add(flusher);
    }
  }

  /** Flushes what is pending; afterwards, persistent failures are given up on. */
  async drain(): Promise<void> {
    this.closing = true;
    this.closed.abort();
    while (this.flushing.size > 0) await Promise.all([...this.flushing]);
  }

  /** One caller of complete_many (add counted it in flushers); the second leaves once few jobs wait. */
  private async flushAll(): Promise<void> {
    let failures = 0;
    try {
      while (this.pending.length > 0 && (this.flushers === 1 || this.pending.length >= SECOND_CALL_AT)) {
        const batch = this.pending.splice(0, this.state.settings.completionBatch);
        let completed: Set<string>;
        let handed: ClaimedJob[] = [];
        try {
          const options = this.closing || !batch.some(keyed) ? undefined : this.handOff?.options();
          if (options === undefined) {
            completed = new Set(await sql.completeClaimed(this.state.preparedCalls, batch));
          } else {
            const done = await sql.completeAndTakeNext(this.state.preparedCalls, batch, options);
            completed = new Set(done.completed);
            handed = done.handed;
          }
          failures = 0;
        } catch (error) {
          failures++;
          if (this.closing && failures >= ATTEMPTS_WHEN_CLOSING) {
            this.state.report(`complete_many (gave up on ${batch.length} jobs; rescue() hands them back when their leases run out)`, error);
            for (const held of batch) this.state.held.remove(held);
            continue;
          }
          this.state.report(`complete_many (${batch.length} jobs; retrying)`, error);
          this.pending.unshift(...batch);
          await sleep(jitter(this.state.settings.errorBackoffMs), this.closing ? undefined : this.closed.signal);
          continue;
        }
        // Held before the batch leaves: the room the batch frees is theirs.
        if (handed.length > 0) await this.handOff!.take(handed);
        for (const held of batch) {
          if (completed.has(held.job.id)) {
            if (this.state.listening("job:success")) this.state.emit("job:success", { ...jobEvent(this.state, held), durationMs: durationOf(held) });
          } else {
            await this.reportSkipped(held);
          }
          this.state.held.remove(held);
        }
      }
    } finally {
      this.flushers--;
    }
  }
  /**
   * complete_many names only the jobs it completed. For one it skipped, a
   * complete() of the same (job_id, attempt, lease_token) says why: fenced like
   * complete_many, it cannot complete a job that attempt no longer holds, and
   * its IQ410 names the job's state, so a job cancelled while it ran is
   * reported as such (job:cancelled). Lost leases are rare: one call each.
   */
  private async reportSkipped(held: HeldJob): Promise<void> {
    try {
      await sql.complete(this.state.calls, held.job.id, held.job.attempt, held.job.leaseToken, undefined);
      // held after all (cannot happen: the attempt is fenced out for good)
      this.state.emit("job:success", { ...jobEvent(this.state, held), durationMs: durationOf(held) });
    } catch (caught) {
      const error = asLost(caught);
      const why =
        error instanceof LeaseLostError
          ? leaseLostFields(error)
          : { reason: "complete_many skipped it: this attempt no longer holds the job" };
      attemptLost(this.state, held, why);
    }
  }
}
