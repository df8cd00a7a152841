// Whether the worker reaches its database, as its own calls find out. The
// first connection failure of an outage is one worker:error and starts the
// outage; the calls that fail after it (a claim loop polling a server that is
// down, a heartbeat, each job's fail()) are counted, not reported — a restart
// would otherwise print a line per try. The first call made after the outage
// began that gets an answer ends it with one worker:reconnected: any idemq
// call (worker-state.ts's timedCalls, a transactional job's guard and
// complete, the wait marker's calls), not only a claim. The claim loop sleeps
// a second after a failed claim and waits for a NOTIFY after an empty one, so
// a worker whose other calls reached the restarted server had counted itself
// down until its next claim, and a second restart within that time was
// folded into the first outage, unreported. Other errors are always reported.
import { isConnectionFailure } from "../errors.ts";

export class Outage {
  /** When the outage's first connection failure was seen (performance.now()); undefined while the database answers. */
  private since: number | undefined;
  private failedCalls = 0;
  /** The outages that ended since the worker started, and their time down: worker_seen() reports them (the dashboard's workers page). */
  private readonly lived = { outages: 0, downMs: 0 };

  constructor(
    private readonly ended: (downMs: number, failedCalls: number) => void,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Whether this failure is worth a worker:error: not a connection failure, or the first of an outage. */
  failed(error: unknown): boolean {
    if (!isConnectionFailure(error)) return true;
    this.failedCalls++;
    if (this.since !== undefined) return false;
    this.since = this.now();
    return true;
  }

  /**
   * A call made at `madeAt` (performance.now()) got its answer: ends the
   * outage, if there is one and the call was made after it began. The answer
   * to an earlier call says nothing of the database now: each connection's
   * answers and failures are read in the order they happen to arrive, so a
   * claim answered just before a shutdown can be read just after the first
   * failure the shutdown caused on another connection.
   */
  reached(madeAt: number): void {
    if (this.since === undefined || madeAt < this.since) return;
    const downMs = Math.round(this.now() - this.since);
    const failedCalls = this.failedCalls;
    this.since = undefined;
    this.failedCalls = 0;
    this.lived.outages++;
    this.lived.downMs += downMs;
    this.ended(downMs, failedCalls);
  }

  /** The outages lived through so far (ended ones: one in progress is counted when it ends). */
  livedThrough(): { outages: number; downMs: number } {
    return { ...this.lived };
  }
}
