// Timers for background work: every worker runs the same maintenance, so
// intervals are jittered to keep many workers from calling in lockstep.

/** ms scaled by a uniform factor in [1 - spread, 1 + spread]. */
export function jitter(ms: number, spread = 0.25): number {
  return ms * (1 - spread + 2 * spread * Math.random());
}

/** Resolves after ms, or at once when the signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * Runs `tick` every `intervalMs` (jittered), one tick at a time: the next is
 * scheduled when the previous one has finished. Errors are the tick's to handle.
 */
export class JitteredTimer {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = true;

  constructor(
    private readonly intervalMs: number,
    private readonly tick: () => Promise<unknown>,
    private readonly spread = 0.25,
  ) {}

  /** Starts the timer; the first tick comes after `firstDelayMs` (default: a jittered interval). */
  start(firstDelayMs?: number): void {
    if (!this.stopped || this.intervalMs <= 0) return;
    this.stopped = false;
    this.schedule(firstDelayMs ?? jitter(this.intervalMs, this.spread));
  }

  /** Stops the timer and waits for a tick in progress. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.running;
  }

  private schedule(ms: number): void {
    this.timer = setTimeout(() => {
      this.running = (async () => {
        try {
          await this.tick();
        } catch {
          // the tick reports its own errors
        }
      })();
      void this.running.then(() => {
        this.running = undefined;
        if (!this.stopped) this.schedule(jitter(this.intervalMs, this.spread));
      });
    }, ms);
  }
}
