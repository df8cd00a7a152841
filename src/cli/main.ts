// The idemq CLI. Each command lives in src/cli/commands/<name>.ts and exports a
// register function that adds it to the program.
import { realpathSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Command, CommanderError } from "commander";
import { registerDashboardCommand } from "./commands/dashboard.ts";
import { registerDemoCommand } from "./commands/demo.ts";
import { registerDevCommand } from "./commands/dev.ts";
import { registerDoctorCommand } from "./commands/doctor.ts";
import { registerEnqueueCommand } from "./commands/enqueue.ts";
import { registerJobsCommands } from "./commands/jobs.ts";
import { registerLimitCommands } from "./commands/limit.ts";
import { registerMetricsCommand } from "./commands/metrics.ts";
import { registerMigrateCommands } from "./commands/migrate.ts";
import { registerPruneKeysCommand } from "./commands/prune-keys.ts";
import { registerPurgeCommand } from "./commands/purge.ts";
import { registerRescueCommand } from "./commands/rescue.ts";
import { registerRolesCommands } from "./commands/roles.ts";
import { registerSchedulesCommands } from "./commands/schedules.ts";
import { registerStatsCommand } from "./commands/stats.ts";
import { registerWorkerCommand } from "./commands/worker.ts";
import { ENVIRONMENT_HELP, EXIT, EXIT_CODES_HELP } from "./exit-codes.ts";
import { oneLineCommanderErrors } from "./output.ts";

/** The whole command tree (tests walk it: every command, its options and help). */
export function buildProgram(): Command {
  const program = new Command("idemq")
    .description("PostgreSQL-native background-job queue")
    // An option after a subcommand belongs to that subcommand.
    .enablePositionalOptions()
    .showSuggestionAfterError()
    .exitOverride();
  registerMigrateCommands(program);
  registerDevCommand(program);
  registerWorkerCommand(program);
  registerEnqueueCommand(program);
  registerJobsCommands(program);
  registerSchedulesCommands(program);
  registerLimitCommands(program);
  registerStatsCommand(program);
  registerMetricsCommand(program);
  registerDashboardCommand(program);
  registerRescueCommand(program);
  registerPurgeCommand(program);
  registerPruneKeysCommand(program);
  registerRolesCommands(program);
  registerDoctorCommand(program);
  registerDemoCommand(program);
  program.addHelpText("after", `\n${ENVIRONMENT_HELP}\n\n${EXIT_CODES_HELP}\n\nEvery command has --help with examples.\n`);
  oneLineCommanderErrors(program);
  return program;
}

/** Runs the CLI and returns the exit code (the process exits when its work is done). */
export async function main(argv: readonly string[] = process.argv): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync([...argv]);
  } catch (error) {
    if (error instanceof CommanderError) {
      // Commander has already printed its message; help and --version are not errors.
      return error.exitCode === 0 ? 0 : EXIT.USAGE;
    }
    throw error;
  }
  return typeof process.exitCode === "number" ? process.exitCode : 0;
}

function isEntryPoint(): boolean {
  const entry = process.argv[1];
  if (entry === undefined) return false;
  try {
    return realpathSync(entry) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (isEntryPoint()) process.exitCode = await main();
