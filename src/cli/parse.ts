// Parsers for CLI arguments. Each one either returns a clean value or throws
// commander's InvalidArgumentError (or a UsageError) whose message names what
// was wrong and how to write it, so bad input is one line, exit 2, before any
// database is opened.
import { readFile } from "node:fs/promises";
import { InvalidArgumentError } from "commander";
import { DUPLICATE_POLICIES, JOB_STATES, type JobState, isJobState, toPgInterval } from "../contract.ts";
import { UsageError } from "./output.ts";

const DURATION_EXAMPLES = "250ms, 30s, 5m, 2h, 7d, 1h30m";
const MAX_BIGINT = 9223372036854775807n;

/** A duration as a PostgreSQL interval literal ("5m" -> "5 minutes"). */
export function parseDuration(value: string): string {
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

export function policyHelp(): string {
  return DUPLICATE_POLICIES.join(", ");
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
  } catch {
    const problem = findJsonError(text);
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

/**
 * Where JSON.parse gave up, which Node 20 does not always say: a small
 * recursive-descent scan of the same grammar, for the error message only.
 */
export function findJsonError(text: string): JsonProblem {
  let pos = 0;
  class Stop extends Error {}
  let problem = "";
  const fail = (message: string): never => {
    problem = message;
    throw new Stop();
  };
  const describe = (): string => (pos >= text.length ? "end of input" : `"${text[pos]}"`);
  const ws = (): void => {
    while (pos < text.length && " \t\n\r".includes(text[pos]!)) pos++;
  };
  const literal = (word: string): void => {
    if (text.startsWith(word, pos)) pos += word.length;
    else fail(`unexpected ${describe()}`);
  };
  const string = (): void => {
    pos++; // opening quote
    for (;;) {
      if (pos >= text.length) fail("unterminated string");
      const c = text[pos]!;
      if (c === '"') {
        pos++;
        return;
      }
      if (c === "\\") {
        const next = text[pos + 1];
        if (next === "u") {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(pos + 2, pos + 6))) fail("bad \\u escape in a string");
          pos += 6;
        } else if (next !== undefined && '"\\/bfnrt'.includes(next)) {
          pos += 2;
        } else {
          fail("bad escape in a string");
        }
      } else if (c < " ") {
        fail("control character in a string");
      } else {
        pos++;
      }
    }
  };
  const number = (): void => {
    const match = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(pos));
    if (match === null) fail(`unexpected ${describe()}`);
    pos += match![0].length;
  };
  const value = (): void => {
    ws();
    const c = text[pos];
    if (c === "{") {
      pos++;
      ws();
      if (text[pos] === "}") {
        pos++;
        return;
      }
      for (;;) {
        ws();
        if (text[pos] !== '"') fail(`expected a property name in double quotes, found ${describe()}`);
        string();
        ws();
        if (text[pos] !== ":") fail(`expected ":" after a property name, found ${describe()}`);
        pos++;
        value();
        ws();
        if (text[pos] === ",") {
          pos++;
          continue;
        }
        if (text[pos] === "}") {
          pos++;
          return;
        }
        fail(`expected "," or "}" after a property value, found ${describe()}`);
      }
    } else if (c === "[") {
      pos++;
      ws();
      if (text[pos] === "]") {
        pos++;
        return;
      }
      for (;;) {
        value();
        ws();
        if (text[pos] === ",") {
          pos++;
          continue;
        }
        if (text[pos] === "]") {
          pos++;
          return;
        }
        fail(`expected "," or "]" after an array element, found ${describe()}`);
      }
    } else if (c === '"') {
      string();
    } else if (c === "t") {
      literal("true");
    } else if (c === "f") {
      literal("false");
    } else if (c === "n") {
      literal("null");
    } else if (c === "-" || (c !== undefined && c >= "0" && c <= "9")) {
      number();
    } else {
      fail(pos >= text.length ? "no JSON value (empty input)" : `unexpected ${describe()}`);
    }
  };
  try {
    value();
    ws();
    if (pos < text.length) fail(`unexpected ${describe()} after the JSON value`);
    problem = "not valid JSON";
  } catch (error) {
    if (!(error instanceof Stop)) throw error;
  }
  const before = text.slice(0, pos).split("\n");
  return { message: problem, position: pos, line: before.length, column: (before.at(-1)?.length ?? 0) + 1 };
}
