// tick() on a jittered timer: every due slot of every schedule gets its job.
// Any number of workers (and pg_cron) may tick: the SQL locks each due
// schedule row with SKIP LOCKED and keys each slot's job, so no leader.
import * as sql from "../sql-api.ts";
import { MaintenanceService } from "./maintenance.ts";
import type { WorkerState } from "./worker-state.ts";

export class Ticker extends MaintenanceService {
  constructor(state: WorkerState) {
    super(state, "tick", state.settings.tickMs);
  }

  override start(): void {
    // A first tick soon after start: slots that came due while no worker ran
    // are handled (by their misfire policy) without waiting a whole interval.
    super.start(Math.min(this.state.settings.tickMs, 1000) * Math.random());
  }

  protected override runSql(): Promise<number> {
    return sql.tick(this.state.pool);
  }
}
