// `idemq worker` as a real subprocess: a tasks module is checked before the
// worker starts, and each mistake is one line on stderr (exit 2); a module
// exporting its tasks as the default export runs; --log-format pretty prints
// a readable log.
import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { Client } from "../../src/index.ts";
import { CLI, runCli } from "../helpers/cli.ts";
import { startNode } from "../helpers/cli-spawn.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { killAllWorkers, startedWorker, startWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 2 });
let client: Client;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterEach(async () => {
  await killAllWorkers();
});

const fixture = (name: string) => resolve(import.meta.dirname, "..", "fixtures", "worker", name);

async function worker(args: string[]) {
  return runCli(["worker", "--database-url", db.url, ...args]);
}

function oneLine(stderr: string): string {
  const lines = stderr.trimEnd().split("\n");
  expect(lines, stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^idemq: /);
  return lines[0]!;
}

describe("idemq worker refuses a bad tasks module with one line", () => {
  it("a module without a tasks export: exit 2", async () => {
    const result = await worker(["--tasks", fixture("cli-no-tasks.ts")]);
    expect(result.code).toBe(2);
    expect(oneLine(result.stderr)).toContain("cli-no-tasks.ts exports no tasks: add `export const tasks = {");
    expect(result.stdout).toBe("");
  });

  it("a task that is a number: exit 2, naming the task", async () => {
    const result = await worker(["--tasks", fixture("cli-number-task.ts")]);
    expect(result.code).toBe(2);
    expect(oneLine(result.stderr)).toContain('task "send_invoice" is not a function or { run }: got number 42');
  });

  it("a task object without run: exit 2", async () => {
    const result = await worker(["--tasks", fixture("cli-object-task.ts")]);
    expect(result.code).toBe(2);
    expect(oneLine(result.stderr)).toContain('task "send_invoice" is not a function or { run }: got an object without a run function');
  });

  it("a task option of the wrong kind: exit 2, naming the task and the option", async () => {
    const result = await worker(["--tasks", fixture("cli-bad-option.ts")]);
    expect(result.code).toBe(2);
    expect(oneLine(result.stderr)).toContain('task "send_invoice": fixed backoff needs at least one delay');
  });

  it("schedules exported and in workerOptions too, or a schedule with an unknown option: exit 2, nothing saved", async () => {
    const twice = await worker(["--tasks", fixture("cli-bad-schedules.ts")]);
    expect(twice.code).toBe(2);
    expect(oneLine(twice.stderr)).toMatch(/cli-bad-schedules\.ts: exports schedules and workerOptions\.schedules; keep one of them$/);
    const misspelt = await runCli(["worker", "--database-url", db.url, "--tasks", fixture("cli-bad-schedules.ts")], {
      env: { IDEMQ_TEST_SCHEDULES_SHAPE: "option" },
    });
    expect(misspelt.code).toBe(2);
    expect(oneLine(misspelt.stderr)).toContain('cli-bad-schedules.ts: schedules[0]: schedule "nightly": unknown option "timeZone"');
    expect((await db.pool.query("SELECT count(*)::int AS n FROM idemq.schedules")).rows[0].n).toBe(0);
  });

  it("a file that does not exist: exit 2", async () => {
    const result = await worker(["--tasks", "./no/such/tasks.js"]);
    expect(result.code).toBe(2);
    expect(oneLine(result.stderr)).toBe("idemq: --tasks ./no/such/tasks.js: no such file");
  });

  it("a TypeScript module and no tsx to load it: exit 2 (a configuration error), one line saying how to get it", async () => {
    const dir = await mkdtemp(join(tmpdir(), "idemq-worker-no-tsx-"));
    try {
      await writeFile(join(dir, "tasks.ts"), "export const tasks = { noop: async (_payload: unknown) => {} };\n");
      // From a directory with no node_modules, with tsx hidden from idemq's own resolution.
      const child = startNode(["--import", resolve(import.meta.dirname, "..", "fixtures", "cli", "no-tsx.mjs"), CLI, "worker", "--tasks", "tasks.ts"], {
        cwd: dir,
        env: { DATABASE_URL: db.url },
      });
      const result = await child.exited;
      if ((process.features as { typescript?: unknown }).typescript) {
        // Node 22.18+ strips types itself: the module loads without tsx, so there is nothing to refuse.
        expect(result.stderr).not.toContain("needs tsx");
      } else {
        expect(result.code, result.stderr).toBe(EXIT.USAGE);
        expect(oneLine(result.stderr)).toBe(
          "idemq: cannot load tasks.ts: a TypeScript tasks module needs tsx: install it with `npm install --save-dev tsx`, or compile the module to JavaScript",
        );
        expect(result.stdout).toBe("");
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("a module that throws while loading: exit 1 with its message", async () => {
    const result = await worker(["--tasks", fixture("cli-throws-on-load.js")]);
    expect(result.code).toBe(1);
    expect(oneLine(result.stderr)).toMatch(/cannot load .*cli-throws-on-load\.js: cannot read config\.json$/);
  });

  it("no --tasks or a bad --concurrency: usage errors (exit 2)", async () => {
    const noTasks = await worker([]);
    expect(noTasks.code).toBe(2);
    expect(noTasks.stderr).toContain("required option '--tasks <module>' not specified");
    const zero = await worker(["--tasks", fixture("noop-tasks.ts"), "--concurrency", "0"]);
    expect(zero.code).toBe(2);
    expect(zero.stderr).toContain("must be an integer from 1 to 1000");
  });

  it("--wake-up is listen or poll and --listen-url goes only with listen (else exit 2); --help shows both", async () => {
    const unknown = await worker(["--tasks", fixture("noop-tasks.ts"), "--wake-up", "notify"]);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/--wake-up <mode>.*Allowed choices are listen, poll/);
    const both = await worker(["--tasks", fixture("noop-tasks.ts"), "--wake-up", "poll", "--listen-url", db.url]);
    expect(both.code).toBe(2);
    expect(oneLine(both.stderr)).toBe("idemq: --listen-url is for --wake-up listen: a worker in poll mode holds no LISTEN connection");
    const help = await runCli(["worker", "--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/--wake-up <mode> +how the worker learns of new jobs/);
    expect(help.stdout).toMatch(/--listen-url <url> +listen mode: LISTEN and the wait marker/);
    expect(help.stdout).toContain("Behind a transaction-pooling PgBouncer");
  });

  it("no database given: runs on the embedded PostgreSQL, and SIGTERM stops it with exit 0", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "idemq-worker-embedded-"));
    try {
      const child = spawn(process.execPath, [CLI, "worker", "--tasks", fixture("noop-tasks.ts"), "--log-format", "json"], {
        env: { ...process.env, DATABASE_URL: "", NO_COLOR: "1", IDEMQ_DATA_DIR: join(dataDir, "pg") },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
      child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
      const exited = new Promise<number | null>((done) => child.on("exit", (code) => done(code)));
      const deadline = Date.now() + 60_000;
      while (!stdout.includes('"worker:started"')) {
        if (Date.now() > deadline || child.exitCode !== null) throw new Error(`worker did not start:\n${stderr}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      child.kill("SIGTERM");
      expect(await exited, stderr).toBe(0);
      expect(stdout).toContain('"worker:stopped"');
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });

  it("an unreachable database with --wait-for-database 0: exit 1, one line (by default the worker waits; test/worker/server-restart.test.ts)", async () => {
    const result = await runCli([
      "worker",
      "--tasks",
      fixture("noop-tasks.ts"),
      "--database-url",
      "postgres://postgres@127.0.0.1:1/none",
      "--wait-for-database",
      "0",
    ]);
    expect(result.stderr.trimEnd().split("\n")).toHaveLength(1);
    expect(result.code).toBe(1);
    expect(oneLine(result.stderr)).toContain("cannot connect to the database");
  });
});

describe("idemq worker runs a module", () => {
  it("with tasks and workerOptions as its default export, printing JSON event lines; SIGTERM exits 0", async () => {
    const proc = await startedWorker({ tasks: "cli-default-export.ts", databaseUrl: db.url, args: ["--queues", "cli-default"] });
    const { jobId } = await client.enqueue("ping", {}, { queue: "cli-default" });
    const success = await proc.waitForEvent((e) => e.event === "job:success" && e.jobId === jobId, "job:success");
    expect(success).toMatchObject({ task: "ping", queue: "cli-default", attempt: 1 });
    expect(typeof success.durationMs).toBe("number");
    expect(Number.isNaN(Date.parse(success.time))).toBe(false);
    expect(await client.getJob(jobId)).toMatchObject({ state: "succeeded", result: "pong" });
    proc.child.kill("SIGTERM");
    expect(await proc.exited).toEqual({ code: 0, signal: null });
    expect(proc.events.map((e) => e.event)).toEqual(["worker:started", "job:start", "job:success", "log", "worker:stopped"]);
  });

  it("--log-format pretty prints one readable line per event", async () => {
    const proc = startWorker({ tasks: "noop-tasks.ts", databaseUrl: db.url, args: ["--queues", "cli-pretty"], logFormat: "pretty" });
    await waitFor(() => proc.stdout().includes("worker:started"), { what: "the worker to start" });
    const { jobId } = await client.enqueue("noop", {}, { queue: "cli-pretty" });
    await waitFor(() => proc.stdout().includes(`job:success noop#${jobId}`), { what: "the success line" });
    proc.child.kill("SIGINT");
    expect(await proc.exited).toEqual({ code: 0, signal: null });
    const lines = proc.stdout().trimEnd().split("\n");
    expect(lines.find((l) => l.includes("job:start"))).toMatch(new RegExp(`^\\d\\d:\\d\\d:\\d\\d\\.\\d{3} job:start noop#${jobId} attempt 1$`));
    expect(lines.find((l) => l.includes("job:success"))).toMatch(
      new RegExp(`^\\d\\d:\\d\\d:\\d\\d\\.\\d{3} job:success noop#${jobId} attempt 1 \\(\\d+\\.\\d ms\\)$`),
    );
    expect(lines.some((l) => / info +SIGINT: stopping/.test(l))).toBe(true);
  });
});
