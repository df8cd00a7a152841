// The metrics' public surface (re-exported by src/index.ts). prom-client is
// loaded only when one of these is called.
export { collectDatabaseMetrics, type DatabaseMetricsOptions } from "./database-metrics.ts";
export { METRICS_DEFAULTS } from "./defaults.ts";
export { MetricsUnavailableError, type MetricsRegistry } from "./registry.ts";
export { serveMetrics, type MetricsServer, type ServeMetricsOptions } from "./serve.ts";
export { collectWorkerMetrics, type MetricsHandle, type WorkerMetricsOptions } from "./worker-metrics.ts";
