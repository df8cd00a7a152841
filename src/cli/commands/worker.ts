// idemq worker --tasks ./tasks.js [--queues a,b] [--concurrency N] [--log-format json|pretty]
//              [--wake-up listen|poll] [--listen-url URL] [--metrics-port P [--metrics-host H]]
//
// Loads a module exporting `tasks` (and optionally `schedules`, upserted at
// start, and `workerOptions`), runs a worker until SIGTERM/SIGINT (a second
// signal exits at once), and prints its events: JSON lines, or a readable log. A TypeScript module loads through tsx
// (src/cli/typescript-loader.ts), registered only for such a module.
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { type Command, InvalidArgumentError, Option } from "commander";
import type { Worker } from "../../worker/create-worker.ts";
import { WAKE_UP_MODES, type WakeUpMode } from "../../worker/defaults.ts";
import { JOB_END_EVENTS, type WorkerEvents } from "../../worker/events.ts";
import { normalizeTasks, WorkerConfigError } from "../../worker/task-config.ts";
import type { ModuleWorkerOptions, Tasks } from "../../worker/types.ts";
import { type OpenDatabase, openDatabase, waitForServer } from "../connect.ts";
import { DEFAULT_DATA_DIR, displayPath } from "../../embedded/data-dir.ts";
import { prepareToImport } from "../typescript-loader.ts";
import { addDatabaseOption, type DatabaseOption } from "../database.ts";
import { errorLine, reportError, UsageError } from "../output.ts";
import { parseDuration } from "../parse.ts";
import { toMilliseconds } from "../../duration.ts";
import { isConnectionFailure } from "../../errors.ts";
import { printable, printableLines } from "../terminal-text.ts";
import { addMetricsOptions, metricsHostWithoutPort, requirePromClient, type MetricsOptions, serveCliMetrics, type ServedMetrics } from "../metrics.ts";

type LogFormat = "json" | "pretty";

interface Options extends DatabaseOption, MetricsOptions {
  tasks: string;
  queues?: string[];
  concurrency?: number;
  logFormat?: LogFormat;
  waitForDatabase?: number;
  wakeUp?: WakeUpMode;
  listenUrl?: string;
}

export function registerWorkerCommand(program: Command): void {
  const worker = program
    .command("worker")
    .description("run jobs with the tasks a module exports, until SIGTERM/SIGINT")
    .requiredOption(
      "--tasks <module>",
      "module that exports `tasks`, and optionally `schedules` and `workerOptions` (JavaScript; TypeScript through your project's tsx)",
    )
    .option("--queues <names>", "comma-separated queues to work (default: all)", parseQueues)
    .option("--concurrency <n>", "jobs running at once (default 10)", parseConcurrency)
    .addOption(
      new Option("--log-format <format>", "events as JSON lines or a readable log (default: pretty on a terminal, else json)").choices([
        "json",
        "pretty",
      ]),
    )
    .addOption(
      new Option(
        "--wake-up <mode>",
        "how the worker learns of new jobs: listen (LISTEN/NOTIFY, on connections that keep their session) or poll (no session state: behind a transaction-pooling PgBouncer) (default: listen)",
      ).choices(WAKE_UP_MODES),
    )
    .option(
      "--listen-url <url>",
      "listen mode: LISTEN and the wait marker on this connection (e.g. the server itself), claims and jobs through --database-url (e.g. PgBouncer)",
    )
    .option(
      "--wait-for-database <duration>",
      "with --database-url: how long to wait for a server that is down or starting (default: until it answers; 0 fails at once)",
      parseWaitForDatabase,
    )
    .addHelpText(
      "after",
      `
Examples:
  idemq worker --tasks ./tasks.js --database-url postgres://app@db:5432/app --wait-for-database 2m
  idemq worker --tasks ./tasks.js --metrics-port 9464    # Prometheus: curl http://127.0.0.1:9464/metrics

Once started, the worker rides through its database restarting: it reports
worker:error, keeps its process, and resumes when the server answers.

Behind a transaction-pooling PgBouncer, LISTEN cannot work: use --wake-up poll
(claims on a poll, 50 ms after activity up to pollInterval, 2 s, when idle), or
--listen-url postgres://...@db:5432/app to LISTEN on a direct connection while
claims go through the pooler. A listen-mode worker that finds itself behind
such a pooler says so in one line and polls.

Without --database-url or DATABASE_URL the worker runs the embedded PostgreSQL 18
with its data in ${DEFAULT_DATA_DIR} under the current directory (IDEMQ_DATA_DIR moves
it), and prints its URL (stderr; in JSON, field databaseUrl of worker:started).
While it runs, other idemq commands in this directory use that server.`,
    )
    .action(async (_options: Options, command: Command) => {
      // Exits explicitly: a tasks module may hold handles (pools, sockets) that would keep the process alive.
      try {
        await runWorker(command.optsWithGlobals<Options>());
        process.exit(0);
      } catch (error) {
        reportError(error);
        process.exit(process.exitCode ?? 1);
      }
    });
  addMetricsOptions(worker, "the worker's and the database's metrics");
  addDatabaseOption(worker);
}

async function runWorker(options: Options): Promise<void> {
  if (options.listenUrl !== undefined && options.wakeUp === "poll") {
    throw new UsageError("--listen-url is for --wake-up listen: a worker in poll mode holds no LISTEN connection");
  }
  if (metricsHostWithoutPort(options)) throw new UsageError("--metrics-host needs --metrics-port: give the port to serve the metrics on");
  if (options.metricsPort !== undefined) await requirePromClient();
  const { tasks, workerOptions } = await loadTasksModule(options.tasks);
  const format: LogFormat = options.logFormat ?? (process.stdout.isTTY ? "pretty" : "json");
  // No URL: the embedded PostgreSQL (data-dir.ts), started and migrated here,
  // shared with other commands meanwhile, stopped after the worker has drained.
  const db = await openDatabase({
    databaseUrl: options.databaseUrl,
    json: format === "json",
    share: true,
    waitForServerMs: options.waitForDatabase ?? Number.POSITIVE_INFINITY,
  });
  let metrics: ServedMetrics | undefined;
  try {
    const startedFields = db.embedded ? announceEmbedded(db, format) : {};
    if (options.metricsPort !== undefined) {
      metrics = await serveCliMetrics(db.url, { ...options, metricsPort: options.metricsPort });
      if (format === "json") startedFields.metricsUrl = metrics.url;
      else process.stderr.write(`idemq: metrics at ${metrics.url}\n`);
    }
    await runWorkerOn(db.url, tasks, workerOptions, options, format, startedFields, metrics);
  } finally {
    await metrics?.close();
    await db.close();
  }
}

async function runWorkerOn(
  connectionString: string,
  tasks: Tasks,
  workerOptions: ModuleWorkerOptions,
  options: Options,
  format: LogFormat,
  startedFields: Record<string, unknown>,
  metrics: ServedMetrics | undefined,
): Promise<void> {
  const waitMs = options.waitForDatabase ?? Number.POSITIVE_INFINITY;
  for (;;) {
    const worker = await newWorker(connectionString, tasks, workerOptions, options);
    printEvents(worker, format, startedFields);
    await metrics?.addWorker(worker);
    const backstop = ignoreOrphanedConnectionErrors(worker);
    try {
      try {
        await worker.start();
      } catch (error) {
        // The server went away between the wait for it and the start (a
        // restart, a failover): wait again, then start a new worker.
        if (!isConnectionFailure(error) || waitMs <= 0) throw error;
        process.stderr.write(`idemq: the database went away while the worker started: ${errorLine(error)}\n`);
        await waitForServer(connectionString, { waitForServerMs: waitMs });
        continue;
      }
      await worker.wait();
      return;
    } finally {
      process.removeListener("uncaughtException", backstop);
    }
  }
}

async function newWorker(
  connectionString: string,
  tasks: Tasks,
  workerOptions: ModuleWorkerOptions,
  options: Options,
): Promise<Worker> {
  // Imported here, not at the top: every other command (and --help) would load the worker and pg-listen.
  const { createWorker } = await import("../../worker/create-worker.ts");
  try {
    return createWorker({
      ...workerOptions,
      tasks,
      connectionString,
      ...(options.queues === undefined ? {} : { queues: options.queues }),
      ...(options.concurrency === undefined ? {} : { concurrency: options.concurrency }),
      ...(options.wakeUp === undefined ? {} : { wakeUp: options.wakeUp }),
      ...(options.listenUrl === undefined ? {} : { listenConnectionString: options.listenUrl }),
      handleSignals: true,
    });
  } catch (error) {
    if (error instanceof WorkerConfigError) throw new UsageError(`${options.tasks}: ${error.message}`);
    throw error;
  }
}

/**
 * A backstop: a connection failure emitted by a pg client that has no 'error'
 * listener must not end a worker process, whose connections all recover on
 * their own. Every client idemq creates has one (the case seen in CI during a
 * server stop was a transactional job's new connection, fixed in run-transactional.ts:
 * checkOutListening); this covers clients idemq does not own, such as a pool a
 * handler made. It becomes a warning (the restart tests assert it never
 * fires); any other uncaught exception still ends the process.
 */
function ignoreOrphanedConnectionErrors(worker: Worker): (error: Error) => void {
  const backstop = (error: Error): void => {
    if (!isConnectionFailure(error)) {
      process.stderr.write(`${printableLines(error.stack ?? String(error))}\n`);
      process.exit(1);
    }
    worker.emit("log", {
      level: "warn",
      message: `ignored a connection error that no listener handled: ${error.message}`,
      workerId: worker.workerId,
    });
  };
  process.on("uncaughtException", backstop);
  return backstop;
}

/** Imports the module and checks its tasks; a mistake is one UsageError line. */
async function loadTasksModule(path: string): Promise<{ tasks: Tasks; workerOptions: ModuleWorkerOptions }> {
  const file = resolve(path);
  if (!existsSync(file)) throw new UsageError(`--tasks ${path}: no such file`);
  let mod: Record<string, unknown>;
  try {
    await prepareToImport(file);
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (error) {
    const why = `cannot load ${path}: ${errorLine(error)}`;
    // A UsageError (no tsx for a TypeScript module) keeps its exit code 2; a module that throws is a failure (1).
    throw error instanceof UsageError ? new UsageError(why, { cause: error }) : new Error(why, { cause: error });
  }
  const fromDefault = (name: string): unknown =>
    mod.default !== null && typeof mod.default === "object" ? (mod.default as Record<string, unknown>)[name] : undefined;
  const tasks = mod.tasks ?? fromDefault("tasks");
  if (tasks === undefined) {
    throw new UsageError(
      `${path} exports no tasks: add \`export const tasks = { taskName: async (payload, ctx) => { ... } }\``,
    );
  }
  try {
    normalizeTasks(tasks);
  } catch (error) {
    if (error instanceof WorkerConfigError) throw new UsageError(`${path}: ${error.message}`);
    throw error;
  }
  const workerOptions = mod.workerOptions ?? fromDefault("workerOptions") ?? {};
  if (workerOptions === null || typeof workerOptions !== "object") {
    throw new UsageError(`${path}: workerOptions must be an object of worker settings`);
  }
  // Schedules may be an export of their own, as tasks are (or workerOptions.schedules; not both).
  const schedules = mod.schedules ?? fromDefault("schedules");
  if (schedules !== undefined) {
    if ((workerOptions as ModuleWorkerOptions).schedules !== undefined) {
      throw new UsageError(`${path}: exports schedules and workerOptions.schedules; keep one of them`);
    }
    return { tasks: tasks as Tasks, workerOptions: { ...(workerOptions as ModuleWorkerOptions), schedules: schedules as ModuleWorkerOptions["schedules"] } };
  }
  return { tasks: tasks as Tasks, workerOptions: workerOptions as ModuleWorkerOptions };
}

const EVENTS = [
  "worker:started",
  "worker:stopped",
  "worker:error",
  "worker:reconnected",
  "job:start",
  ...JOB_END_EVENTS,
  "log",
] as const satisfies readonly (keyof WorkerEvents)[];

/**
 * The embedded server's URL, so other tools can use it while the worker runs:
 * a line on stderr in pretty mode; in JSON, fields of the worker:started event
 * (stdout stays JSON lines).
 */
function announceEmbedded(db: OpenDatabase, format: LogFormat): Record<string, unknown> {
  const dataDir = displayPath(db.dataDir ?? "");
  if (format === "json") return { databaseUrl: db.url, dataDir };
  process.stderr.write(
    db.sharedBy === undefined
      ? `idemq: the worker serves the embedded PostgreSQL in ${dataDir} at ${db.url} (other idemq commands here use it)\n`
      : `idemq: the worker uses the embedded PostgreSQL at ${db.url}, which PID ${db.sharedBy.pid} (${db.sharedBy.command}) serves\n`,
  );
  return {};
}

function printEvents(worker: Worker, format: LogFormat, startedFields: Record<string, unknown>): void {
  for (const event of EVENTS) {
    worker.on(event, (eventPayload: object) => {
      const payload = event === "worker:started" ? { ...eventPayload, ...startedFields } : eventPayload;
      // A task name or an error message is anyone's text: escaped in pretty lines, exact in JSON.
      const line = format === "json" ? jsonLine(event, payload) : printable(prettyLine(event, payload as Record<string, unknown>));
      process.stdout.write(`${line}\n`);
    });
  }
}

function jsonLine(event: string, payload: object): string {
  return JSON.stringify({ time: new Date().toISOString(), event, ...payload }, (_key, value: unknown) =>
    value instanceof Error ? { class: value.constructor.name, message: value.message } : value,
  );
}

function prettyLine(event: string, p: Record<string, unknown>): string {
  const time = new Date().toISOString().slice(11, 23);
  const job = p.jobId === undefined ? "" : ` ${String(p.task)}#${String(p.jobId)} attempt ${String(p.attempt)}`;
  const took = typeof p.durationMs === "number" ? ` (${p.durationMs.toFixed(1)} ms)` : "";
  const error = p.error as { class?: string; constructor?: { name: string }; message?: string } | undefined;
  const why =
    error === undefined
      ? ""
      : `: ${error instanceof Error ? error.constructor.name : String(error.class)}: ${String(error.message)}`;
  switch (event) {
    case "log":
      return `${time} ${String(p.level).padEnd(5)}${job} ${String(p.message)}`;
    case "worker:error":
      return `${time} error worker, during ${String(p.during)}${why}`;
    case "worker:reconnected":
      return `${time} ${event} after ${(Number(p.downMs) / 1000).toFixed(1)} s (${String(p.failedCalls)} calls failed meanwhile)`;
    case "job:duplicate":
      return `${time} ${event}${job}${took}: guard key ${String(p.guardKey)} already done`;
    case "job:cancelled":
    case "job:lease-lost":
      return `${time} ${event}${job}${took}: ${String(p.reason)}`;
    case "job:retry":
      return `${time} ${event}${job}${took}${why}${p.retryAt instanceof Date ? `; next at ${p.retryAt.toISOString()}` : ""}`;
    case "job:snoozed":
      return `${time} ${event}${job}${took} for ${String(p.delay)}${heldText(p.held)}`;
    case "job:start":
      return `${time} ${event}${job}${p.reclaimed ? " (reclaimed: the previous attempt lost its lease)" : ""}`;
    default:
      return `${time} ${event}${job || ` ${String(p.workerId)}`}${took}${why}`;
  }
}

/** "; queue emails held until 2026-..." (or "; its key held until ..."): a snooze by RateLimitedError. */
function heldText(held: unknown): string {
  if (held === undefined || held === null) return "";
  const h = held as { scope: string; name: string | null; until: Date };
  const what = h.name === null ? `its ${h.scope}` : `${h.scope} ${h.name}`;
  return `; ${what} held until ${h.until instanceof Date ? h.until.toISOString() : String(h.until)}`;
}

function parseQueues(value: string): string[] {
  const queues = value.split(",").map((q) => q.trim());
  if (queues.some((q) => q === "")) throw new InvalidArgumentError("give queue names separated by commas, e.g. emails,reports");
  return queues;
}

function parseConcurrency(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value.trim()) || !Number.isInteger(n) || n < 1 || n > 1000) {
    throw new InvalidArgumentError("must be an integer from 1 to 1000");
  }
  return n;
}

function parseWaitForDatabase(value: string): number {
  if (value.trim() === "0") return 0; // no unit needed to say "do not wait"
  parseDuration(value); // a malformed duration: the CLI's one line, with examples
  try {
    return toMilliseconds(value);
  } catch (error) {
    throw new InvalidArgumentError(`${errorLine(error)}; give e.g. 30s, 5m or 2h`);
  }
}
