// Shared CLI plumbing: --json output, one-line errors, exit codes. Under
// --json, stdout carries one JSON object (camelCase keys) per result, and an
// error is one object too, `{ "error": { code, message, hint } }` (errorJson,
// written by reportError, the only place errors are reported); stderr still
// gets the error's one line for whoever watches.
// Exit codes are defined in exit-codes.ts: 0 success, 1 failure, 2 usage error
// (bad or missing arguments), and codes for the idemq errors (IQ409 -> 3...).
import { Command, Option } from "commander";
import { IdemqError, isConnectionFailure } from "../errors.ts";
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

/** A name the CLI looked up and did not find (a schedule): exit code 5. Job ids are IQ404 from SQL. */
export class NotFoundError extends Error {
  override name = "NotFoundError";
}

/**
 * The `code` of an error that carries no SQLSTATE. A SQLSTATE is five
 * characters, digits and capitals ("IQ404", "22023", "3D000"); these are
 * lower-case words, so the two can never be confused.
 */
export const CLI_ERROR_CODES = {
  /** Bad invocation: unknown command or option, bad value (exit 2). */
  usage: "usage",
  /** A name with nothing behind it, e.g. `schedules remove` of no schedule (exit 5). */
  notFound: "not_found",
  /** The database cannot be reached (exit 1). */
  connection: "connection",
  /** Anything else (exit 1). */
  failure: "failure",
} as const;

/**
 * What a command prints on stdout for an error under --json: one object,
 * whatever the command, `{ "error": { code, message, hint, ...details } }`.
 * code is the SQLSTATE when PostgreSQL or idemq raised one, else one of
 * CLI_ERROR_CODES; message has neither the code nor the hint; hint says how
 * to fix it (null when the message already does); `detail` carries the
 * fields of an idemq error's DETAIL, camelCased (see design.md "Error codes").
 */
export interface ErrorJson {
  error: { code: string; message: string; hint: string | null; [detail: string]: unknown };
}

export function errorJson(error: unknown, details: Record<string, unknown> = {}): ErrorJson {
  const { message, hint } = errorParts(error);
  const fields = detailFields(error);
  return {
    error: { code: errorCode(error), message, hint, ...(fields === undefined ? {} : { detail: fields }), ...details },
  };
}

function sqlState(error: unknown): string | undefined {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const { code } = e as { code?: unknown };
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return undefined;
}

function errorCode(error: unknown): string {
  if (error instanceof Error && error.name === "UsageError") return CLI_ERROR_CODES.usage;
  if (error instanceof Error && error.name === "NotFoundError") return CLI_ERROR_CODES.notFound;
  const state = sqlState(error);
  if (state !== undefined) return state;
  if (isConnectionFailure(error) || (error instanceof Error && error.message.startsWith("cannot connect to the database"))) {
    return CLI_ERROR_CODES.connection;
  }
  return CLI_ERROR_CODES.failure;
}

/**
 * An idemq error's DETAIL object with camelCase keys, job ids as strings like
 * every id the CLI prints (exact: quoted before parsing, never a float):
 * {"existing_job_id": 7} -> { existingJobId: "7" }.
 */
function detailFields(error: unknown): Record<string, unknown> | undefined {
  if (!(error instanceof IdemqError) || error.detail === undefined) return undefined;
  try {
    const parsed: unknown = JSON.parse(error.detail.replace(/("(?:\w+_)?job_id"\s*:\s*)(-?\d+)/g, '$1"$2"'));
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) return undefined;
    return Object.fromEntries(Object.entries(parsed).map(([key, value]) => [camelCase(key), value]));
  } catch {
    return undefined;
  }
}

/** "existing_job_id" -> "existingJobId": the one casing of the CLI's JSON. */
export function camelCase(key: string): string {
  return key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
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
 * trace), and under --json also errorJson on stdout; exit code 1, or 2 for a
 * UsageError (exitCodeFor).
 */
export function action<Args extends unknown[]>(
  run: (...args: Args) => Promise<void> | void,
): (...args: Args) => Promise<void> {
  return async (...args: Args) => {
    try {
      await run(...args);
    } catch (error) {
      const cmd = args.at(-1);
      const json = cmd instanceof Command ? cmd.optsWithGlobals<JsonOption>().json : jsonRequested();
      reportError(error, { json });
    }
  };
}

/**
 * The one way a command reports an error: one line on stderr, and with --json
 * also one errorJson object on stdout (with `details`, e.g. the job holding a
 * key); sets the exit code.
 */
export function reportError(error: unknown, options: JsonOption = {}, details: Record<string, unknown> = {}): void {
  // An error may quote a task name or key.
  process.stderr.write(`idemq: ${printable(errorLine(error))}\n`);
  if (options.json) process.stdout.write(`${JSON.stringify(errorJson(error, details))}\n`);
  process.exitCode = exitCodeFor(error);
}

/** --json on the command line (before a lone --): for errors commander raises before any option is read. */
function jsonRequested(argv: readonly string[] = process.argv): boolean {
  const end = argv.indexOf("--");
  return (end === -1 ? argv : argv.slice(0, end)).includes("--json");
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
      if (jsonRequested()) {
        const json: ErrorJson = { error: { code: CLI_ERROR_CODES.usage, message, hint: `see \`${path} --help\`` } };
        process.stdout.write(`${JSON.stringify(json)}\n`);
      }
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
  const { message, hint } = errorParts(error);
  const state = error instanceof Error ? (error as { code?: unknown }).code : undefined;
  let line = message;
  if (typeof state === "string" && /^[0-9A-Z]{5}$/.test(state)) line += ` (SQLSTATE ${state})`;
  // idemq's SQL errors carry the fix in their HINT.
  if (hint !== null) line += `; ${lowerFirst(hint.replace(/\.$/, ""))}`;
  return line;
}

/** An error's one-line message (without its SQLSTATE) and an idemq error's HINT, apart. */
function errorParts(error: unknown): { message: string; hint: string | null } {
  if (!(error instanceof Error)) return { message: String(error), hint: null };
  let message = error.message;
  // A refused connection to a host with several addresses is an AggregateError with an empty message.
  if (message === "" && error instanceof AggregateError) {
    message = [...new Set(error.errors.map((inner) => (inner instanceof Error ? inner.message : String(inner))))].join("; ");
  }
  const { code } = error as { code?: unknown };
  if (message === "" && typeof code === "string") message = code;
  if (message === "") message = error.name;
  if (/ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|EHOSTUNREACH/.test(message)) message = `cannot connect to the database: ${message}`;
  const oneLine = (text: string): string => text.replace(/\s*\n\s*/g, " ").trim();
  const hint = error instanceof IdemqError && error.hint ? oneLine(error.hint) : null;
  return { message: oneLine(message), hint };
}
