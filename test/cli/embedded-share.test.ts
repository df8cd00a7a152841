// The embedded default everywhere: `migrate` and `migrate status` without a
// URL; one embedded server per directory, shared by a long-running command (a
// worker) with every other CLI command run meanwhile, waited for when it is a
// short command or still starting; a borrower told in one line when the server
// it used stopped; the data directory .idemq/pg under the current directory.
// Every CLI runs as a real subprocess without DATABASE_URL, each test in a data
// directory of its own; only the 60 s wait bound is tested in this process, on
// claimDataDir with a shorter bound.
import { existsSync, readdirSync, renameSync, writeFileSync } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { claimDataDir } from "../../src/embedded/share.ts";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { DEFAULT_MIGRATIONS_DIR } from "../../src/migrate.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { runCli } from "../helpers/cli.ts";
import { type CliProcess, killAll, startCli, startNode } from "../helpers/cli-spawn.ts";
import { alive, postmasterPidOf, readLockFile, stopLeftoverServer } from "../helpers/embedded-dir.ts";

const HOLD = resolve(import.meta.dirname, "..", "fixtures", "cli", "hold-embedded.ts");
const TASKS = resolve(import.meta.dirname, "..", "fixtures", "worker", "noop-tasks.ts");
const START_TIMEOUT_MS = 120_000;
/** Every migration in sql/migrations, in order: what a fresh database has pending. */
const MIGRATIONS = readdirSync(DEFAULT_MIGRATIONS_DIR)
  .filter((file) => file.endsWith(".sql") && !file.startsWith("."))
  .map((file) => file.slice(0, -".sql".length))
  .sort();

let root: string;
const dataDirs: string[] = [];

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "idemq-cli-share-"));
});
afterAll(async () => {
  killAll();
  for (const dir of dataDirs) await stopLeftoverServer(dir);
  await rm(root, { recursive: true, force: true });
});

/** A data directory of its own (not created yet) and the environment that points the CLI at it. */
function freshDataDir(name: string): { dataDir: string; env: Record<string, string> } {
  const dataDir = join(root, name, "pg");
  dataDirs.push(dataDir);
  return { dataDir, env: { IDEMQ_DATA_DIR: dataDir } };
}

const URL_PATTERN = /^postgres:\/\/postgres:postgres@127\.0\.0\.1:\d+\/idemq$/;
const READY = String.raw`ready in \d+\.\d s`;

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

interface Event {
  event: string;
  jobId?: string;
  databaseUrl?: string;
  dataDir?: string;
}

function events(proc: CliProcess): Event[] {
  return proc
    .stdout()
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as Event);
}

async function startWorker(env: Record<string, string>, logFormat: "json" | "pretty" = "json"): Promise<CliProcess> {
  const worker = startCli(["worker", "--tasks", TASKS, "--log-format", logFormat], { env });
  await worker.waitForLine((line) => line.includes("worker:started"), START_TIMEOUT_MS);
  return worker;
}

async function stillAnswers(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => {});
  try {
    await client.connect();
    await client.query("SELECT 1");
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

describe("migrate without a URL: the embedded database idemq", () => {
  it("migrate on a cold data directory applies every migration; then status is up to date and migrate a no-op", async () => {
    const { dataDir, env } = freshDataDir("migrate-cold");
    const first = await runCli(["migrate", "--json"], { env, timeoutMs: START_TIMEOUT_MS });
    expect(first).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(first.stdout)).toEqual({ applied: MIGRATIONS });
    expect(existsSync(join(dataDir, "PG_VERSION"))).toBe(true);
    expect(existsSync(join(dataDir, "postmaster.pid"))).toBe(false);
    expect(existsSync(`${dataDir}.lock`)).toBe(false);

    const status = await runCli(["migrate", "status", "--json"], { env });
    expect(status).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(status.stdout)).toEqual({ applied: MIGRATIONS, pending: [] });

    // Opening the database does not migrate it (migrate reports what it applied), so the progress line names none.
    const again = await runCli(["migrate"], { env });
    expect(again).toMatchObject({ code: EXIT.OK, stdout: "No pending migrations.\n" });
    expect(again.stderr).toMatch(new RegExp(`^idemq: starting embedded PostgreSQL 18 in ${escape(dataDir)} \\.\\.\\. ${READY}\\n$`));
  });

  it("migrate status on a cold data directory lists every migration as pending and applies none", async () => {
    const { dataDir, env } = freshDataDir("status-cold");
    const cold = await runCli(["migrate", "status"], { env, timeoutMs: START_TIMEOUT_MS });
    expect(cold.code, cold.stderr).toBe(EXIT.OK);
    expect(cold.stdout).toBe([...MIGRATIONS.map((name) => `pending  ${name}`), `${MIGRATIONS.length} pending.`, ""].join("\n"));
    expect(cold.stderr).toMatch(
      new RegExp(`^idemq: starting embedded PostgreSQL 18 in ${escape(dataDir)} \\(first run: initdb\\) \\.\\.\\. ${READY}\\n$`),
    );

    const warm = await runCli(["migrate", "status", "--json"], { env });
    expect(warm).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(warm.stdout)).toEqual({ applied: [], pending: MIGRATIONS });

    const applied = await runCli(["migrate"], { env });
    expect(applied).toMatchObject({ code: EXIT.OK, stdout: MIGRATIONS.map((name) => `Applied ${name}\n`).join("") });
    const after = await runCli(["migrate", "status"], { env });
    expect(after).toMatchObject({
      code: EXIT.OK,
      stdout: [...MIGRATIONS.map((name) => `applied  ${name}`), "Up to date.", ""].join("\n"),
    });
  });

  it("migrate sql without a URL: exit 2, one line saying why, and no server started", async () => {
    const { dataDir, env } = freshDataDir("sql");
    const result = await runCli(["migrate", "sql"], { env });
    expect(result).toMatchObject({ code: EXIT.USAGE, stdout: "" });
    expect(result.stderr).toBe(
      "idemq: migrate sql writes a script for a DBA to apply to their own server: pass that server with " +
        "--database-url <url> or DATABASE_URL (`idemq migrate` migrates the embedded one)\n",
    );
    expect(existsSync(dataDir)).toBe(false);
  });
});

describe("one embedded server per directory, shared by a worker", () => {
  it("enqueue, jobs and migrate status from other processes use the worker's server; the worker runs the job, undisturbed", async () => {
    const { dataDir, env } = freshDataDir("shared");
    const worker = await startWorker(env);
    const started = events(worker).find((e) => e.event === "worker:started")!;
    const lock = readLockFile(dataDir)!;
    expect(lock).toMatchObject({ pid: worker.pid, shared: true, url: started.databaseUrl });
    const server = postmasterPidOf(dataDir)!;
    expect(lock.postmasterPid).toBe(server);

    const enqueued = await runCli(["enqueue", "noop", '{"from": "another process"}', "--json"], { env });
    expect(enqueued).toMatchObject({ code: EXIT.OK, stderr: "" });
    const { jobId } = JSON.parse(enqueued.stdout) as { jobId: string };
    await worker.waitForLine((line) => line.includes('"job:success"') && line.includes(`"jobId":"${jobId}"`));

    const listed = await runCli(["jobs", "--json"], { env });
    expect(listed).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(listed.stdout).jobs).toMatchObject([{ id: jobId, task: "noop", state: "succeeded" }]);
    // Readable output says whose server it used.
    const shown = await runCli(["jobs", "show", jobId], { env });
    expect(shown.code).toBe(EXIT.OK);
    expect(shown.stderr).toBe(`idemq: using the embedded PostgreSQL in ${dataDir} of PID ${worker.pid} (${lock.command})\n`);
    const status = await runCli(["migrate", "status", "--json"], { env });
    expect(status).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(status.stdout)).toEqual({ applied: MIGRATIONS, pending: [] });

    // Nothing they did stopped, restarted or re-locked the worker's server.
    expect(worker.child.exitCode).toBeNull();
    expect(readLockFile(dataDir)).toEqual(lock);
    expect(postmasterPidOf(dataDir)).toBe(server);
    expect(alive(server)).toBe(true);
    expect(events(worker).map((e) => e.event)).toEqual(["worker:started", "job:start", "job:success"]);

    worker.child.kill("SIGTERM");
    expect(await worker.exited).toMatchObject({ code: EXIT.OK, signal: null, stderr: "" });
    expect(alive(server)).toBe(false);
    expect(existsSync(`${dataDir}.lock`)).toBe(false);
  });

  it("the worker prints the URL it serves: on stderr in pretty mode, as databaseUrl of worker:started in JSON", async () => {
    const { dataDir, env } = freshDataDir("url");
    const pretty = await startWorker(env, "pretty");
    const url = readLockFile(dataDir)!.url!;
    expect(url).toMatch(URL_PATTERN);
    await waitFor(() => pretty.stderr().includes(" at postgres://"), { what: "the URL line" });
    expect(pretty.stderr()).toMatch(
      new RegExp(
        `^idemq: starting embedded PostgreSQL 18 in ${escape(dataDir)} \\(first run: initdb\\) \\.\\.\\. ${READY} \\(migrated: ${MIGRATIONS.join(", ")}\\)\\n` +
          `idemq: the worker serves the embedded PostgreSQL in ${escape(dataDir)} at ${escape(url)} \\(other idemq commands here use it\\)\\n$`,
      ),
    );
    expect(await stillAnswers(url)).toBe(true);
    pretty.child.kill("SIGTERM");
    expect((await pretty.exited).code).toBe(EXIT.OK);

    const json = await startWorker(env, "json");
    const started = events(json)[0]!;
    expect(started).toMatchObject({ event: "worker:started", databaseUrl: readLockFile(dataDir)!.url, dataDir });
    expect(started.databaseUrl).toMatch(URL_PATTERN);
    expect(json.stderr()).toBe("");
    json.child.kill("SIGTERM");
    expect((await json.exited).code).toBe(EXIT.OK);
  });

  it("when the worker stops, the commands using its server end with one line saying so; the next one starts the server itself", async () => {
    const { dataDir, env } = freshDataDir("holder-exits");
    const holder = await startWorker(env);
    const lock = readLockFile(dataDir)!;
    const borrowedWorker = await startWorker(env);
    expect(events(borrowedWorker)[0]).toMatchObject({ event: "worker:started", databaseUrl: lock.url });
    const watching = startCli(["stats", "--watch", "0.2", "--json"], { env });
    await watching.waitForLine((line) => line.startsWith("{"));

    holder.child.kill("SIGTERM");
    expect((await holder.exited).code).toBe(EXIT.OK);
    const lost =
      `idemq: the embedded PostgreSQL in ${dataDir}, run by PID ${holder.pid} (${lock.command}), ` +
      "stopped while this command was using it; run the command again\n";
    for (const borrower of [borrowedWorker, watching]) {
      const { code, signal, stderr } = await borrower.exited;
      expect({ code, signal, stderr }).toEqual({ code: EXIT.FAILURE, signal: null, stderr: lost });
    }

    const next = await runCli(["stats"], { env });
    expect(next).toMatchObject({ code: EXIT.OK, stdout: "No jobs yet.\n" });
    expect(next.stderr).toMatch(new RegExp(`^idemq: starting embedded PostgreSQL 18 in ${escape(dataDir)} \\.\\.\\. ${READY}\\n$`));
  });

  it("a worker killed with SIGKILL: the next command takes the directory over instead of using the leftover server", async () => {
    const { dataDir, env } = freshDataDir("holder-killed");
    const holder = await startWorker(env);
    const lock = readLockFile(dataDir)!;
    const borrower = await startWorker(env);
    holder.child.kill("SIGKILL");
    await holder.exited;
    // The server outlives the worker and still answers; its lock still says shared.
    expect(readLockFile(dataDir)).toEqual(lock);
    expect(await stillAnswers(lock.url!)).toBe(true);

    const next = await runCli(["stats"], { env, timeoutMs: START_TIMEOUT_MS });
    expect(next).toMatchObject({ code: EXIT.OK, stdout: "No jobs yet.\n" });
    expect(next.stderr).toMatch(new RegExp(`^idemq: starting embedded PostgreSQL 18 in ${escape(dataDir)} \\.\\.\\. ${READY}\\n$`));
    expect(alive(lock.postmasterPid!)).toBe(false);
    const { code, stderr } = await borrower.exited;
    expect({ code, stderr }).toEqual({
      code: EXIT.FAILURE,
      stderr:
        `idemq: the embedded PostgreSQL in ${dataDir}, run by PID ${holder.pid} (${lock.command}), ` +
        "stopped while this command was using it; run the command again\n",
    });
  });
});

describe("waiting for the holder", () => {
  it("a holder that does not share its server (a short command) is waited for; then the server is started anew", async () => {
    const { dataDir, env } = freshDataDir("wait-short");
    const holder = startNode(["--import", "tsx", HOLD, "plain"], { env });
    await holder.waitForLine((line) => line.startsWith("READY "), START_TIMEOUT_MS);
    const waiting = startCli(["stats"], { env });
    const line = `idemq: the embedded PostgreSQL in ${dataDir} is in use by PID ${holder.pid} (hold-embedded.ts plain); waiting to finish with it ...`;
    await waitFor(() => waiting.stderr() === line, { what: `the waiting line, got: ${waiting.stderr()}` });
    expect(waiting.child.exitCode).toBeNull();

    holder.child.kill("SIGTERM");
    expect((await holder.exited).code).toBe(143);
    const { code, stdout, stderr } = await waiting.exited;
    expect({ code, stdout }).toEqual({ code: EXIT.OK, stdout: "No jobs yet.\n" });
    expect(stderr).toMatch(
      new RegExp(`^${escape(line)} released\\nidemq: starting embedded PostgreSQL 18 in ${escape(dataDir)} \\.\\.\\. ${READY}\\n$`),
    );
  });

  it("a sharing holder still starting (no URL in its lock yet) is waited for, then its server is used", async () => {
    const { dataDir, env } = freshDataDir("wait-starting");
    const holder = startNode(["--import", "tsx", HOLD, "shared"], { env });
    await holder.waitForLine((line) => line.startsWith("READY "), START_TIMEOUT_MS);
    const lock = readLockFile(dataDir)!;
    expect(lock).toMatchObject({ pid: holder.pid, shared: true, url: expect.stringMatching(URL_PATTERN) });
    // The lock as it is between the server's start and the database being ready.
    const rewrite = (content: object): void => {
      writeFileSync(`${dataDir}.lock.test`, JSON.stringify(content));
      renameSync(`${dataDir}.lock.test`, `${dataDir}.lock`);
    };
    const { url, ...starting } = lock;
    rewrite(starting);

    const waiting = startCli(["stats"], { env });
    const line = `idemq: the embedded PostgreSQL in ${dataDir} is in use by PID ${holder.pid} (hold-embedded.ts shared); waiting to have its server ready ...`;
    await waitFor(() => waiting.stderr() === line, { what: `the waiting line, got: ${waiting.stderr()}` });
    rewrite(lock);
    const { code, stdout, stderr } = await waiting.exited;
    expect({ code, stdout }).toEqual({ code: EXIT.OK, stdout: "No jobs yet.\n" });
    expect(stderr).toBe(`${line} ready\nidemq: using the embedded PostgreSQL in ${dataDir} of PID ${holder.pid} (hold-embedded.ts shared)\n`);
    expect(alive(lock.postmasterPid!)).toBe(true);

    holder.child.kill("SIGTERM");
    expect((await holder.exited).code).toBe(143);
    expect(alive(lock.postmasterPid!)).toBe(false);
  });

  it("gives up after the wait bound (60 s in the CLI) with one line naming the holder and the URL to pass instead", async () => {
    const { dataDir, env } = freshDataDir("wait-bound");
    const holder = startNode(["--import", "tsx", HOLD, "plain"], { env });
    const ready = await holder.waitForLine((line) => line.startsWith("READY "), START_TIMEOUT_MS);
    const lines: string[] = [];
    const progress = { start: (text: string) => lines.push(text), end: (text: string) => lines.push(text) };
    await expect(claimDataDir(dataDir, "the/dir", { share: false, progress, waitMs: 300 })).rejects.toThrow(
      new Error(
        `the data directory the/dir is in use by PID ${holder.pid} (an idemq process: hold-embedded.ts plain), ` +
          `still after 0.3 s; stop it or pass --database-url ${ready.slice("READY ".length)}`,
      ),
    );
    expect(lines).toEqual([
      `idemq: the embedded PostgreSQL in the/dir is in use by PID ${holder.pid} (hold-embedded.ts plain); waiting to finish with it ...`,
      "gave up",
    ]);
    expect(readLockFile(dataDir)?.pid).toBe(holder.pid);
    holder.child.kill("SIGTERM");
    expect((await holder.exited).code).toBe(143);
  });
});

describe("the data directory", () => {
  it("defaults to .idemq/pg under the current directory (lock .idemq/pg.lock); a relative IDEMQ_DATA_DIR is under it too", async () => {
    const cwd = join(root, "app");
    await mkdir(cwd);
    dataDirs.push(join(cwd, ".idemq", "pg"), join(cwd, "data", "pg"));
    const env = { IDEMQ_DATA_DIR: "" };
    const watching = startCli(["stats", "--watch", "0.2"], { env, cwd });
    await watching.waitForLine((line) => line.startsWith("idemq stats at"), START_TIMEOUT_MS);
    expect(readLockFile(join(cwd, ".idemq", "pg"))).toMatchObject({ pid: watching.pid, shared: true });
    expect(existsSync(join(cwd, ".idemq", "pg", "PG_VERSION"))).toBe(true);
    expect(watching.stderr()).toMatch(new RegExp(`^idemq: starting embedded PostgreSQL 18 in \\.idemq/pg \\(first run: initdb\\) \\.\\.\\. ${READY}`));
    watching.child.kill("SIGINT");
    expect((await watching.exited).code).toBe(EXIT.OK);
    expect(existsSync(join(cwd, ".idemq", "pg.lock"))).toBe(false);

    const relative = await runCli(["stats"], { env: { IDEMQ_DATA_DIR: "data/pg" }, cwd, timeoutMs: START_TIMEOUT_MS });
    expect(relative.code, relative.stderr).toBe(EXIT.OK);
    expect(relative.stderr).toMatch(/^idemq: starting embedded PostgreSQL 18 in data\/pg \(first run: initdb\)/);
    expect(existsSync(join(cwd, "data", "pg", "PG_VERSION"))).toBe(true);
  });

  it("is named in --help: the global help, dev, worker, demo, migrate and migrate status", async () => {
    for (const args of [[], ["dev"], ["worker"], ["demo"], ["migrate"], ["migrate", "status"]]) {
      const help = await runCli([...args, "--help"]);
      expect(help, args.join(" ")).toMatchObject({ code: EXIT.OK, stderr: "" });
      expect(help.stdout, args.join(" ")).toMatch(/\.idemq\/pg under the current\s+directory/);
      expect(help.stdout, args.join(" ")).toContain("IDEMQ_DATA_DIR");
    }
  });
});
