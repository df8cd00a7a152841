// The exit codes of the idemq CLI, defined once. Scripts may rely on them;
// `idemq --help` prints EXIT_CODES_HELP.
import {
  BadArgumentError,
  DuplicateJobError,
  IdemqError,
  InvalidStateError,
  JobNotFoundError,
  KeyReuseError,
} from "../errors.ts";
import { DEFAULT_DATA_DIR } from "../embedded/data-dir.ts";

export const EXIT = {
  /** Success (doctor: healthy). */
  OK: 0,
  /** The command failed: database unreachable or its data directory in use, a server error. */
  FAILURE: 1,
  /** Bad input: unknown command or option, malformed JSON, bad id, duration, policy or state. Nothing changed. */
  USAGE: 2,
  /** IQ409: the duplicate policy rejected the enqueue (or a retry): the key's job is printed. */
  REJECTED: 3,
  /** IQ422: the idempotency key is held by an active job doing different work. */
  KEY_CONFLICT: 4,
  /** IQ404: no such job; also `schedules remove|next` given a name with no schedule. */
  NOT_FOUND: 5,
  /** IQ412: the job's state does not allow the operation (e.g. cancel a succeeded job). */
  INVALID_STATE: 6,
  /** doctor: warnings only (the queue works; something needs attention). */
  DOCTOR_WARNINGS: 7,
  /** doctor: problems (the queue is broken or at risk). */
  DOCTOR_PROBLEMS: 8,
} as const;
export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** Signals end the CLI with 128 + the signal number, as shells report them. */
export const SIGNAL_EXIT: Readonly<Record<"SIGHUP" | "SIGINT" | "SIGTERM", number>> = {
  SIGHUP: 129,
  SIGINT: 130,
  SIGTERM: 143,
};

const BY_SQLSTATE: Readonly<Record<string, number>> = {
  IQ409: EXIT.REJECTED,
  IQ422: EXIT.KEY_CONFLICT,
  IQ404: EXIT.NOT_FOUND,
  IQ412: EXIT.INVALID_STATE,
  IQ400: EXIT.USAGE,
};

/** The exit code for an error a command let escape. */
export function exitCodeFor(error: unknown): number {
  if (error instanceof DuplicateJobError) return EXIT.REJECTED;
  if (error instanceof KeyReuseError) return EXIT.KEY_CONFLICT;
  if (error instanceof JobNotFoundError) return EXIT.NOT_FOUND;
  if (error instanceof InvalidStateError) return EXIT.INVALID_STATE;
  // Class 22 / IQ400 from SQL, or a client-side check: the input was wrong.
  if (error instanceof BadArgumentError) return EXIT.USAGE;
  if (error instanceof Error && error.name === "UsageError") return EXIT.USAGE;
  if (error instanceof Error && error.name === "NotFoundError") return EXIT.NOT_FOUND;
  // A plain IdemqError of a known code: fromPgError gives one when the error's
  // DETAIL breaks the contract, so its class could not read it.
  if (error instanceof IdemqError) return BY_SQLSTATE[error.code] ?? (error.code.startsWith("22") ? EXIT.USAGE : EXIT.FAILURE);
  return EXIT.FAILURE;
}

export const EXIT_CODES_HELP = `Exit codes:
  0    success (doctor: healthy)
  1    failure: database unreachable, data directory in use, server error
  2    bad input: unknown command or option, malformed JSON, bad id, duration,
       policy or state (nothing was changed)
  3    enqueue or retry rejected by the duplicate policy (IQ409); the job
       holding the key is printed
  4    idempotency key reused for different work (IQ422)
  5    no such job (IQ404), or no schedule of that name (schedules
       remove|next)
  6    the job's state does not allow this (IQ412)
  7    doctor: warnings
  8    doctor: problems
  129, 130, 143  stopped by SIGHUP, SIGINT (Ctrl-C), SIGTERM
  With several job ids (jobs retry|cancel|reschedule), each id is tried; the
  exit code is that of the first id that failed.`;

export const ENVIRONMENT_HELP = `Database:
  --database-url <url> or DATABASE_URL: use that PostgreSQL (15 or later),
  migrated with \`idemq migrate\`. Without either, commands use an embedded
  PostgreSQL 18 with its data in ${DEFAULT_DATA_DIR} under the current directory
  (IDEMQ_DATA_DIR moves it), on 127.0.0.1 at a port kept in the data directory,
  database idemq created and migrated. \`idemq dev\` runs it until Ctrl-C and
  prints its DATABASE_URL; while it (or a worker, \`stats --watch\`, the demo)
  runs it, other commands in the same directory use that server, and so do
  new Client() and createWorker() without a URL. Otherwise each command starts
  it and stops it when it finishes (two at once take turns). \`migrate sql\`
  needs a URL (it writes a script for a DBA's server).

Environment:
  DATABASE_URL     connection string (same as --database-url)
  IDEMQ_DATA_DIR   data directory of the embedded server, relative to the
                   current directory (default ${DEFAULT_DATA_DIR})
  NO_COLOR         plain output`;
