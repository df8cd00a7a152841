// worker_seen() on a low-rate jittered timer: the worker's row in
// idemq.workers (its queues and task names, last_seen_at) says it is there,
// so `idemq doctor` can tell runnable jobs no live worker claims. Registered
// at start, refreshed here (a few statements a minute, never one per claim),
// marked stopped by worker_stopped() at a clean stop (kept a while for the
// dashboard, pruned by apply_retention()); a crashed worker's row goes
// stale and apply_retention() deletes it later. Each call is one statement
// with no session state (it works through a transaction pooler), and it
// upserts, so the first refresh after a database restart registers the
// worker again. It also says where the worker runs (host, pid), its
// concurrency, how often it refreshes (so workers() can call it late) and the
// database outages it lived through (outage.ts), for the dashboard.
import { hostname } from "node:os";
import * as sql from "../../sql/index.ts";
import { MaintenanceService } from "./maintenance.ts";
import type { WorkerState } from "../worker-state.ts";

export class Presence extends MaintenanceService {
  private readonly taskNames: string[];

  constructor(
    state: WorkerState,
    private readonly outages: () => { outages: number; downMs: number },
  ) {
    super(state, "worker_seen", state.settings.presenceMs);
    // The tasks it claims (../claim-loop.ts passes the same list): a job of another task waits for another worker.
    this.taskNames = [...state.tasks.keys()];
  }

  protected override async runSql(): Promise<number> {
    await sql.workerSeen(this.calls, {
      workerId: this.state.settings.workerId,
      queues: this.state.settings.queues,
      tasks: this.taskNames,
      host: hostname(),
      pid: process.pid,
      concurrency: this.state.settings.concurrency,
      refreshEveryMs: this.state.settings.presenceMs,
      outages: this.outages().outages,
      outageMs: this.outages().downMs,
    });
    return 1;
  }

  /** Removes the worker's row (a clean stop); a failure is a worker:error, and the row goes stale instead. */
  async stopped(): Promise<void> {
    try {
      await sql.workerStopped(this.calls, this.state.settings.workerId);
    } catch (error) {
      this.state.report("worker_stopped", error);
    }
  }
}
