// Runs the CLI as a real subprocess: node bin/idemq.js <args>.
import { execFile } from "node:child_process";
import { resolve } from "node:path";

export const CLI = resolve(import.meta.dirname, "..", "..", "bin", "idemq.js");

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface CliOptions {
  /** Extra environment; DATABASE_URL is removed unless given here. */
  env?: Record<string, string>;
  timeoutMs?: number;
  input?: string;
  /** Working directory (default: the test process's); the embedded server's default data directory is under it. */
  cwd?: string;
}

export function runCli(args: string[], options: CliOptions = {}): Promise<CliResult> {
  const env: NodeJS.ProcessEnv = { ...process.env, ...options.env };
  if (options.env?.DATABASE_URL === undefined) delete env.DATABASE_URL;
  env.NO_COLOR = "1";
  return new Promise((resolveResult) => {
    const child = execFile(
      process.execPath,
      [CLI, ...args],
      { env, cwd: options.cwd, timeout: options.timeoutMs ?? 30_000, maxBuffer: 16 * 1024 * 1024 },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === "number" ? error.code : 1) : 0;
        resolveResult({ code, stdout, stderr });
      },
    );
    if (options.input !== undefined) child.stdin?.end(options.input);
  });
}
