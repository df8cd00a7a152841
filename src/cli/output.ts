// Shared CLI plumbing: --json output, one-line errors, exit codes.
// Exit codes are defined in exit-codes.ts: 0 success, 1 failure, 2 usage error
// (bad or missing arguments), and codes for the idemq errors (IQ409 -> 3...).
import { type Command, Option } from "commander";
import { IdemqError } from "../errors.ts";
import { exitCodeFor } from "./exit-codes.ts";
import { printable, printableLines } from "./terminal-text.ts";

// `idemq jobs | head` closes stdout early: stop quietly instead of crashing
// with an EPIPE stack trace. (An embedded server is stopped by its exit hook.)
process.stdout.on("error", (error: NodeJS.ErrnoException) => {
  if (error.code !== "EPIPE") throw error;
  process.exit(typeof process.exitCode === "number" ? process.exitCode : 0);
});

/** A mistake in how the CLI was called: exit code 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

export interface JsonOption {
  json?: boolean;
}

export function addJsonOption(command: Command): Command {
  return command.addOption(new Option("--json", "print machine-readable JSON on stdout"));
}

/**
 * Prints `value` as one JSON line when --json was given (exact), else the
 * human-readable lines, with any control character left in them escaped
 * (printableLines; the formatters escape each field, so a newline inside one
 * cannot start a line of its own).
 */
export function emit(options: JsonOption, value: unknown, human: string | string[]): void {
  if (options.json) {
    process.stdout.write(`${JSON.stringify(value)}\n`);
    return;
  }
  const text = printableLines(Array.isArray(human) ? human.join("\n") : human);
  if (text !== "") process.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
}

/**
 * Wraps a command's action: any error becomes one line on stderr (no stack
 * trace) and exit code 1, or 2 for a UsageError.
 */
export function action<Args extends unknown[]>(
  run: (...args: Args) => Promise<void> | void,
): (...args: Args) => Promise<void> {
  return async (...args: Args) => {
    try {
      await run(...args);
    } catch (error) {
      reportError(error);
    }
  };
}

export function reportError(error: unknown): void {
  // An error may quote a task name or key.
  process.stderr.write(`idemq: ${printable(errorLine(error))}\n`);
  process.exitCode = exitCodeFor(error);
}

/**
 * Makes commander's own errors (unknown command or option, missing or invalid
 * argument) one line, prefixed like ours and naming the help to read. Call it
 * once every command is registered.
 */
export function oneLineCommanderErrors(command: Command): void {
  const path = commandPath(command);
  command.configureOutput({
    outputError: (text, write) => {
      const message = text
        .replace(/^error:\s*/i, "")
        .replace(/\s*\n\s*/g, " ")
        .trim()
        .replace(/\.$/, "");
      // It may quote an argument: escaped, like every line a terminal shows.
      write(`idemq: ${printable(message)}; see \`${path} --help\`\n`);
    },
  });
  for (const sub of command.commands) oneLineCommanderErrors(sub);
}

/** "Check the id" -> "check the id"; an acronym ("SQL ...") stays. */
function lowerFirst(text: string): string {
  return /^[A-Z](?![A-Z0-9])/.test(text) ? text[0]!.toLowerCase() + text.slice(1) : text;
}

function commandPath(command: Command): string {
  const names: string[] = [];
  for (let c: Command | null = command; c !== null; c = c.parent) names.unshift(c.name());
  return names.join(" ");
}

/** One line describing an error, with the SQLSTATE of a PostgreSQL error (raw: wrap it in printable() for a terminal). */
export function errorLine(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  let message = error.message;
  // A refused connection to a host with several addresses is an AggregateError with an empty message.
  if (message === "" && error instanceof AggregateError) {
    message = [...new Set(error.errors.map((inner) => (inner instanceof Error ? inner.message : String(inner))))].join("; ");
  }
  const { code } = error as { code?: unknown };
  if (message === "" && typeof code === "string") message = code;
  if (message === "") message = error.name;
  if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) message += ` (SQLSTATE ${code})`;
  if (/ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|EHOSTUNREACH/.test(message)) message = `cannot connect to the database: ${message}`;
  // idemq's SQL errors carry the fix in their HINT.
  if (error instanceof IdemqError && error.hint) message += `; ${lowerFirst(error.hint.replace(/\.$/, ""))}`;
  return message.replace(/\s*\n\s*/g, " ").trim();
}
