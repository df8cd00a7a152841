// prune_keys() on a slow jittered timer: idempotency keys of jobs finished
// longer ago than the key retention are released.
import * as sql from "../../sql/index.ts";
import { MaintenanceService } from "./maintenance.ts";
import type { WorkerState } from "../worker-state.ts";

export class KeyPruner extends MaintenanceService {
  constructor(state: WorkerState) {
    super(state, "prune_keys", state.settings.pruneMs);
  }

  /** With the configured key retention, left out when unset so the SQL default applies. */
  protected override runSql(): Promise<number> {
    return sql.pruneKeys(this.calls, { olderThan: this.state.settings.keyRetention });
  }
}
