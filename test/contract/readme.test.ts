// Every command and code block in README.md is run here, so the README stays
// true: ```sh blocks by bash (set -e, pipefail) from the repository root,
// ```ts blocks by tsx (and type-checked with the project's strict settings),
// ```sql blocks by psql (ON_ERROR_STOP). Each block gets a fresh migrated
// database in DATABASE_URL, and IDEMQ_DATA_DIR points at an empty temporary
// directory, so an embedded server starts from a clean state as on a new
// machine and never touches this checkout's .idemq/pg.
//
// A block that cannot run as written carries the marker
//   <!-- readme-test: substitute -->
// on the line before it, and SUBSTITUTES below says what runs instead and why.
// A command that runs until it is stopped (a worker, `stats --watch`) is
// marked
//   <!-- readme-test: runs until stopped -->
// and must still be running after RUNS_UNTIL_STOPPED_MS, then exit within
// STOP_GRACE_MS of a SIGTERM to its process group (as a service manager stops it).
// A ```text block marked
//   <!-- readme-test: output of the previous block -->
// is sample output: each of its lines must appear in what the previous block
// printed (runs of spaces compared as one; "..." stands for what varies, and a
// line "..." for lines left out).
//
// The README speaks to a user who installed the package and runs the CLI as
// `npx idemq`. Here, in the package's own repository, npx would find no idemq
// in node_modules and fetch one from the registry, so ```sh blocks run
// `npx idemq` as `node bin/idemq.js`, the file an installed package's
// `npx idemq` runs, and a path into the installed package,
// `node_modules/idemq/...`, as the same path in this repository
// (test/install/package.test.ts runs both in a real app).
import { execFile, spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../helpers/db.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const README = join(ROOT, "README.md");
const BLOCK_TIMEOUT_MS = 300_000;
const RUNS_UNTIL_STOPPED = "runs until stopped";
const RUNS_UNTIL_STOPPED_MS = 8_000;
const STOP_GRACE_MS = 30_000;

const RUNNERS = { sh: "sh", bash: "sh", shell: "sh", ts: "ts", typescript: "ts", sql: "sql" } as const;
type Kind = (typeof RUNNERS)[keyof typeof RUNNERS];
/** Fences that are not code: sample output, diagrams. */
const NOT_CODE = new Set(["text", "json", "mermaid"]);

interface Block {
  kind: Kind | "text" | "other";
  lang: string;
  code: string;
  /** 1-based line of the opening fence. */
  line: number;
  heading: string;
  marker: string | undefined;
}

function parseReadme(text: string): Block[] {
  const lines = text.split("\n");
  const blocks: Block[] = [];
  let heading = "(top)";
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const title = /^#{1,4}\s+(.*)$/.exec(line);
    if (title) heading = title[1]!.trim();
    const fence = /^```(\S*)\s*$/.exec(line);
    if (!fence) continue;
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !/^```\s*$/.test(lines[i]!); i++) body.push(lines[i]!);
    if (i >= lines.length) throw new Error(`README.md:${start + 1}: the block is never closed`);
    const before = lines.slice(0, start).reverse().find((l) => l.trim() !== "");
    const marker = /^<!--\s*readme-test:\s*(.*?)\s*-->$/.exec(before?.trim() ?? "")?.[1];
    const lang = fence[1]!.toLowerCase();
    const kind = lang in RUNNERS ? RUNNERS[lang as keyof typeof RUNNERS] : lang === "text" ? "text" : "other";
    blocks.push({ kind, lang, code: body.join("\n"), line: start + 1, heading, marker });
  }
  return blocks;
}

const blocks = parseReadme(readFileSync(README, "utf8"));
const runnable = blocks.filter((b): b is Block & { kind: Kind } => b.kind === "sh" || b.kind === "ts" || b.kind === "sql");

interface Outcome {
  code: number | null;
  stdout: string;
  stderr: string;
}

let workDir: string;
let dataDirs: string;
/** What each block printed, by its line, for the sample-output blocks. */
const printed = new Map<number, string>();

beforeAll(async () => {
  // Inside the repository (under .data/, which git ignores), so a block's
  // `import ... from "idemq"` resolves to this package as it would for a user.
  mkdirSync(join(ROOT, ".data"), { recursive: true });
  workDir = await mkdtemp(join(ROOT, ".data", "readme-test-"));
  dataDirs = await mkdtemp(join(tmpdir(), "idemq-readme-"));
});
afterAll(async () => {
  if (workDir) await rm(workDir, { recursive: true, force: true });
  if (dataDirs) await rm(dataDirs, { recursive: true, force: true });
});

/** The environment of a reader's shell: no vitest variables, a database, an empty data directory. */
async function readerEnv(databaseUrl: string | undefined): Promise<NodeJS.ProcessEnv> {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!/^(VITEST|TEST$|NODE_ENV$|DATABASE_URL$|IDEMQ_)/.test(name)) env[name] = value;
  }
  env.NO_COLOR = "1";
  env.IDEMQ_DATA_DIR = join(await mkdtemp(join(dataDirs, "data-")), "pg");
  if (databaseUrl !== undefined) env.DATABASE_URL = databaseUrl;
  return env;
}

function run(command: string, args: readonly string[], env: NodeJS.ProcessEnv, input?: string): Promise<Outcome> {
  return new Promise((resolveRun) => {
    const child = execFile(
      command,
      args,
      { cwd: ROOT, env, timeout: BLOCK_TIMEOUT_MS - 10_000, maxBuffer: 64 * 1024 * 1024 },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === "number" ? error.code : null;
        resolveRun({ code, stdout, stderr });
      },
    );
    if (input !== undefined) child.stdin?.end(input);
  });
}

const HARNESS = `// Runs one README block: imports it, and ends the process once its top-level
// code has finished (a block may leave a worker or a pool running, as a
// program would until it is stopped).
import { pathToFileURL } from "node:url";
await import(pathToFileURL(process.argv[2]).href);
process.exit(0);
`;

function blockFile(block: Block, extension: string): string {
  const file = join(workDir, `readme-line-${block.line}.${extension}`);
  // `export {}` makes every block a module (top-level await, no shared globals).
  writeFileSync(file, extension === "ts" ? `${block.code}\nexport {};\n` : `${block.code}\n`);
  return file;
}

/** A shell block as it runs in this repository: `npx idemq` is its bin/idemq.js, node_modules/idemq/ its root (see the top). */
function inRepository(code: string): string {
  return code
    .replace(/(^|[\s;&|(])npx idemq(?=\s|$)/gm, "$1node bin/idemq.js")
    .replace(/(^|[\s="'])node_modules\/idemq\//gm, "$1");
}

async function runBlock(block: Block & { kind: Kind }, databaseUrl: string): Promise<Outcome> {
  const env = await readerEnv(databaseUrl);
  switch (block.kind) {
    case "sh":
      if (block.marker === RUNS_UNTIL_STOPPED) return runUntilStopped(inRepository(block.code), env);
      return run("bash", ["-e", "-o", "pipefail", "-c", inRepository(block.code)], env);
    case "ts": {
      const harness = join(workDir, "harness.mjs");
      if (!existsSync(harness)) writeFileSync(harness, HARNESS);
      return run(process.execPath, ["--import", "tsx", harness, blockFile(block, "ts")], env);
    }
    case "sql":
      return run("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", blockFile(block, "sql"), databaseUrl], env);
  }
}

/**
 * Runs a long-running block in a process group of its own; a block that ends
 * before RUNS_UNTIL_STOPPED_MS reports its own exit code (0 would be wrong: it
 * was meant to keep running, so that becomes 1), else the group gets SIGTERM
 * and the outcome is 0 if everything in it exits within STOP_GRACE_MS.
 */
function runUntilStopped(code: string, env: NodeJS.ProcessEnv): Promise<Outcome> {
  return new Promise((resolveRun) => {
    const child = spawn("bash", ["-e", "-o", "pipefail", "-c", code], { cwd: ROOT, env, detached: true });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    let stopped = false;
    const stop = setTimeout(() => {
      stopped = true;
      process.kill(-child.pid!, "SIGTERM");
      setTimeout(() => {
        try {
          process.kill(-child.pid!, "SIGKILL");
          stderr += `\n[readme test] still running ${STOP_GRACE_MS / 1000} s after SIGTERM: killed`;
        } catch {
          // the group is gone
        }
      }, STOP_GRACE_MS).unref();
    }, RUNS_UNTIL_STOPPED_MS);
    child.on("exit", (exitCode) => {
      clearTimeout(stop);
      if (!stopped) {
        resolveRun({ code: exitCode === 0 ? 1 : exitCode, stdout, stderr: `${stderr}\n[readme test] ended before it was stopped` });
        return;
      }
      // bash itself dies of the SIGTERM; what matters is that the whole group is gone in time.
      const deadline = Date.now() + STOP_GRACE_MS;
      const poll = (): void => {
        let alive = true;
        try {
          process.kill(-child.pid!, 0);
        } catch {
          alive = false;
        }
        if (!alive) resolveRun({ code: 0, stdout, stderr });
        else if (Date.now() > deadline) resolveRun({ code: null, stdout, stderr: `${stderr}\n[readme test] did not stop after SIGTERM` });
        else setTimeout(poll, 50);
      };
      poll();
    });
  });
}

interface Substitute {
  /** Why the block cannot run as written. */
  why: string;
  /** What runs instead; nothing when the block is covered elsewhere (say where in `why`). */
  run?: (databaseUrl: string) => Promise<void>;
}

/** The blocks marked `readme-test: substitute`, by their exact text. */
const SUBSTITUTES: Record<string, Substitute> = {
  [[
    "npm ci && npm start   # install, then run the demo on an embedded PostgreSQL",
    "npm test              # the test suite (DATABASE_URL, or an embedded PostgreSQL)",
  ].join("\n")]: {
    why:
      "`npm ci` would delete and reinstall node_modules under the running suite, and `npm test` is the suite " +
      "running this very test. So `npm start` runs as a new user's would, on an embedded server from a clean " +
      "state (no DATABASE_URL, an empty IDEMQ_DATA_DIR), with -- --json to read its verdict.",
    run: async () => {
      const env = await readerEnv(undefined);
      const { code, stdout, stderr } = await run("npm", ["start", "--", "--json"], env);
      expect(code, stderr).toBe(0);
      expect(stderr).toMatch(/first run: initdb/);
      // npm prints its own "> idemq@... start" lines first; the demo's JSON is the last line.
      const demo = JSON.parse(stdout.trim().split("\n").pop()!) as { ok: boolean; figures: { ok: boolean }[] };
      expect(demo.figures.filter((f) => !f.ok)).toEqual([]);
      expect(demo.ok).toBe(true);
    },
  },
};

describe("README.md", () => {
  it("has code blocks, each tagged with a language, and every marker is one this test knows", () => {
    expect(runnable.length).toBeGreaterThan(0);
    for (const block of blocks) {
      const where = `README.md:${block.line} (${block.heading})`;
      expect(block.lang, `${where}: tag the block (sh, ts, sql, or text for sample output)`).not.toBe("");
      if (block.kind === "other") expect(NOT_CODE.has(block.lang), `${where}: unknown block language ${block.lang}`).toBe(true);
      if (block.marker === undefined) continue;
      if (block.marker === "substitute") {
        expect(SUBSTITUTES[block.code], `${where}: marked substitute, but SUBSTITUTES has no entry for its text`).toBeDefined();
      } else if (block.marker === RUNS_UNTIL_STOPPED) {
        expect(block.kind, `${where}: only sh blocks run until stopped`).toBe("sh");
      } else {
        expect(block.marker, `${where}: unknown marker`).toBe("output of the previous block");
        expect(block.kind, `${where}: sample output goes in a text block`).toBe("text");
      }
    }
    // A substitute whose block is gone (or was edited) must go too.
    const marked = new Set(blocks.filter((b) => b.marker === "substitute").map((b) => b.code));
    expect(Object.keys(SUBSTITUTES).filter((code) => !marked.has(code))).toEqual([]);
  });

  it("speaks to a user who installed the package: its commands run `npx idemq`, not the repository's bin/idemq.js", () => {
    const shell = runnable.filter((b) => b.kind === "sh");
    const repositoryBin = shell.filter((b) => b.heading !== "Development" && /bin\/idemq\.js/.test(b.code));
    expect(repositoryBin.map((b) => `README.md:${b.line} (${b.heading})`)).toEqual([]);
    expect(shell.filter((b) => /(^|\s)npx idemq /m.test(b.code)).length).toBeGreaterThan(5);
    expect(inRepository("npx idemq migrate status\nnpx idemq jobs --json | jq . && npx idemq stats")).toBe(
      "node bin/idemq.js migrate status\nnode bin/idemq.js jobs --json | jq . && node bin/idemq.js stats",
    );
    expect(inRepository("npx idemq worker --tasks node_modules/idemq/examples/tasks.js")).toBe(
      "node bin/idemq.js worker --tasks examples/tasks.js",
    );
  });

  describe.each(runnable.map((block) => ({ ...block, name: `${block.heading}: ${block.kind} block at line ${block.line}` })))(
    "$name",
    (block) => {
      const db = useTestDatabase({ poolSize: 1 });

      it(
        block.marker === "substitute"
          ? "runs its substitute (see SUBSTITUTES)"
          : block.marker === RUNS_UNTIL_STOPPED
            ? `runs without error until stopped (SIGTERM after ${RUNS_UNTIL_STOPPED_MS / 1000} s)`
            : "runs without error",
        async () => {
          if (block.marker === "substitute") {
            const substitute = SUBSTITUTES[block.code]!;
            expect(substitute.why.length).toBeGreaterThan(20);
            await substitute.run?.(db.url);
            return;
          }
          const { code, stdout, stderr } = await runBlock(block, db.url);
          printed.set(block.line, stdout);
          expect(code, `README.md:${block.line} failed:\n${stderr.slice(-4000)}\n${stdout.slice(-2000)}`).toBe(0);
        },
        BLOCK_TIMEOUT_MS,
      );
    },
  );

  const samples = blocks.filter((b) => b.marker === "output of the previous block");
  it.each(samples.map((b) => ({ ...b, name: `${b.heading}: sample output at line ${b.line}` })))(
    "$name appears in what the block before it printed",
    (sample) => {
      const source = [...runnable].reverse().find((b) => b.line < sample.line)!;
      const output = printed.get(source.line);
      expect(output, `the block at line ${source.line} did not run`).toBeDefined();
      const squeeze = (s: string): string => s.replace(/[ \t]+/g, " ").trim();
      const lines = output!.split("\n").map(squeeze);
      for (const line of sample.code.split("\n").map(squeeze).filter((l) => l !== "" && l !== "...")) {
        // "..." within a line stands for what varies from run to run (a time, say).
        const pattern = new RegExp(`^${line.split("...").map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`);
        expect(lines.some((l) => pattern.test(l)), `README.md:${sample.line}: "${line}" is not in the output of line ${source.line}`).toBe(true);
      }
    },
  );

  it(
    "its TypeScript blocks type-check with the project's strict settings",
    async () => {
      const tsBlocks = runnable.filter((b) => b.kind === "ts");
      if (tsBlocks.length === 0) return;
      const files = tsBlocks.map((b) => blockFile(b, "ts"));
      const config = join(workDir, "tsconfig.json");
      writeFileSync(
        config,
        JSON.stringify({
          extends: relative(workDir, join(ROOT, "tsconfig.json")),
          // A snippet shows what a call returns without using every value; the unused-code checks are for the tree.
          compilerOptions: { noUnusedLocals: false, noUnusedParameters: false },
          include: [],
          files: files.map((f) => relative(workDir, f)),
        }),
      );
      const { code, stdout, stderr } = await run(
        process.execPath,
        [join(ROOT, "node_modules", "typescript", "bin", "tsc"), "--noEmit", "-p", config],
        process.env,
      );
      expect(code, `${stdout}${stderr}`).toBe(0);
    },
    BLOCK_TIMEOUT_MS,
  );
});
