// apply_retention() on a jittered timer: finished jobs past their retention
// (the state's default, or an override of their queue or task) are deleted,
// in short batches. A run calls again while a batch comes back full, until a
// short batch or its time budget, so a backlog (a first start on a full
// table) is worked off over a few runs without one long transaction. Any
// number of workers may run it: the SQL locks with SKIP LOCKED. Then
// roll_up(), the dashboard's history (sql/functions/reads/roll_up.sql).
import * as sql from "../../sql/index.ts";
import { MaintenanceService } from "./maintenance.ts";
import type { WorkerState } from "../worker-state.ts";

export class Retainer extends MaintenanceService {
  private stopping = false;

  constructor(state: WorkerState) {
    super(state, "apply_retention", state.settings.retentionMs);
  }

  override stop(): Promise<void> {
    this.stopping = true;
    return super.stop();
  }

  protected override async runSql(): Promise<number> {
    const { retentionBatchSize: batchSize, retentionTickBudgetMs: budgetMs } = this.state.settings;
    const started = performance.now();
    let deleted = 0;
    for (;;) {
      const n = await sql.applyRetention(this.calls, { batchSize });
      deleted += n;
      if (n < batchSize || this.stopping || performance.now() - started >= budgetMs) break;
    }
    // The dashboard's history on the same timer: roll_up() itself does one
    // roll-up a minute whichever worker calls, and its failure is its own.
    try {
      await sql.rollUp(this.calls);
    } catch (error) {
      this.state.report("roll_up", error);
    }
    return deleted;
  }
}
