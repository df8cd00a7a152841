// Options and help every database command shares: --database-url, --json,
// and examples after the option list.
import type { Command } from "commander";
import { addDatabaseOption, type DatabaseOption } from "./database.ts";
import { addJsonOption, type JsonOption } from "./output.ts";

export type CommonOptions = DatabaseOption & JsonOption;

/** Adds --database-url, --json and an "Examples:" section to `command`. */
export function databaseCommand(command: Command, examples: readonly string[]): Command {
  addDatabaseOption(command);
  addJsonOption(command);
  return addExamples(command, examples);
}

/** The "Examples:" section every command's --help ends with (test/cli/errors.test.ts checks each one has it); "" is a blank line. */
export function addExamples(command: Command, examples: readonly string[]): Command {
  return command.addHelpText("after", `\nExamples:\n${examples.map((line) => (line === "" ? "" : `  ${line}`)).join("\n")}\n`);
}
