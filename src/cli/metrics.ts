// `--metrics-port` / `--metrics-host` of `idemq worker` (and `idemq metrics`):
// one registry with the database figures, a worker's figures added per
// worker, and the /metrics server. prom-client is imported only here, and
// only when metrics are asked for.
import { InvalidArgumentError, type Command } from "commander";
import { METRICS_DEFAULTS } from "../metrics/defaults.ts";
import type { MetricsHandle } from "../metrics/worker-metrics.ts";
import type { MetricsServer } from "../metrics/serve.ts";
import type { MetricsRegistry } from "../metrics/registry.ts";
import type { Worker } from "../worker/create-worker.ts";

export interface MetricsOptions {
  metricsPort?: number;
  metricsHost?: string;
}

export function addMetricsOptions(command: Command, what: string): Command {
  return command
    .option("--metrics-port <port>", `serve ${what} on http://HOST:PORT${METRICS_DEFAULTS.path} (Prometheus text format; 0: a free port)`, parsePort)
    .option("--metrics-host <host>", `address the metrics server binds to (default ${METRICS_DEFAULTS.host}: loopback only; another address must be given explicitly)`);
}

/** Metrics asked for without prom-client installed: the one line says so before anything starts. */
export async function requirePromClient(): Promise<void> {
  const { loadPromClient } = await import("../metrics/prom-client.ts");
  await loadPromClient();
}

/** --metrics-host alone serves nothing: a mistake to say, not to ignore. */
export function metricsHostWithoutPort(options: MetricsOptions): boolean {
  return options.metricsHost !== undefined && options.metricsPort === undefined;
}

export interface ServedMetrics {
  readonly url: string;
  /** Adds a worker's metrics (replacing a previous worker's). */
  addWorker(worker: Worker): Promise<void>;
  close(): Promise<void>;
}

/** The registry with the database metrics (read from `databaseUrl`) and its server. */
export async function serveCliMetrics(
  databaseUrl: string,
  options: Required<Pick<MetricsOptions, "metricsPort">> & MetricsOptions,
  portOption = "--metrics-port",
): Promise<ServedMetrics> {
  const { collectDatabaseMetrics, collectWorkerMetrics, serveMetrics } = await import("../metrics/index.ts");
  const database = await collectDatabaseMetrics({ connectionString: databaseUrl });
  const registry: MetricsRegistry = database.registry;
  let server: MetricsServer;
  try {
    server = await serveMetrics(registry, {
      port: options.metricsPort,
      ...(options.metricsHost === undefined ? {} : { host: options.metricsHost }),
    });
  } catch (error) {
    await database.close();
    const code = (error as { code?: unknown }).code;
    const where = `${options.metricsHost ?? METRICS_DEFAULTS.host}:${options.metricsPort}`;
    throw new Error(
      code === "EADDRINUSE" ? `${portOption}: ${where} is in use` : `${portOption}: cannot listen on ${where}: ${String((error as Error).message)}`,
      { cause: error },
    );
  }
  let workerMetrics: MetricsHandle | undefined;
  return {
    url: server.url,
    addWorker: async (worker) => {
      await workerMetrics?.close();
      workerMetrics = await collectWorkerMetrics(worker, { registry });
    },
    close: async () => {
      await server.close();
      await workerMetrics?.close();
      await database.close();
    },
  };
}

export function parsePort(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value.trim()) || n > 65535) throw new InvalidArgumentError("must be a port number from 0 to 65535");
  return n;
}
