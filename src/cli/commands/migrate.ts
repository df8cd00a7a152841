// idemq migrate            apply pending migrations
// idemq migrate status     list applied and pending migrations
// idemq migrate sql        print the pending migrations as one psql script
import type { Command } from "commander";
import { migrate, migrationStatus, pendingSql } from "../../migrate.ts";
import { addDatabaseOption, type DatabaseOption, resolveDatabaseUrl } from "../database.ts";
import { action, addJsonOption, emit, type JsonOption } from "../output.ts";

type Options = DatabaseOption & JsonOption;

export function registerMigrateCommands(program: Command): void {
  const migrateCommand = program
    .command("migrate")
    .description("apply pending database migrations (schema idemq)")
    .action(
      action(async (_options: Options, command: Command) => {
        const options = command.optsWithGlobals<Options>();
        const applied = await migrate({ connectionString: resolveDatabaseUrl(options) });
        emit(
          options,
          { applied },
          applied.length === 0 ? "No pending migrations." : applied.map((name) => `Applied ${name}`),
        );
      }),
    );
  addDatabaseOption(migrateCommand);
  addJsonOption(migrateCommand);

  const status = migrateCommand
    .command("status")
    .description("list applied and pending migrations")
    .action(
      action(async (_options: Options, command: Command) => {
        const options = command.optsWithGlobals<Options>();
        const result = await migrationStatus({ connectionString: resolveDatabaseUrl(options) });
        emit(options, result, [
          ...result.applied.map((name) => `applied  ${name}`),
          ...result.pending.map((name) => `pending  ${name}`),
          result.pending.length === 0 ? "Up to date." : `${result.pending.length} pending.`,
        ]);
      }),
    );
  addDatabaseOption(status);
  addJsonOption(status);

  const sql = migrateCommand
    .command("sql")
    .description("print the pending migrations as one SQL script (apply with psql -v ON_ERROR_STOP=1 -f)")
    .action(
      action(async (_options: DatabaseOption, command: Command) => {
        const options = command.optsWithGlobals<DatabaseOption>();
        process.stdout.write(await pendingSql({ connectionString: resolveDatabaseUrl(options) }));
      }),
    );
  addDatabaseOption(sql);
}
