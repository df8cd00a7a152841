// Whether the worker reaches its database, as its own calls find out. The
// first connection failure of an outage is one worker:error and starts the
// outage; the calls that fail after it (a claim loop polling a server that is
// down, a heartbeat, each job's fail()) are counted, not reported — a restart
// would otherwise print a line per try. The next claim that succeeds ends the
// outage with one worker:reconnected. Other errors are always reported.
import { isConnectionFailure } from "../errors.ts";

export class Outage {
  private since: number | undefined;
  private failedCalls = 0;

  constructor(private readonly ended: (downMs: number, failedCalls: number) => void) {}

  /** Whether this failure is worth a worker:error: not a connection failure, or the first of an outage. */
  failed(error: unknown): boolean {
    if (!isConnectionFailure(error)) return true;
    this.failedCalls++;
    if (this.since !== undefined) return false;
    this.since = performance.now();
    return true;
  }

  /** A call reached the database: ends the outage, if there was one. */
  reached(): void {
    if (this.since === undefined) return;
    const downMs = Math.round(performance.now() - this.since);
    const failedCalls = this.failedCalls;
    this.since = undefined;
    this.failedCalls = 0;
    this.ended(downMs, failedCalls);
  }
}
