// idemq demo [--json] [--keep] [--database-url URL]
//
// The main job (`npm start`): shows on real jobs and real worker processes
// what idemq is for, then a table of every figure, expected vs observed. It
// is also an end-to-end check: it exits 1 when any figure is off. Runs on the
// embedded PostgreSQL unless a URL is given; either way in a database of its
// own, created for the run and dropped after it (kept with --keep).
import type { Command } from "commander";
import { Progress } from "../../demo/progress.ts";
import type { DemoResult } from "../../demo/run-demo.ts";
import { summaryTable } from "../../demo/summary-table.ts";
import { openDatabase } from "../connect.ts";
import { DEFAULT_DATA_DIR } from "../../embedded/data-dir.ts";
import { addDatabaseOption, type DatabaseOption } from "../database.ts";
import { EXIT, SIGNAL_EXIT } from "../exit-codes.ts";
import { action, addJsonOption, type JsonOption } from "../output.ts";

interface Options extends DatabaseOption, JsonOption {
  keep?: boolean;
}

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;

export function registerDemoCommand(program: Command): void {
  const demo = program
    .command("demo")
    .description("run the demo: real jobs on real worker processes, then a table of expected vs observed figures")
    .option("--keep", "keep the demo's database afterwards (inspect it with `idemq jobs --database-url <url>`)")
    .addHelpText(
      "after",
      `
Examples:
  npm start                          # = idemq demo, on the embedded PostgreSQL in ${DEFAULT_DATA_DIR}
  idemq demo --json | jq .figures    # the results as one JSON object
  idemq demo --database-url postgres://postgres@127.0.0.1:5432/postgres --keep

Each run creates a database of its own (idemq_demo_...) on the server and drops
it at the end. Without a URL the server is the embedded PostgreSQL 18, with its
data in ${DEFAULT_DATA_DIR} under the current directory (IDEMQ_DATA_DIR moves it);
other idemq commands in this directory use it while the demo runs. Progress goes
to stderr. Exit code 0 when every figure is as expected, 1 when one is not (or
the demo could not run).`,
    )
    .action(
      action(async (_options: Options, command: Command) => {
        const options = command.optsWithGlobals<Options>();
        // Imported here, not at the top: every other command (and --help) would load the whole demo.
        const { runDemo } = await import("../../demo/run-demo.ts");
        const progress = new Progress(process.stderr);
        const db = await openDatabase({
          databaseUrl: options.databaseUrl,
          requireSchema: false,
          share: true,
          log: (line) => progress.step(line.replace(/^idemq: /, "")),
        });
        const signals = watchSignals((signal) => progress.step(`${signal}: stopping the workers, dropping the demo database`));
        try {
          const result = await runDemo({
            serverUrl: db.url,
            embedded: db.embedded,
            keep: options.keep ?? false,
            progress,
            report: (lines) => {
              if (!options.json) process.stdout.write(`\n${lines.join("\n")}\n`);
            },
            signal: signals.interrupted,
          });
          print(result, options);
          if (result.database.kept && db.embedded && db.sharedBy === undefined) {
            // The embedded server lives only as long as this process: keep it up for inspection.
            // (On another process's server, the database stays as long as that server does.)
            progress.step(
              `the embedded server stays up until Ctrl-C; in another terminal: idemq jobs --database-url ${result.database.url}`,
            );
            await signals.next();
          }
          process.exitCode = result.ok ? EXIT.OK : EXIT.FAILURE;
        } catch (error) {
          if (signals.caught === undefined) throw error;
          process.exitCode = SIGNAL_EXIT[signals.caught];
        } finally {
          signals.dispose();
          await db.close();
        }
      }),
    );
  addDatabaseOption(demo);
  addJsonOption(demo);
}

type HandledSignal = (typeof SIGNALS)[number];

interface SignalWatch {
  /** Aborted by the first SIGINT, SIGTERM or SIGHUP. */
  interrupted: AbortSignal;
  caught: HandledSignal | undefined;
  /** Resolves at the next signal. */
  next(): Promise<void>;
  dispose(): void;
}

/**
 * The demo's own signal handlers (connect.ts defers to them): the first signal
 * aborts the run, which then stops its workers and drops its database; a
 * second one exits at once.
 */
function watchSignals(onFirst: (signal: HandledSignal) => void): SignalWatch {
  const controller = new AbortController();
  const waiting: Array<() => void> = [];
  const watch: SignalWatch = {
    interrupted: controller.signal,
    caught: undefined,
    next: () => new Promise((resolve) => waiting.push(resolve)),
    dispose: () => {
      for (const signal of SIGNALS) process.off(signal, handler);
    },
  };
  const handler = (signal: HandledSignal): void => {
    if (waiting.length > 0) {
      for (const resolve of waiting.splice(0)) resolve();
      return;
    }
    if (watch.caught !== undefined) process.exit(SIGNAL_EXIT[signal]);
    watch.caught = signal;
    onFirst(signal);
    controller.abort(new Error(`interrupted by ${signal}`));
  };
  for (const signal of SIGNALS) process.on(signal, handler);
  return watch;
}

function print(result: DemoResult, options: Options): void {
  if (options.json) {
    process.stdout.write(`${JSON.stringify(result)}\n`);
    return;
  }
  const color = process.stdout.isTTY === true && process.env.NO_COLOR === undefined;
  const failed = result.figures.filter((f) => !f.ok).length;
  const lines = [
    "",
    "Summary",
    ...summaryTable(result.figures, color),
    "",
    failed === 0
      ? `All ${result.figures.length} figures as expected, in ${result.seconds} s.`
      : `${failed} of ${result.figures.length} figures NOT as expected (took ${result.seconds} s).`,
  ];
  if (result.database.kept) lines.push(`Kept database ${result.database.name}: idemq jobs --database-url ${result.database.url}`);
  process.stdout.write(`${lines.join("\n")}\n`);
}
