// Parsers for CLI arguments. Each one either returns a clean value or throws
// commander's InvalidArgumentError (or a UsageError) whose message names what
// was wrong and how to write it, so bad input is one line, exit 2, before any
// database is opened.
import { readFile } from "node:fs/promises";
import { InvalidArgumentError } from "commander";
import { JOB_STATES, type JobState, isJobState } from "../contract.ts";
import { toPgInterval } from "../duration.ts";
import { UsageError } from "./output.ts";

const DURATION_EXAMPLES = "250ms, 30s, 5m, 2h, 7d, 1h30m";
const MAX_BIGINT = 9223372036854775807n;

/**
 * A duration as a PostgreSQL interval literal ("5m" -> "5 minutes"). Every
 * duration option of the CLI reads its value here, so one rule holds for all
 * of them: a bare number is refused with the units to add. PostgreSQL would
 * read `5` as seconds and the library's durations take a bare number as
 * milliseconds, so the CLI guesses neither.
 */
export function parseDuration(value: string): string {
  const bare = value.trim();
  if (/^\d+(\.\d+)?$/.test(bare)) {
    throw new InvalidArgumentError(`${bare} has no unit: write ${bare}s, ${bare}m, ${bare}h or ${bare}d`);
  }
  try {
    return toPgInterval(value);
  } catch (error) {
    const why = error instanceof Error ? error.message.replace(/^invalid duration .*?: /, "") : String(error);
    throw new InvalidArgumentError(`${why}; give a number and a unit, e.g. ${DURATION_EXAMPLES}`);
  }
}

export function integerParser(what: string, min: number, max = 2_147_483_647): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (!/^-?\d+$/.test(value.trim()) || !Number.isSafeInteger(n) || n < min || n > max) {
      throw new InvalidArgumentError(`${what} must be an integer from ${min} to ${max}`);
    }
    return n;
  };
}

/** A job id: a positive bigint, kept as an exact string. */
export function parseJobId(value: string): string {
  const text = value.trim();
  if (!/^\d+$/.test(text) || BigInt(text) < 1n || BigInt(text) > MAX_BIGINT) {
    throw new InvalidArgumentError(`a job id is a positive integer such as 42, not "${value}"`);
  }
  return String(BigInt(text));
}

/** Variadic job id arguments (commander passes them as strings). */
export function parseJobIds(values: readonly string[]): string[] {
  return values.map((value) => {
    try {
      return parseJobId(value);
    } catch (error) {
      throw new UsageError((error as Error).message);
    }
  });
}

/** "12,13" -> ["12", "13"]. */
export function parseJobIdList(value: string): string[] {
  const parts = value.split(",").map((part) => part.trim());
  if (parts.some((part) => part === "")) throw new InvalidArgumentError("give job ids separated by commas, e.g. 12,13");
  return parts.map(parseJobId);
}

/** "failed,cancelled" -> the states, each checked. */
export function parseStates(value: string): JobState[] {
  const parts = value.split(",").map((part) => part.trim());
  for (const part of parts) {
    if (!isJobState(part)) {
      throw new InvalidArgumentError(`unknown state "${part}"; use one of ${JOB_STATES.join(", ")} (comma-separated)`);
    }
  }
  return parts as JobState[];
}

/** An instant for --run-at: ISO 8601 (2026-12-01T09:00:00Z) or "now". */
export function parseInstant(value: string): Date {
  const text = value.trim();
  const date = text.toLowerCase() === "now" ? new Date() : new Date(text);
  if (text === "" || Number.isNaN(date.getTime())) {
    throw new InvalidArgumentError(
      `cannot read "${value}" as a time; give ISO 8601 such as 2026-12-01T09:00:00Z, or use --delay 5m`,
    );
  }
  return date;
}

// ------------------------------------------------------------- payloads

/**
 * The payload argument: JSON text, `@file.json`, or `-` for stdin. Absent means
 * no payload (the SQL default, {}). A syntax error names its line and column.
 */
export async function readPayload(argument: string | undefined): Promise<unknown> {
  if (argument === undefined) return undefined;
  let text: string;
  let source: string;
  if (argument === "-") {
    text = await readStdin();
    source = "the payload on stdin";
  } else if (argument.startsWith("@")) {
    const path = argument.slice(1);
    try {
      text = await readFile(path, "utf8");
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      throw new UsageError(
        code === "ENOENT" ? `payload file ${path}: no such file` : `payload file ${path}: cannot read it (${code ?? String(error)})`,
      );
    }
    source = `payload file ${path}`;
  } else {
    text = argument;
    source = "the payload";
  }
  return parseJson(text, source);
}

export function parseJson(text: string, source: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    const problem = jsonErrorAt(text, error as SyntaxError);
    throw new UsageError(
      `${source} is not valid JSON: ${problem.message} at line ${problem.line} column ${problem.column} ` +
        `(position ${problem.position}); e.g. '{"orderId": 42}', @file.json, or - for stdin`,
    );
  }
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

interface JsonProblem {
  message: string;
  position: number;
  line: number;
  column: number;
}

const AT_POSITION = /(?: in JSON)? at position (\d+)(?: \(line (\d+) column (\d+)\))?$/;
const UNEXPECTED_END = "Unexpected end of JSON input";

/**
 * Where JSON.parse gave up, read from its own error. V8 says "... in JSON at
 * position N" (Node 22 adds "(line L column C)"), or "Unexpected end of JSON
 * input", or, for a character that cannot start a value, "Unexpected token 'c',
 * <an excerpt> is not valid JSON" with no position: that one is found by
 * bisecting on the prefixes JSON.parse still reads to their end, and a
 * misspelt literal (`tru`) is reported where the word starts.
 */
export function jsonErrorAt(text: string, error: SyntaxError): JsonProblem {
  const at = AT_POSITION.exec(error.message);
  if (at !== null) {
    const position = Number(at[1]);
    const message = lowerFirst(error.message.slice(0, at.index));
    if (at[2] !== undefined) return { message, position, line: Number(at[2]), column: Number(at[3]) };
    return { message, position, ...lineAndColumn(text, position) };
  }
  if (error.message === UNEXPECTED_END) {
    return { message: "unexpected end of input", position: text.length, ...lineAndColumn(text, text.length) };
  }
  let position = firstUnreadable(text);
  while (position > 0 && /[A-Za-z]/.test(text[position - 1]!)) position--;
  const word = /^[A-Za-z]+/.exec(text.slice(position))?.[0] ?? text.charAt(position);
  return { message: `unexpected ${JSON.stringify(word)}`, position, ...lineAndColumn(text, position) };
}

/** The index of the first character after which JSON.parse fails before the end of its input. */
function firstUnreadable(text: string): number {
  const readsToEnd = (length: number): boolean => {
    const prefix = text.slice(0, length);
    try {
      JSON.parse(prefix);
      return true;
    } catch (error) {
      const { message } = error as Error;
      const at = AT_POSITION.exec(message);
      return message === UNEXPECTED_END || (at !== null && Number(at[1]) >= length);
    }
  };
  // readsToEnd(0) holds (an empty input ends early); the whole text does not.
  let good = 0;
  let bad = text.length;
  while (bad - good > 1) {
    const middle = Math.floor((good + bad) / 2);
    if (readsToEnd(middle)) good = middle;
    else bad = middle;
  }
  return bad - 1;
}

function lineAndColumn(text: string, position: number): { line: number; column: number } {
  const before = text.slice(0, position).split("\n");
  return { line: before.length, column: (before.at(-1)?.length ?? 0) + 1 };
}

function lowerFirst(text: string): string {
  return text.charAt(0).toLowerCase() + text.slice(1);
}
