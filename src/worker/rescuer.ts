// Maintenance every worker runs: rescue() on a jittered timer, and
// prune_keys() on a slower one. Both are idempotent in SQL, so there is no
// leader: any number of workers (or pg_cron) may call them.
import * as sql from "../sql-api.ts";
import type { Runtime } from "./runtime.ts";
import { JitteredTimer } from "./timers.ts";

export class Rescuer {
  private readonly rescueTimer: JitteredTimer;
  private readonly pruneTimer: JitteredTimer;

  constructor(private readonly rt: Runtime) {
    this.rescueTimer = new JitteredTimer(rt.settings.rescueMs, () => this.runOnce());
    this.pruneTimer = new JitteredTimer(rt.settings.pruneMs, () => this.pruneOnce());
  }

  start(): void {
    // A first rescue soon after start: a worker restarted after a crash
    // finds its own abandoned jobs without waiting a whole interval.
    this.rescueTimer.start(Math.min(this.rt.settings.rescueMs, 1000) * Math.random());
    this.pruneTimer.start();
  }

  async stop(): Promise<void> {
    await Promise.all([this.rescueTimer.stop(), this.pruneTimer.stop()]);
  }

  /** Calls rescue() once; returns how many jobs it changed (0 when the call failed). */
  async runOnce(): Promise<number> {
    try {
      return await sql.rescue(this.rt.pool);
    } catch (error) {
      this.rt.report("rescue", error);
      return 0;
    }
  }

  /** Calls prune_keys() with the configured key retention (left out when unset: the SQL default applies). */
  async pruneOnce(): Promise<number> {
    try {
      return await sql.pruneKeys(this.rt.pool, { olderThan: this.rt.settings.keyRetention });
    } catch (error) {
      this.rt.report("prune_keys", error);
      return 0;
    }
  }
}
