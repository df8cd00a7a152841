// Settings of the metrics module, declared once (docs/worker.md, "Metrics").
import { MAX_CLAIM_BATCH } from "../worker/defaults.ts";

export const METRICS_DEFAULTS = {
  /** The metrics server binds to loopback unless told otherwise: another host must be asked for explicitly. */
  host: "127.0.0.1",
  /** `idemq metrics`'s port when none is given (the port OpenTelemetry's Prometheus exporter uses). */
  port: 9464,
  /** The path the metrics server answers on. */
  path: "/metrics",
  /**
   * The longest a scrape waits for the database (connecting, then stats());
   * then it answers without the database figures and idemq_database_up 0.
   */
  databaseTimeout: "2 seconds",
  /** application_name of the database metrics' own connection. */
  applicationName: "idemq-metrics",
  /** Handler durations, in seconds: from 5 ms to 10 minutes. */
  durationBuckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600],
  /** Jobs per claim, up to the largest batch a worker asks for. */
  claimBatchBuckets: [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, MAX_CLAIM_BATCH],
} as const;
