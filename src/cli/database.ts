// The --database-url option shared by every command that talks to PostgreSQL.
// Commands call openDatabase (connect.ts), which uses the embedded server when
// no URL is given; only `migrate sql` requires one.
import { type Command, Option } from "commander";

export interface DatabaseOption {
  databaseUrl?: string;
}

export function addDatabaseOption(command: Command): Command {
  return command.addOption(
    new Option("--database-url <url>", "PostgreSQL connection string").env("DATABASE_URL"),
  );
}
