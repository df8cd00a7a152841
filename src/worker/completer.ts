// Batched completion of plain tasks: one complete_many for every job that
// finished while the previous call was in flight. When the worker is idle the
// first job is flushed at once, so batching never adds latency; under load
// batches grow by themselves. complete_many skips attempts that lost their
// lease; those jobs get job:lease-lost instead of job:success.
import * as sql from "../sql-api.ts";
import { durationOf, jobEvent, type HeldJob, type Runtime } from "./runtime.ts";
import { jitter, sleep } from "./timers.ts";

/** Failed complete_many calls after which a closing worker gives up; the leases then run out and rescue() hands the jobs back. */
const ATTEMPTS_WHEN_CLOSING = 3;

export class Completer {
  private pending: HeldJob[] = [];
  private flushing: Promise<void> | undefined;
  private closing = false;
  private readonly closed = new AbortController();

  constructor(
    private readonly rt: Runtime,
    /** Called once per job when its completion is settled either way. */
    private readonly settled: (held: HeldJob) => void,
  ) {}

  add(held: HeldJob): void {
    this.pending.push(held);
    this.flushing ??= this.flushAll();
  }

  /** Flushes what is pending; afterwards, persistent failures are given up on. */
  async drain(): Promise<void> {
    this.closing = true;
    this.closed.abort();
    while (this.flushing !== undefined) await this.flushing;
  }

  private async flushAll(): Promise<void> {
    let failures = 0;
    try {
      while (this.pending.length > 0) {
        const batch = this.pending.splice(0, this.rt.settings.completionBatch);
        let completed: Set<string>;
        try {
          const ids = await sql.completeMany(
            this.rt.pool,
            batch.map((h) => ({ jobId: h.job.id, attempt: h.job.attempt })),
          );
          completed = new Set(ids);
          failures = 0;
        } catch (error) {
          failures++;
          if (this.closing && failures >= ATTEMPTS_WHEN_CLOSING) {
            this.rt.report(`complete_many (gave up on ${batch.length} jobs; rescue() hands them back when their leases run out)`, error);
            batch.forEach(this.settled);
            continue;
          }
          this.rt.report(`complete_many (${batch.length} jobs; retrying)`, error);
          this.pending.unshift(...batch);
          await sleep(jitter(this.rt.settings.errorBackoffMs), this.closing ? undefined : this.closed.signal);
          continue;
        }
        for (const held of batch) {
          if (completed.has(held.job.id)) {
            this.rt.emit("job:success", { ...jobEvent(this.rt, held), durationMs: durationOf(held) });
          } else {
            this.rt.emit("job:lease-lost", {
              ...jobEvent(this.rt, held),
              durationMs: durationOf(held),
              reason: "complete_many skipped it: this attempt no longer holds the job",
            });
          }
          this.settled(held);
        }
      }
    } finally {
      this.flushing = undefined;
    }
  }
}
