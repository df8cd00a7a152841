// The flow-control gauges of collectDatabaseMetrics (docs/worker.md,
// "Metrics"): per queue or task with a limit or a pause (idemq.limits(), read
// in the same scrape as stats()), labelled scope ("queue" or "task") and name.
// A scope without a concurrency (or rate) limit has no running/concurrency
// (started/rate) series; a database without limits() (before 0.2.0) has none.
import type { LimitRow } from "../sql/index.ts";

type Labels = Record<"scope" | "name", string>;
type GaugeDefinition = readonly [name: string, help: string, value: (row: LimitRow) => number | null];

export const FLOW_GAUGES: readonly GaugeDefinition[] = [
  ["idemq_paused", "1 while the queue or task is paused (pause(): claims hand out none of its jobs), 0 once resumed", (r) => (r.paused ? 1 : 0)],
  ["idemq_limit_concurrency", "The concurrency limit of the queue or task: at most this many of its jobs processing at once", (r) => r.concurrency],
  ["idemq_limit_running", "Slots of the concurrency limit held now (jobs processing under it); equal to idemq_limit_concurrency: saturated", (r) => r.running],
  ["idemq_limit_rate", "The rate limit of the queue or task: at most this many starts per its period", (r) => r.rate],
  ["idemq_limit_started", "Starts within the rate limit's last period (of idemq_limit_rate)", (r) => r.started],
];

/** Each flow gauge's series from limits()' rows. */
export function fillFlowGauge(value: GaugeDefinition[2], rows: readonly LimitRow[] | undefined, set: (labels: Labels, value: number) => void): void {
  for (const row of rows ?? []) {
    const v = value(row);
    if (v === null) continue;
    set(row.queue !== null ? { scope: "queue", name: row.queue } : { scope: "task", name: row.task ?? "" }, v);
  }
}
