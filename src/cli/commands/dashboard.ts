// idemq dashboard [--port 8080] [--host 127.0.0.1] [--token TOKEN]
//
// Serves the web dashboard (src/dashboard/) until SIGTERM/SIGINT, with the
// database's Prometheus metrics on /metrics when prom-client is installed.
// A bind beyond loopback without a token is refused before anything starts.
import type { Command } from "commander";
import pg from "pg";
import { checkBind, DashboardConfigError, TOKEN_ENV } from "../../dashboard/auth.ts";
import { DASHBOARD_DEFAULTS, startDashboard } from "../../dashboard/server.ts";
import type { MetricsHandle } from "../../metrics/worker-metrics.ts";
import { openDatabase } from "../connect.ts";
import { addDatabaseOption, type DatabaseOption } from "../database.ts";
import { parsePort } from "../metrics.ts";
import { reportError, UsageError } from "../output.ts";

interface Options extends DatabaseOption {
  port: number;
  host: string;
  token?: string;
}

export function registerDashboardCommand(program: Command): void {
  const command = program
    .command("dashboard")
    .description("serve the web dashboard (overview, jobs, schedules, actions, /metrics) until SIGTERM/SIGINT")
    .option("--port <port>", "port to serve on (0: a free one)", parsePort, DASHBOARD_DEFAULTS.port)
    .option("--host <host>", "address to bind (loopback by default; any other address needs --token)", DASHBOARD_DEFAULTS.host)
    .option("--token <token>", `auth token, at least 16 characters (default: $${TOKEN_ENV}); required beyond loopback`)
    .addHelpText(
      "after",
      `
Examples:
  idemq dashboard                                             # http://127.0.0.1:${DASHBOARD_DEFAULTS.port}/
  idemq dashboard --port 9000 --database-url postgres://admin@db/app
  ${TOKEN_ENV}=$(openssl rand -hex 16) idemq dashboard --host 0.0.0.0
                                                              # then open http://HOST:${DASHBOARD_DEFAULTS.port}/?token=TOKEN

The pages read through idemq's SQL API and its jobs table; the actions (retry,
cancel, reschedule, purge) call the SQL functions, which are the installation's admin role's:
connect as an admin role to use them. A token given once as ?token= is kept
in an HttpOnly cookie; scripts send Authorization: Bearer TOKEN.`,
    )
    .action(async (_options: Options, cmd: Command) => {
      try {
        await serve(cmd.optsWithGlobals<Options>());
        process.exit(0);
      } catch (error) {
        reportError(error instanceof DashboardConfigError ? new UsageError(error.message) : error);
        process.exit(process.exitCode ?? 1);
      }
    });
  addDatabaseOption(command);
}

async function serve(options: Options): Promise<void> {
  const token = options.token ?? (process.env[TOKEN_ENV] || undefined);
  // Refused before the database is opened: a misconfigured bind must not start anything.
  checkBind(options.host, token);
  const db = await openDatabase({ databaseUrl: options.databaseUrl, share: true });
  const pool = new pg.Pool({ connectionString: db.url, max: 4, application_name: "idemq dashboard" });
  pool.on("error", () => {}); // an idle connection the server ends; the next page reconnects
  let metrics: MetricsHandle | undefined;
  try {
    metrics = await databaseMetrics(db.url);
    const dashboard = await startDashboard({ pool, port: options.port, host: options.host, token, metrics: metrics?.registry }).catch(
      (error: unknown) => {
        const code = (error as { code?: unknown }).code;
        const where = `${options.host}:${options.port}`;
        throw new Error(code === "EADDRINUSE" ? `--port: ${where} is in use` : `cannot listen on ${where}: ${String((error as Error).message)}`, {
          cause: error,
        });
      },
    );
    process.stdout.write(`idemq: dashboard at ${dashboard.url} (Ctrl-C to stop)\n`);
    if (metrics === undefined) process.stderr.write("idemq: /metrics is off: install prom-client to serve it (npm install prom-client@15)\n");
    await new Promise<void>((resolve) => {
      for (const signal of ["SIGINT", "SIGTERM"] as const) process.once(signal, () => resolve());
    });
    await dashboard.close();
  } finally {
    await metrics?.close();
    await pool.end();
    await db.close();
  }
}

/** The database metrics of `idemq metrics`, or undefined without prom-client (an optional peer). */
async function databaseMetrics(url: string): Promise<MetricsHandle | undefined> {
  const { collectDatabaseMetrics, MetricsUnavailableError } = await import("../../metrics/index.ts");
  try {
    return await collectDatabaseMetrics({ connectionString: url });
  } catch (error) {
    if (error instanceof MetricsUnavailableError) return undefined;
    throw error;
  }
}
