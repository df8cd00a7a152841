// The claim loop: one claim() round trip fetches as many jobs as there is
// room for (free slots plus the local buffer), so a busy worker claims in
// batches. It claims when woken (NOTIFY, poll, a (re)connect, a timer) or
// when its last claim came back full (more are probably waiting), and only
// when there is room: the buffer never holds more than `prefetch` jobs, so a
// claimed job waits at most one round of running jobs before it starts.
import * as sql from "../sql-api.ts";
import type { ClaimedJob } from "../sql-api.ts";
import { MAX_CLAIM_BATCH } from "./defaults.ts";
import type { Runtime } from "./runtime.ts";
import { jitter, sleep } from "./timers.ts";

export class ClaimLoop {
  private wanted = true;
  private stopped = false;
  private resume: (() => void) | undefined;
  private loop: Promise<void> | undefined;
  private readonly stopping = new AbortController();

  constructor(
    private readonly rt: Runtime,
    /** How many jobs to claim now (0: wait). */
    private readonly room: () => number,
    private readonly claimed: (jobs: ClaimedJob[]) => void,
  ) {}

  start(): void {
    this.loop ??= this.run();
  }

  /** There may be jobs to claim. */
  wake(): void {
    this.wanted = true;
    this.kick();
  }

  /** Room may have changed (a job finished). */
  kick(): void {
    const resume = this.resume;
    this.resume = undefined;
    resume?.();
  }

  /** Stops claiming; a claim in flight still hands its jobs to `claimed`. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.stopping.abort();
    this.kick();
    await this.loop;
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      const room = Math.min(this.room(), MAX_CLAIM_BATCH);
      if (!this.wanted || room <= 0) {
        await new Promise<void>((resolve) => (this.resume = resolve));
        continue;
      }
      this.wanted = false;
      let jobs: ClaimedJob[];
      try {
        jobs = await sql.claim(this.rt.pool, {
          workerId: this.rt.settings.workerId,
          queues: this.rt.settings.queues,
          batchSize: room,
          lease: this.rt.settings.lease.interval,
        });
      } catch (error) {
        this.rt.report("claim", error);
        this.wanted = true;
        await sleep(jitter(this.rt.settings.errorBackoffMs), this.stopping.signal);
        continue;
      }
      if (jobs.length === room) this.wanted = true; // a full batch: more are probably waiting
      if (jobs.length > 0) this.claimed(jobs);
    }
  }
}
