// Where the embedded PostgreSQL keeps its data, defined once for the CLI and
// its help texts.
import { isAbsolute, relative, resolve } from "node:path";

/**
 * Relative to the current directory, never to the idemq package: an installed
 * package lives in node_modules, which `npm ci` deletes and recreates.
 */
export const DEFAULT_DATA_DIR = ".idemq/pg";

/** The embedded server's data directory: IDEMQ_DATA_DIR or .idemq/pg, both relative to the current directory. */
export function embeddedDataDir(): string {
  return resolve(process.env.IDEMQ_DATA_DIR?.trim() || DEFAULT_DATA_DIR);
}

/** The path as the user would type it: relative when under the current directory. */
export function displayPath(path: string): string {
  const fromCwd = relative(process.cwd(), path);
  return fromCwd !== "" && !fromCwd.startsWith("..") && !isAbsolute(fromCwd) ? fromCwd : path;
}
