// The programs some tests drive that `npm ci` cannot install: PgBouncer (the
// pooler tests, through ./pgbouncer.ts) and Chromium (the dashboard's browser
// tests, through ./browser.ts). Each one's path is defined here and nowhere
// else. The global setup calls ensureSystemTools() before any test runs, so
// that `npm test` on a fresh machine either gets what it needs or stops at
// once with one line saying what to install: without it, the tests that need
// a missing program failed one by one, the run exiting 1 after 14 minutes.
import { execFile } from "node:child_process";
import { accessSync, constants, existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { delimiter, join } from "node:path";

export interface SystemTool {
  name: string;
  /** The Debian package that installs it at one of `defaultPaths`. */
  debianPackage: string;
  /** Names a path that replaces `defaultPaths` (a program installed elsewhere). */
  envVariable: string;
  defaultPaths: readonly string[];
  /** The helper module that drives it: a test file importing it needs the tool. */
  helper: string;
  /** Who needs it, for the set-up's messages. */
  neededBy: string;
}

export const PGBOUNCER: SystemTool = {
  name: "pgbouncer",
  debianPackage: "pgbouncer",
  envVariable: "PGBOUNCER_PATH",
  defaultPaths: ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"],
  helper: "helpers/pgbouncer.ts",
  neededBy: "the PgBouncer tests",
};

export const CHROMIUM: SystemTool = {
  name: "chromium",
  debianPackage: "chromium",
  envVariable: "CHROMIUM_PATH",
  defaultPaths: ["/usr/bin/chromium"],
  helper: "helpers/browser.ts",
  neededBy: "the dashboard's browser tests",
};

export const SYSTEM_TOOLS: readonly SystemTool[] = [PGBOUNCER, CHROMIUM];

type Env = Readonly<Record<string, string | undefined>>;

/** Where the tool is, or where it is looked for when it is not there (`found` false). */
export function locate(tool: SystemTool, env: Env = process.env, exists: (path: string) => boolean = existsSync) {
  const override = env[tool.envVariable];
  if (override !== undefined && override !== "") return { path: override, found: exists(override), overridden: true };
  const path = tool.defaultPaths.find((p) => exists(p));
  return { path: path ?? tool.defaultPaths[0]!, found: path !== undefined, overridden: false };
}

/**
 * The tool's path. Missing here means the set-up did not see that this run
 * needs it (a test file that reaches the helper through another module).
 */
export function toolPath(tool: SystemTool): string {
  const where = locate(tool);
  if (!where.found) {
    throw new Error(`${tool.name} is not at ${where.path}: install it as root with \`${installCommand([tool.debianPackage])}\`, or set ${tool.envVariable}`);
  }
  return where.path;
}

export interface MissingTool {
  tool: SystemTool;
  /** Where it was looked for. */
  path: string;
  /** The path came from tool.envVariable, so installing the Debian package would not put it there. */
  overridden: boolean;
}

export type SetupStep =
  | { kind: "ready" }
  | { kind: "install"; packages: string[]; line: string }
  | { kind: "fail"; line: string };

const LINE = "test set-up:";

function listed(words: readonly string[]): string {
  return words.length <= 1 ? (words[0] ?? "") : `${words.slice(0, -1).join(", ")} and ${words.at(-1)}`;
}

/**
 * What the set-up does about the tools this run needs and cannot find:
 * nothing when none is missing; install their Debian packages when it may
 * (root, apt-get on PATH); otherwise fail with one line that says what to
 * install and how. A path named by an environment variable that does not
 * exist fails either way: the package would not put the program there.
 */
export function decide(situation: { missing: readonly MissingTool[]; root: boolean; aptGet: boolean }): SetupStep {
  const { missing, root, aptGet } = situation;
  if (missing.length === 0) return { kind: "ready" };
  const overridden = missing.filter((m) => m.overridden);
  if (overridden.length > 0) {
    const named = overridden.map((m) => `${m.tool.envVariable}=${m.path}`);
    return {
      kind: "fail",
      line:
        `${LINE} ${listed(named)} ${overridden.length === 1 ? "does" : "do"} not exist ` +
        `(${listed(overridden.map((m) => m.tool.neededBy))} need ${overridden.length === 1 ? "it" : "them"}): ` +
        `point ${overridden.length === 1 ? "it at the program" : "them at the programs"}, or unset ${listed(overridden.map((m) => m.tool.envVariable))} ` +
        `to use Debian's (${listed(overridden.map((m) => m.tool.defaultPaths[0]!))})`,
    };
  }
  const packages = missing.map((m) => m.tool.debianPackage);
  const what = `${listed(missing.map((m) => `${m.tool.name} (${m.tool.neededBy})`))}`;
  if (root && aptGet) {
    return { kind: "install", packages, line: `${LINE} installing ${what} with apt-get: ${installCommand(packages)}` };
  }
  const why = [root ? "" : "not root", aptGet ? "" : "no apt-get on PATH"].filter((w) => w !== "").join(", ");
  return {
    kind: "fail",
    line:
      `${LINE} ${what} ${missing.length === 1 ? "is" : "are"} not installed, and npm test installs ` +
      `${missing.length === 1 ? "it" : "them"} only as root with apt-get (here: ${why}): ` +
      `run \`sudo sh -c '${installCommand(packages)}'\` (Debian, Ubuntu), ` +
      `or set ${listed(missing.map((m) => m.tool.envVariable))} to where ${missing.length === 1 ? "it is" : "they are"}`,
  };
}

export function installCommand(packages: readonly string[]): string {
  return `apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${packages.join(" ")}`;
}

/** The tools the given test files need: those whose helper a file imports. */
export function toolsNeeded(sources: readonly string[]): SystemTool[] {
  return SYSTEM_TOOLS.filter((tool) => sources.some((source) => [`"`, `'`].some((quote) => source.includes(`/${tool.helper}${quote}`))));
}

function onPath(program: string, env: Env): boolean {
  return (env.PATH ?? "").split(delimiter).some((dir) => {
    if (dir === "") return false;
    try {
      accessSync(join(dir, program), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** One apt-get run (found on env's PATH); its output is kept for the failure line, not printed. */
function aptGet(args: readonly string[], env: Env): Promise<{ code: number; output: string }> {
  return new Promise((resolve) => {
    execFile(
      "apt-get",
      // Another apt-get on this machine holds dpkg's lock for a while: wait for it rather than fail.
      ["-o", "DPkg::Lock::Timeout=600", ...args],
      { env: { ...env, DEBIAN_FRONTEND: "noninteractive" }, maxBuffer: 64 * 1024 * 1024 },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === "number" ? error.code : 1;
        resolve({ code, output: `${stdout}${stderr}` });
      },
    );
  });
}

export interface EnsureOptions {
  /** The test files of this run. */
  files: readonly string[];
  /** Default process.env: the tools' path variables, and the PATH apt-get is found on. */
  env?: Env;
  /** Default: whether this process runs as root. */
  root?: boolean;
  /** Default existsSync: where a tool is (a test makes every tool missing). */
  exists?: (path: string) => boolean;
  log?: (line: string) => void;
}

/**
 * Installs what the run's test files need and is missing, or throws the
 * set-up's one line (as an error with no stack: vitest then prints just it).
 */
export async function ensureSystemTools(options: EnsureOptions): Promise<void> {
  const env = options.env ?? process.env;
  const sources = await Promise.all(options.files.map((file) => readFile(file, "utf8")));
  const missing = (): MissingTool[] =>
    toolsNeeded(sources).flatMap((tool) => {
      const where = locate(tool, env, options.exists);
      return where.found ? [] : [{ tool, path: where.path, overridden: where.overridden }];
    });
  const step = decide({ missing: missing(), root: options.root ?? process.getuid?.() === 0, aptGet: onPath("apt-get", env) });
  if (step.kind === "ready") return;
  if (step.kind === "fail") throw setupError(step.line);
  (options.log ?? console.log)(step.line);
  const update = await aptGet(["update", "-qq"], env);
  const install = update.code === 0 ? await aptGet(["install", "-y", "-qq", ...step.packages], env) : update;
  const still = missing();
  if (install.code !== 0 || still.length > 0) {
    const lastLine = install.output.trim().split("\n").at(-1) ?? "";
    const failed = install.code === 0 ? `left ${listed(still.map((m) => m.path))} missing` : `exited ${install.code}${lastLine === "" ? "" : ` (${lastLine.trim()})`}`;
    throw setupError(`${LINE} apt-get ${failed}; install ${listed(step.packages)} yourself: ${installCommand(step.packages)}`);
  }
}

function setupError(line: string): Error {
  const error = new Error(line);
  error.stack = line;
  return error;
}
