// The claim loop: one claim() round trip fetches as many jobs as there is
// room for (free slots plus the local buffer), so a busy worker claims in
// batches. It claims when woken (NOTIFY, poll, a (re)connect, a timer) or
// when its last claim came back full (more are probably waiting), and only
// when there is room: the buffer never holds more than its prefetch window
// (held-jobs.ts, prefetch-window.ts), so a claimed job waits at most one round
// of running jobs before it starts. Every claim's outcome, empty ones too,
// goes to `claimed` with the size asked: the window learns from it.
//
// In listen mode enqueues NOTIFY only while a worker waits
// (idemq.wait_for_jobs): a claim that comes back short makes this worker wait,
// and it claims once more when the database confirms (that claim sees every
// job that skipped its NOTIFY); a claim that comes back full ends the waiting,
// as a backlog needs no wake-ups. In poll mode there is no marker: each claim
// only sets the next poll (wake-ups/wake-ups.ts).
import * as sql from "../sql/index.ts";
import type { ClaimedJob, TakeNextOptions } from "../sql/index.ts";
import { MAX_CLAIM_BATCH } from "./defaults.ts";
import { jitter, sleep } from "./timers.ts";
import type { WaitMarker } from "./wake-ups/wait-marker.ts";
import type { WakeUps } from "./wake-ups/wake-ups.ts";
import type { WorkerState } from "./worker-state.ts";

/** First delay before asking wait_for_jobs again after it returned false; doubles up to WAIT_RETRY_MAX_MS. */
const WAIT_RETRY_MS = 5;
/**
 * The longest delay between two wait_for_jobs calls while they return false
 * (or the poll interval when shorter). A false may mean a key held by another
 * session, and while that holder has it enqueues notify; once it lets go they
 * may not, until a call here returns true. A call a second is cheap.
 */
const WAIT_RETRY_MAX_MS = 1000;

/**
 * What this worker takes: its id, queues, lease and the tasks it has (only
 * jobs it can run: a job of a task it lacks waits for a worker that has it).
 * The claim loop's claims and the Completer's hand-offs (complete_and_take_next) both use it.
 */
export function claimTarget(state: WorkerState): TakeNextOptions {
  return {
    workerId: state.settings.workerId,
    queues: state.settings.queues,
    lease: state.settings.lease.interval,
    tasks: [...state.tasks.keys()],
  };
}

export class ClaimLoop {
  private wanted = true;
  private stopped = false;
  private resume: (() => void) | undefined;
  private loop: Promise<void> | undefined;
  private readonly stopping = new AbortController();
  private waitRetryMs = WAIT_RETRY_MS;
  private readonly target: TakeNextOptions;
  private waitRetry: NodeJS.Timeout | undefined;

  constructor(
    private readonly state: WorkerState,
    /** How many jobs to claim now (0: wait). */
    private readonly room: () => number,
    private readonly claimed: (jobs: ClaimedJob[], asked: number) => void,
    /** The worker's wake-ups, as chosen at start (listen mode can turn out to be behind a transaction pooler). */
    private readonly wakeUps: () => WakeUps,
  ) {
    this.target = claimTarget(state);
  }

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
    clearTimeout(this.waitRetry);
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
        jobs = await sql.claim(this.state.preparedCalls, { ...this.target, batchSize: room });
      } catch (error) {
        this.state.report("claim", error);
        this.wanted = true;
        await sleep(jitter(this.state.settings.errorBackoffMs), this.stopping.signal);
        continue;
      }
      this.claimed(jobs, room);
      this.state.emit("worker:claimed", { workerId: this.state.settings.workerId, jobs: jobs.length, asked: room });
      const wakeUps = this.wakeUps();
      wakeUps.claimed(jobs.length);
      const marker = wakeUps.marker;
      if (jobs.length === room) {
        this.wanted = true; // a full batch: more are probably waiting
        if (marker?.waiting) await this.stopWaiting(marker);
      } else if (marker !== undefined && !marker.waiting) {
        await this.startWaiting(marker);
      }
    }
  }

  private async startWaiting(marker: WaitMarker): Promise<void> {
    let ready: boolean;
    try {
      ready = await marker.wait();
    } catch (error) {
      // Without the marker enqueues may not notify this worker: try again
      // (as after false, 5 ms doubling to a second); the fallback poll finds
      // the jobs meanwhile.
      this.state.report("wait_for_jobs", error);
      ready = false;
    }
    if (ready) {
      this.waitRetryMs = WAIT_RETRY_MS;
      this.wanted = true; // sees what was enqueued without a NOTIFY before the marker
      return;
    }
    // False: an enqueue that skipped its NOTIFY is still open, or a key was
    // held by another session (an enqueue deciding, or any role at all:
    // advisory locks have no privileges). A key someone else holds makes
    // enqueues notify, so a hostile holder delays only the confirmation.
    if (this.stopped) return;
    clearTimeout(this.waitRetry);
    this.waitRetry = setTimeout(() => this.wake(), this.waitRetryMs);
    this.waitRetryMs = Math.min(this.waitRetryMs * 2, this.state.settings.pollMs, WAIT_RETRY_MAX_MS);
  }

  private async stopWaiting(marker: WaitMarker): Promise<void> {
    try {
      await marker.stopWaiting();
    } catch (error) {
      this.state.report("stop_waiting", error);
    }
  }
}
