// rescue() on a jittered timer: jobs whose lease ran out (their worker died
// or stalled) go back to enqueued, or fail on their last attempt. The first
// rescue comes soon after start: a worker restarted after a crash finds its
// own abandoned jobs without waiting a whole interval.
import * as sql from "../../sql/index.ts";
import { MaintenanceService } from "./maintenance.ts";
import type { WorkerState } from "../worker-state.ts";

export class Rescuer extends MaintenanceService {
  constructor(state: WorkerState) {
    super(state, "rescue", state.settings.rescueMs, true);
  }

  protected override runSql(): Promise<number> {
    return sql.rescue(this.calls);
  }
}
