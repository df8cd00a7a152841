// What every background maintenance service of the worker is: a runOnce()
// that tests (and users) may call directly, plus a thin jittered timer that
// only calls it. The SQL it calls is idempotent, so there is no leader: any
// number of workers (or pg_cron) may run the same service.
import type { Queryable } from "../../sql/index.ts";
import { timedCalls, type WorkerState } from "../worker-state.ts";
import { JitteredTimer } from "../timers.ts";

export abstract class MaintenanceService {
  private readonly timer: JitteredTimer;
  /** The pool, each call bounded by the call timeout or the interval, whichever is longer (a big prune may take a while). */
  protected readonly calls: Queryable;

  constructor(
    protected readonly state: WorkerState,
    /** Names the call in worker:error. */
    private readonly call: string,
    private readonly intervalMs: number,
    /**
     * The first run comes within a second of start instead of after a whole
     * interval: work left while no worker ran (abandoned leases, due schedule
     * slots) is handled at once.
     */
    private readonly soonAfterStart = false,
  ) {
    this.timer = new JitteredTimer(intervalMs, () => this.runOnce());
    this.calls = timedCalls(state.pool, Math.max(state.settings.callTimeoutMs, intervalMs), (madeAt) => state.reached(madeAt));
  }

  /** Starts the timer; the first run comes after a jittered interval, or soon (soonAfterStart). */
  start(): void {
    this.timer.start(this.soonAfterStart ? Math.min(this.intervalMs, 1000) * Math.random() : undefined);
  }

  /** Stops the timer and waits for a run in progress. */
  stop(): Promise<void> {
    return this.timer.stop();
  }

  /** Runs the SQL call once; returns how many rows it changed (0 when the call failed, reported as worker:error). */
  async runOnce(): Promise<number> {
    try {
      return await this.runSql();
    } catch (error) {
      this.state.report(this.call, error);
      return 0;
    }
  }

  protected abstract runSql(): Promise<number>;
}
