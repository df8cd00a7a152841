// Batched heartbeats: one heartbeat() call per distinct lease for every job
// this worker holds (buffered ones included, so a job waiting for a slot
// keeps its lease). A job missing from the answer was lost (rescued,
// cancelled, taken by a newer attempt): its ctx.signal aborts and its result
// will be discarded; a buffered one is dropped at once.
import { LeaseLostError } from "../errors.ts";
import * as sql from "../sql-api.ts";
import { jobEvent, type HeldJob, type Runtime } from "./runtime.ts";
import { JitteredTimer } from "./timers.ts";

export class Heartbeat {
  private readonly timer: JitteredTimer;

  constructor(
    private readonly rt: Runtime,
    /** A buffered job was lost before it started. */
    private readonly droppedFromBuffer: (held: HeldJob) => void,
  ) {
    // Little jitter: the interval is already a fraction of the lease.
    this.timer = new JitteredTimer(rt.settings.heartbeatMs, () => this.beatOnce(), 0.1);
  }

  start(): void {
    this.timer.start();
  }

  stop(): Promise<void> {
    return this.timer.stop();
  }

  /** Extends every held lease once; returns how many jobs were found lost. */
  async beatOnce(): Promise<number> {
    const byLease = new Map<string, HeldJob[]>();
    for (const held of this.rt.held.values()) {
      const lease = held.task?.lease?.interval ?? this.rt.settings.lease.interval;
      const group = byLease.get(lease);
      if (group === undefined) byLease.set(lease, [held]);
      else group.push(held);
    }
    let lost = 0;
    for (const [lease, jobs] of byLease) {
      let kept: Set<string>;
      try {
        kept = new Set(
          await sql.heartbeat(
            this.rt.pool,
            jobs.map((h) => ({ jobId: h.job.id, attempt: h.job.attempt })),
            { lease },
          ),
        );
      } catch (error) {
        this.rt.report(`heartbeat of ${jobs.length} jobs`, error);
        continue;
      }
      for (const held of jobs) {
        // A finishing job may have completed since the snapshot: not a loss.
        if (kept.has(held.job.id) || held.phase === "finishing" || held.leaseLost) continue;
        if (this.rt.held.get(held.job.id) !== held) continue;
        lost++;
        held.leaseLost = true;
        held.controller.abort(
          new LeaseLostError(`lease lost: attempt ${held.job.attempt} no longer holds job ${held.job.id}`),
        );
        if (held.phase === "buffered") {
          this.rt.emit("job:lease-lost", {
            ...jobEvent(this.rt, held),
            durationMs: 0,
            reason: "lost while waiting in the buffer",
          });
          this.droppedFromBuffer(held);
        }
      }
    }
    return lost;
  }
}
