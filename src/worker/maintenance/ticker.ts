// tick() on a jittered timer: every due slot of every schedule gets its job.
// Any number of workers (and pg_cron) may tick: the SQL locks each due
// schedule row with SKIP LOCKED and keys each slot's job, so no leader. The
// first tick comes soon after start: slots that came due while no worker ran
// are handled (by their misfire policy) without waiting a whole interval.
import * as sql from "../../sql/index.ts";
import { MaintenanceService } from "./maintenance.ts";
import type { WorkerState } from "../worker-state.ts";

export class Ticker extends MaintenanceService {
  constructor(state: WorkerState) {
    super(state, "tick", state.settings.tickMs, true);
  }

  protected override runSql(): Promise<number> {
    // Timed like every maintenance call (the pool alone would wait forever).
    return sql.tick(this.calls);
  }
}
