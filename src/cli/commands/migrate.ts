// idemq migrate            apply pending migrations
// idemq migrate status     list applied and pending migrations
// idemq migrate sql        print the pending migrations as one psql script
//
// Without a URL, migrate and migrate status act on the embedded server's
// database idemq (the one other commands start, or a worker's they share);
// opening it does not migrate it, so `migrate` reports what it applied and
// `migrate status` what is pending. `migrate sql` needs a URL: its script is
// for a DBA to apply to a server of their own.
import type { Command } from "commander";
import { migrate, migrationStatus, pendingSql } from "../../migrate.ts";
import { openDatabase } from "../connect.ts";
import { DEFAULT_DATA_DIR } from "../../embedded/data-dir.ts";
import { addDatabaseOption, type DatabaseOption } from "../database.ts";
import { addExamples } from "../define.ts";
import { action, addJsonOption, emit, type JsonOption, UsageError } from "../output.ts";

type Options = DatabaseOption & JsonOption & RolesPrefixOption;
type RolesPrefixOption = { rolesPrefix?: string };

const ROLES_PREFIX_HELP =
  "name this installation's roles PREFIX_producer, PREFIX_worker, PREFIX_admin, PREFIX_viewer (chosen once, at install; default idemq_<database>)";

const EMBEDDED_HELP = `
Without --database-url or DATABASE_URL: the embedded PostgreSQL's database idemq
(data in ${DEFAULT_DATA_DIR} under the current directory, or IDEMQ_DATA_DIR), or
the server of a worker running in this directory. \`migrate sql\` needs a URL.`;

export function registerMigrateCommands(program: Command): void {
  const migrateCommand = program
    .command("migrate")
    .description("apply pending database migrations (schema idemq)")
    .addHelpText("after", EMBEDDED_HELP)
    .action(
      action(async (_options: Options, command: Command) => {
        const options = command.optsWithGlobals<Options>();
        // What an upgrade did that the operator must know (e.g. which logins it made members of
        // this installation's roles) comes as the migrations' NOTICEs: one line each, on stderr.
        const onNotice = (message: string) => {
          if (message.startsWith("idemq:")) process.stderr.write(`${message}\n`);
        };
        const applied = await onDatabase(options, (url) => migrate({ connectionString: url, onNotice, ...rolesPrefix(options) }));
        emit(
          options,
          { applied },
          applied.length === 0 ? "No pending migrations." : applied.map((name) => `Applied ${name}`),
        );
      }),
    );
  migrateCommand.option("--roles-prefix <prefix>", ROLES_PREFIX_HELP);
  addDatabaseOption(migrateCommand);
  addJsonOption(migrateCommand);
  addExamples(migrateCommand, [
    "idemq migrate                     # the embedded PostgreSQL in this directory",
    "idemq migrate --database-url postgres://app@db:5432/app --json",
    "idemq migrate --database-url postgres://app@db:5432/orders --roles-prefix orders_jobs",
    "idemq migrate status",
    "idemq migrate sql --database-url postgres://app@db:5432/app > idemq.sql   # for a DBA",
  ]);

  const status = migrateCommand
    .command("status")
    .description("list applied and pending migrations")
    .addHelpText("after", EMBEDDED_HELP)
    .action(
      action(async (_options: Options, command: Command) => {
        const options = command.optsWithGlobals<Options>();
        const result = await onDatabase(options, (url) => migrationStatus({ connectionString: url }));
        emit(options, result, [
          ...result.applied.map((name) => `applied  ${name}`),
          ...result.pending.map((name) => `pending  ${name}`),
          result.pending.length === 0 ? "Up to date." : `${result.pending.length} pending.`,
        ]);
      }),
    );
  addDatabaseOption(status);
  addJsonOption(status);
  addExamples(status, ["idemq migrate status", "idemq migrate status --json | jq '.pending'"]);

  const sql = migrateCommand
    .command("sql")
    .description("print the pending migrations as one SQL script (apply with psql -v ON_ERROR_STOP=1 -f)")
    .action(
      action(async (_options: DatabaseOption, command: Command) => {
        const options = command.optsWithGlobals<DatabaseOption & RolesPrefixOption>();
        const url = options.databaseUrl?.trim();
        if (!url) {
          throw new UsageError(
            "migrate sql writes a script for a DBA to apply to their own server: pass that server with " +
              "--database-url <url> or DATABASE_URL (`idemq migrate` migrates the embedded one)",
          );
        }
        process.stdout.write(await pendingSql({ connectionString: url, ...rolesPrefix(options) }));
      }),
    );
  sql.option("--roles-prefix <prefix>", ROLES_PREFIX_HELP);
  addDatabaseOption(sql);
  addExamples(sql, [
    "idemq migrate sql --database-url postgres://app@db:5432/app > idemq.sql",
    'psql -v ON_ERROR_STOP=1 "$ADMIN_URL" -f idemq.sql',
  ]);
}

/** The roles prefix, checked here so a bad one is a usage error before any connection (the SQL checks the length again). */
function rolesPrefix(options: RolesPrefixOption): { rolesPrefix?: string } {
  if (options.rolesPrefix === undefined) return {};
  const prefix = options.rolesPrefix.trim();
  if (prefix === "" || Buffer.byteLength(`${prefix}_producer`) > 63) {
    throw new UsageError(`--roles-prefix must be 1 to 54 bytes (role names are at most 63), not ${JSON.stringify(options.rolesPrefix)}`);
  }
  if (prefix === "idemq") {
    throw new UsageError("--roles-prefix idemq would name the cluster-wide roles of 0.1.0, which every database shares: choose a name of this database's own");
  }
  return { rolesPrefix: prefix };
}

/**
 * Runs `work` on the given URL, or on the embedded database, opened without
 * migrating it. A given URL is migrated as it is (not checked first), so a failure
 * carries the server's own message and SQLSTATE.
 */
async function onDatabase<T>(options: Options, work: (url: string) => Promise<T>): Promise<T> {
  const given = options.databaseUrl?.trim();
  if (given) return work(given);
  const db = await openDatabase({ json: options.json, migrate: false });
  try {
    return await work(db.url);
  } catch (error) {
    throw db.serverLost?.() ?? error;
  } finally {
    await db.close();
  }
}
