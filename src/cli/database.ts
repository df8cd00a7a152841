// The --database-url option shared by every command that talks to PostgreSQL.
import { type Command, Option } from "commander";
import { UsageError } from "./output.ts";

export interface DatabaseOption {
  databaseUrl?: string;
}

export function addDatabaseOption(command: Command): Command {
  return command.addOption(
    new Option("--database-url <url>", "PostgreSQL connection string").env("DATABASE_URL"),
  );
}

/**
 * The connection string, for the commands that need a server of the user's own:
 * `migrate sql` (a script for a DBA to apply there). Every other command calls
 * openDatabase (connect.ts), which starts the embedded server when no URL is given.
 * A UsageError when there is none.
 */
export function resolveDatabaseUrl(options: DatabaseOption): string {
  const url = options.databaseUrl?.trim();
  if (url) return url;
  throw new UsageError("no database given: pass --database-url <url> or set DATABASE_URL");
}
