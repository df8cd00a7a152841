// How many claimed jobs may wait in the buffer for a slot: the prefetch
// window. A fixed `prefetch` is a window whose bounds are equal. Left unset,
// the window adapts between concurrency and prefetchMax (defaults.ts):
//
//   grow    a claim came back full (a backlog): it doubles, so on a backlog
//           it reaches the claims of a fixed prefetchMax within a few claims.
//           A first version also required a slot left idle for want of a job;
//           it ran 0.77x of prefetch 490 at concurrency 50 in one bench run
//           (2 rounds), though a probe outside the bench showed the same claim
//           sizes for both rules: not settled, but this rule cannot stay small
//           on a backlog, and claims' commits are what bound the throughput.
//   shrink  a claim came back short (the queue is shallow): it halves, back
//           toward concurrency, so this worker does not hold jobs that
//           another, idle worker could run.
//   cap     the wait of the last buffered job, window / completion rate, is
//           kept within waitBudgetMs (a fraction of the lease, settings.ts):
//           window <= rate x waitBudgetMs. The rate is measured over the
//           latest finished jobs up to now, so it decays while none finish
//           (slow handlers, an idle worker): the window falls with it, never
//           below concurrency.
//
// A pure state machine fed by HeldJobs (claims and finished jobs), which asks
// it for the window each time it sizes a claim.

export interface PrefetchBounds {
  /** The window never goes below this (for a fixed prefetch: its value). */
  readonly min: number;
  /** ... nor above this (for a fixed prefetch: its value). */
  readonly max: number;
  /** The last buffered job's expected wait may be at most this long (Infinity: no cap, a fixed prefetch). */
  readonly waitBudgetMs: number;
}

/** Finished jobs the completion rate is measured over. */
export const RATE_SAMPLES = 64;

export class PrefetchWindow {
  private grown: number;
  /** performance.now() of the latest finished jobs, oldest first (a ring of RATE_SAMPLES). */
  private readonly finishedAt: number[] = [];
  private next = 0;

  constructor(readonly bounds: PrefetchBounds) {
    if (!(bounds.min >= 0 && bounds.max >= bounds.min)) throw new Error(`bad prefetch bounds ${JSON.stringify(bounds)}`);
    this.grown = bounds.min;
  }

  get adaptive(): boolean {
    return this.bounds.max > this.bounds.min;
  }

  /** The window now: what claims grew it to, capped by the wait budget at the current completion rate. */
  size(now: number): number {
    const { min, waitBudgetMs } = this.bounds;
    if (!this.adaptive || waitBudgetMs === Infinity) return this.grown;
    return Math.max(min, Math.min(this.grown, Math.floor(this.ratePerMs(now) * waitBudgetMs)));
  }

  /** Completed jobs per millisecond over the latest RATE_SAMPLES up to `now`; 0 until two are known. */
  ratePerMs(now: number): number {
    const n = this.finishedAt.length;
    if (n < 2) return 0;
    const oldest = n < RATE_SAMPLES ? this.finishedAt[0]! : this.finishedAt[this.next]!;
    const span = now - oldest;
    return span > 0 ? n / span : 0;
  }

  /** A job gave its slot back. */
  finished(now: number): void {
    if (!this.adaptive) return;
    if (this.finishedAt.length < RATE_SAMPLES) this.finishedAt.push(now);
    else this.finishedAt[this.next] = now;
    this.next = (this.next + 1) % RATE_SAMPLES;
  }

  /** A claim asked for `asked` jobs and got `got`. */
  claimed(asked: number, got: number, now: number): void {
    if (!this.adaptive || asked <= 0) return;
    const { min, max } = this.bounds;
    if (got < asked) {
      this.grown = Math.max(min, Math.floor(this.grown / 2));
    } else {
      // Grow from what the cap allows now, so a window capped for long never doubles in one step past it.
      this.grown = Math.min(max, Math.max(1, this.size(now)) * 2);
    }
  }
}
