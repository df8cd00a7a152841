// Batched heartbeats: one heartbeat() call per distinct lease for every job
// this worker holds (buffered ones included, so a job waiting for a slot
// keeps its lease). A job missing from the answer was lost (rescued,
// cancelled, taken by a newer attempt): HeldJobs fences it out (its
// ctx.signal aborts and its result will be discarded; a buffered one is
// dropped at once, and reported once a fenced call said why: lost.ts). A job
// kept whose handler runs in a transaction gets that transaction kept busy
// too (keepTransactionBusy): the server's idle timeout on it is for workers
// whose heartbeats stopped.
import * as sql from "../sql/index.ts";
import type { HeldJob } from "./held-jobs.ts";
import { reportLostInBuffer } from "./lost.ts";
import { keepTransactionBusy } from "./run-transactional.ts";
import { JitteredTimer } from "./timers.ts";
import type { WorkerState } from "./worker-state.ts";

export class Heartbeat {
  private readonly timer: JitteredTimer;

  constructor(private readonly state: WorkerState) {
    // Little jitter: the interval is already a fraction of the lease.
    this.timer = new JitteredTimer(state.settings.heartbeatMs, () => this.beatOnce(), 0.1);
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
    for (const held of this.state.held.all()) {
      const lease = held.task?.lease?.interval ?? this.state.settings.lease.interval;
      const group = byLease.get(lease);
      if (group === undefined) byLease.set(lease, [held]);
      else group.push(held);
    }
    let lost = 0;
    const lostInBuffer: Promise<void>[] = [];
    for (const [lease, jobs] of byLease) {
      let kept: Set<string>;
      try {
        kept = new Set(
          await sql.heartbeat(
            this.state.preparedCalls,
            jobs.map((h) => ({ jobId: h.job.id, attempt: h.job.attempt, leaseToken: h.job.leaseToken })),
            { lease },
          ),
        );
      } catch (error) {
        this.state.report(`heartbeat of ${jobs.length} jobs`, error);
        continue;
      }
      for (const held of jobs) {
        if (kept.has(held.job.id)) {
          keepTransactionBusy(held);
          continue;
        }
        const lostIn = this.state.held.fenceOut(held);
        if (lostIn === undefined) continue;
        lost++;
        if (lostIn === "claimed") lostInBuffer.push(reportLostInBuffer(this.state, held));
      }
    }
    await Promise.all(lostInBuffer);
    return lost;
  }
}
