// `idemq dev`: one embedded server for a directory, for the CLI and the app.
// Everything runs as a real subprocess in an app directory of its own (under
// the repository's git-ignored .data/, so the app's `import "idemq"` is this
// package, as an installed one would be), with the default data directory
// .idemq/pg and no DATABASE_URL: `idemq dev` prints the URL; CLI commands and
// an app's `new Client()` / `createWorker()` given no URL use that server and
// start none of their own; the port is kept from one run to the next; with no
// server running, the library says what to do.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { runCli } from "../helpers/cli.ts";
import { type CliProcess, killAll, startCli, startNode } from "../helpers/cli-spawn.ts";
import { alive, postmasterPidOf, readLockFile, stopLeftoverServer } from "../helpers/embedded-dir.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const HOLD = resolve(import.meta.dirname, "..", "fixtures", "cli", "hold-embedded.ts");
const START_TIMEOUT_MS = 120_000;
const URL_PATTERN = /^postgres:\/\/postgres:postgres@127\.0\.0\.1:(\d+)\/idemq$/;
/** The default data directory, as the CLI shows it from the app directory. */
const SHOWN = ".idemq/pg";

let app: string;
let dataDir: string;
/** No IDEMQ_DATA_DIR (the default, under the app), and startCli/runCli leave DATABASE_URL out. */
const env = { IDEMQ_DATA_DIR: "" };

// The app: what a developer's program does with no connection string.
const APP = `import { Client, createWorker } from "idemq";
const client = new Client();
const { jobId } = await client.enqueue("greet", { from: "app" });
const ran = [];
let workerServer;
const worker = createWorker({
  handleSignals: false,
  tasks: {
    greet: {
      transactional: true,
      run: async (_payload, ctx) => {
        const { rows } = await ctx.tx.query("SELECT current_setting('port') AS port, current_database() AS db");
        workerServer = rows[0];
        ran.push(ctx.job.id);
      },
    },
  },
});
await new Promise((resolve, reject) => {
  worker.on("job:success", () => { if (ran.length === Number(process.argv[2])) resolve(); });
  worker.start().catch(reject);
});
await worker.stop();
const jobs = (await client.listJobs({ task: "greet" })).map((job) => ({ id: job.id, state: job.state, payload: job.payload }));
console.log(JSON.stringify({ clientUrl: client.pool.options.connectionString, workerServer, jobId, ran: ran.sort(), jobs }));
await client.close();
`;

// Only where the library would connect: DATABASE_URL first, then the embedded server, else the error.
const WHERE = `import { Client, createWorker } from "idemq";
const tasks = { noop: async () => {} };
for (const make of [() => new Client().pool, () => createWorker({ tasks, handleSignals: false })]) {
  try {
    const made = make();
    console.log(made.options?.connectionString ?? "a worker");
    if (made.end) await made.end();
  } catch (error) {
    console.log(\`\${error.name}: \${error.message}\`);
  }
}
`;

beforeAll(async () => {
  mkdirSync(join(ROOT, ".data"), { recursive: true });
  app = await mkdtemp(join(ROOT, ".data", "dev-test-"));
  dataDir = join(app, ".idemq", "pg");
  writeFileSync(join(app, "app.mjs"), APP);
  writeFileSync(join(app, "where.mjs"), WHERE);
});
afterAll(async () => {
  killAll();
  await stopLeftoverServer(dataDir);
  await rm(app, { recursive: true, force: true });
});

async function startDev(extraEnv: Record<string, string> = {}): Promise<{ dev: CliProcess; url: string; port: number }> {
  const dev = startCli(["dev"], { env: { ...env, ...extraEnv }, cwd: app });
  const line = await dev.waitForLine((l) => l.startsWith("DATABASE_URL="), START_TIMEOUT_MS);
  const url = line.slice("DATABASE_URL=".length);
  expect(url).toMatch(URL_PATTERN);
  // Its stderr line comes through another pipe, maybe later.
  await waitFor(() => dev.stderr().includes("until Ctrl-C"), { what: `idemq dev's line on stderr, got: ${dev.stderr()}` });
  return { dev, url, port: Number(URL_PATTERN.exec(url)![1]) };
}

async function stopDev(dev: CliProcess, signal: NodeJS.Signals = "SIGINT"): Promise<string> {
  const server = postmasterPidOf(dataDir)!;
  dev.child.kill(signal);
  const { code, signal: killedBy, stdout, stderr } = await dev.exited;
  expect({ code, killedBy }).toEqual({ code: EXIT.OK, killedBy: null });
  expect(stdout.split("\n").filter((l) => l !== "")).toHaveLength(1);
  expect(alive(server)).toBe(false);
  expect(existsSync(`${dataDir}.lock`)).toBe(false);
  return stderr;
}

function runApp(script: string, args: string[] = [], extraEnv: Record<string, string> = {}) {
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((done) => {
    const child = startNode([script, ...args], { cwd: app, env: { ...env, ...extraEnv } });
    void child.exited.then(({ code, stdout, stderr }) => done({ code, stdout, stderr }));
  });
}

describe("idemq dev", () => {
  it("one server at the URL it prints: two CLI commands and an app's new Client() and createWorker() use it, and none starts its own", async () => {
    const { dev, url, port } = await startDev();
    const lock = readLockFile(dataDir)!;
    expect(lock).toMatchObject({ pid: dev.pid, command: "idemq dev", shared: true, url });
    const server = postmasterPidOf(dataDir)!;
    expect(lock.postmasterPid).toBe(server);
    expect(readFileSync(join(dataDir, "idemq.port"), "utf8")).toBe(`${port}\n`);
    expect(dev.stderr()).toMatch(
      new RegExp(
        `^idemq: starting embedded PostgreSQL 18 in \\.idemq/pg \\(first run: initdb\\) \\.\\.\\. ready in \\d+\\.\\d s \\(migrated: [^)]+\\)\\n` +
          `idemq: the embedded PostgreSQL in \\.idemq/pg runs at 127\\.0\\.0\\.1:${port} \\(database idemq\\) until Ctrl-C; ` +
          "idemq commands and new Client\\(\\) / createWorker\\(\\) in this directory use it when given no database URL\\n$",
      ),
    );

    // CLI command 1: enqueue (readable output, so it says whose server it used).
    const enqueued = await runCli(["enqueue", "greet", '{"from": "cli"}'], { env, cwd: app });
    expect(enqueued.code, enqueued.stderr).toBe(EXIT.OK);
    const using = `idemq: using the embedded PostgreSQL in ${SHOWN} of PID ${dev.pid} (idemq dev)\n`;
    expect(enqueued.stderr).toBe(using);
    const cliJob = /job (\d+)/.exec(enqueued.stdout)![1]!;

    // The app: its Client and its worker, given no URL, reach the same server and database.
    const ran = await runApp("app.mjs", ["2"]);
    expect(ran.stderr).toBe("");
    expect(ran.code).toBe(0);
    const seen = JSON.parse(ran.stdout) as {
      clientUrl: string;
      workerServer: { port: string; db: string };
      jobId: string;
      ran: string[];
      jobs: { id: string; state: string; payload: unknown }[];
    };
    expect(seen.clientUrl).toBe(url);
    expect(seen.workerServer).toEqual({ port: String(port), db: "idemq" });
    expect(seen.ran).toEqual([cliJob, seen.jobId].sort());

    // CLI command 2: jobs sees both jobs, run by the app's worker.
    const listed = await runCli(["jobs", "--json"], { env, cwd: app });
    expect(listed).toMatchObject({ code: EXIT.OK, stderr: "" });
    const cliJobs = (JSON.parse(listed.stdout) as { jobs: { id: string; task: string; state: string }[] }).jobs;
    expect(cliJobs.map((j) => [j.id, j.task, j.state]).sort()).toEqual(
      [
        [cliJob, "greet", "succeeded"],
        [seen.jobId, "greet", "succeeded"],
      ].sort(),
    );
    expect(seen.jobs.map((j) => j.id).sort()).toEqual(cliJobs.map((j) => j.id).sort());
    const readable = await runCli(["jobs"], { env, cwd: app });
    expect(readable).toMatchObject({ code: EXIT.OK, stderr: using });

    // No command started, restarted or re-locked a server: still dev's, as it was.
    expect(readLockFile(dataDir)).toEqual(lock);
    expect(postmasterPidOf(dataDir)).toBe(server);
    expect(alive(server)).toBe(true);
    expect(dev.child.exitCode).toBeNull();
    expect(dev.stdout()).toBe(`DATABASE_URL=${url}\n`);

    // DATABASE_URL still comes first, for the app as for the CLI.
    const elsewhere = "postgres://someone@db.invalid:5432/app";
    const where = await runApp("where.mjs", [], { DATABASE_URL: elsewhere });
    expect(where).toMatchObject({ code: 0, stderr: "", stdout: `${elsewhere}\na worker\n` });

    await stopDev(dev);
  });

  it("keeps its address: the next run listens on the same port; a port taken meanwhile gives a new one, said and recorded", async () => {
    const first = await startDev();
    await stopDev(first.dev, "SIGTERM");
    // With DATABASE_URL set in its shell, it still runs the embedded server, and warns that the shell's apps would not use it.
    const again = await startDev({ DATABASE_URL: "postgres://someone@db.invalid:5432/app" });
    expect(again.url).toBe(first.url);
    await waitFor(() => again.dev.stderr().includes("DATABASE_URL is set"), { what: "the DATABASE_URL line" });
    expect(again.dev.stderr().split("\n").at(-2)).toBe(
      "idemq: DATABASE_URL is set in this shell: commands and apps that see it use that database, not this one; unset it to use this one",
    );
    await stopDev(again.dev, "SIGHUP");

    const squatter = net.createServer();
    await new Promise<void>((done) => squatter.listen(first.port, "127.0.0.1", done));
    let movedTo: number;
    try {
      const moved = await startDev();
      movedTo = moved.port;
      expect(movedTo).not.toBe(first.port);
      expect(moved.dev.stderr()).toMatch(new RegExp(`\\.\\.\\. ready in \\d+\\.\\d s \\(port ${first.port} was taken: now ${movedTo}\\)\\n`));
      expect(readFileSync(join(dataDir, "idemq.port"), "utf8")).toBe(`${movedTo}\n`);
      await stopDev(moved.dev);
    } finally {
      await new Promise((done) => squatter.close(done));
    }
    // The new port is the one kept from now on, though the old one is free again.
    const kept = await startDev();
    expect(kept.port).toBe(movedTo);
    expect(kept.dev.stderr()).not.toContain("was taken");
    await stopDev(kept.dev);
  });

  it("with no server running and no DATABASE_URL, new Client() and createWorker() throw, saying what to do", async () => {
    expect(existsSync(`${dataDir}.lock`)).toBe(false);
    const where = await runApp("where.mjs");
    expect(where).toMatchObject({ code: 0, stderr: "" });
    const fix =
      `DATABASE_URL is not set, and no embedded PostgreSQL is running in ${dataDir}; set DATABASE_URL=postgres://..., ` +
      `or run \`npx idemq dev\` in ${app} (it starts the embedded PostgreSQL there and keeps it running)`;
    expect(where.stdout).toBe(
      `TypeError: new Client() needs { connectionString }, { pool } or a pg.Pool: ${fix}\n` +
        `WorkerConfigError: createWorker needs { connectionString } or { pool }: ${fix}\n`,
    );
  });

  it("refuses to share another process's server (it could not keep it running): one line naming that process", async () => {
    const holder = startNode(["--import", "tsx", HOLD, "shared"], { env, cwd: app });
    const ready = await holder.waitForLine((line) => line.startsWith("READY "), START_TIMEOUT_MS);
    const result = await runCli(["dev"], { env, cwd: app });
    expect(result).toMatchObject({ code: EXIT.FAILURE, stdout: "" });
    expect(result.stderr).toBe(
      `idemq: the embedded PostgreSQL in ${SHOWN} already runs, in PID ${holder.pid} (hold-embedded.ts shared), ` +
        `at ${ready.slice("READY ".length)}: use it while that process runs, or stop it and run this command again\n`,
    );
    expect(readLockFile(dataDir)?.pid).toBe(holder.pid);
    holder.child.kill("SIGTERM");
    expect((await holder.exited).code).toBe(143);
  });

  it("a server killed under it: one line saying so, exit 1", async () => {
    const { dev } = await startDev();
    const server = postmasterPidOf(dataDir)!;
    process.kill(server, "SIGKILL");
    const { code, stderr } = await dev.exited;
    expect(code).toBe(EXIT.FAILURE);
    expect(stderr.split("\n").at(-2)).toBe(`idemq: the embedded PostgreSQL (PID ${server}) stopped on its own; run \`idemq dev\` again`);
  });
});
