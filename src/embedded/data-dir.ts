// Where the embedded PostgreSQL keeps its data, and the port it keeps, defined
// once for the CLI, its help texts and the library's default database
// (database-url.ts).
import { readFileSync, writeFileSync } from "node:fs";
import { isAbsolute, join, relative, resolve } from "node:path";

/**
 * Relative to the current directory, never to the idemq package: an installed
 * package lives in node_modules, which `npm ci` deletes and recreates.
 */
export const DEFAULT_DATA_DIR = ".idemq/pg";

/**
 * The port the data directory's server last listened on, kept in the data
 * directory, so that its URL stays the same from one start to the next (an
 * app's .env, a psql alias) unless another program has taken the port.
 */
export const PORT_FILE = "idemq.port";

/** The embedded server's data directory: IDEMQ_DATA_DIR or .idemq/pg, both relative to the current directory. */
export function embeddedDataDir(): string {
  return resolve(process.env["IDEMQ_DATA_DIR"]?.trim() || DEFAULT_DATA_DIR);
}

/** The path as the user would type it: relative when under the current directory. */
export function displayPath(path: string): string {
  const fromCwd = relative(process.cwd(), path);
  return fromCwd !== "" && !fromCwd.startsWith("..") && !isAbsolute(fromCwd) ? fromCwd : path;
}

/** The port recorded in `dataDir`, or undefined (none yet, or not a port). */
export function recordedPort(dataDir: string): number | undefined {
  try {
    const port = Number(readFileSync(join(dataDir, PORT_FILE), "utf8").trim());
    return Number.isInteger(port) && port > 0 && port < 65536 ? port : undefined;
  } catch {
    return undefined;
  }
}

export function recordPort(dataDir: string, port: number): void {
  writeFileSync(join(dataDir, PORT_FILE), `${port}\n`);
}
