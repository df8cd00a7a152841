// idemq metrics [--port 9464] [--host 127.0.0.1]
//
// Serves the database's metrics (stats(), read at each scrape) on /metrics
// without running a worker, until SIGTERM/SIGINT: one exporter for a queue
// whose workers do not serve metrics themselves.
import type { Command } from "commander";
import { METRICS_DEFAULTS } from "../../metrics/defaults.ts";
import { openDatabase } from "../connect.ts";
import { addDatabaseOption, type DatabaseOption } from "../database.ts";
import { parsePort, requirePromClient, serveCliMetrics } from "../metrics.ts";
import { reportError } from "../output.ts";

interface Options extends DatabaseOption {
  port: number;
  host?: string;
}

export function registerMetricsCommand(program: Command): void {
  const command = program
    .command("metrics")
    .description("serve the database's Prometheus metrics on /metrics (no worker), until SIGTERM/SIGINT")
    .option("--port <port>", "port to serve on (0: a free one)", parsePort, METRICS_DEFAULTS.port)
    .option("--host <host>", `address to bind (default ${METRICS_DEFAULTS.host}: loopback only; another address must be given explicitly)`)
    .addHelpText(
      "after",
      `
Examples:
  idemq metrics --database-url postgres://admin@db:5432/app     # http://127.0.0.1:${METRICS_DEFAULTS.port}/metrics
  idemq metrics --port 9500 --host 0.0.0.0                      # reachable from other hosts: say so explicitly

The figures come from idemq.stats() at each scrape (jobs by queue, task and
state, the oldest runnable age, expired leases, duplicates and rejections per
task), so the role needs EXECUTE on it (the installation's admin role). A scrape the database
does not answer within ${METRICS_DEFAULTS.databaseTimeout} still answers, with idemq_database_up 0.
A worker serves these and its own with: idemq worker --metrics-port PORT.`,
    )
    .action(async (_options: Options, cmd: Command) => {
      try {
        await serve(cmd.optsWithGlobals<Options>());
        process.exit(0);
      } catch (error) {
        reportError(error);
        process.exit(process.exitCode ?? 1);
      }
    });
  addDatabaseOption(command);
}

async function serve(options: Options): Promise<void> {
  await requirePromClient();
  const db = await openDatabase({ databaseUrl: options.databaseUrl, share: true });
  try {
    const metrics = await serveCliMetrics(
      db.url,
      { metricsPort: options.port, ...(options.host === undefined ? {} : { metricsHost: options.host }) },
      "--port",
    );
    process.stderr.write(`idemq: metrics at ${metrics.url} (Ctrl-C to stop)\n`);
    await new Promise<void>((resolve) => {
      for (const signal of ["SIGINT", "SIGTERM"] as const) process.once(signal, () => resolve());
    });
    await metrics.close();
  } finally {
    await db.close();
  }
}
