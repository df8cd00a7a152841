// `idemq demo` (npm start) as a real subprocess: it is the end-to-end check of
// the whole system, so its figures are asserted here one by one (not only its
// own verdict), on the test server and on the embedded server from a clean
// state; and a demo killed with SIGKILL must leave a data directory the next
// demo recovers.
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { CLI, runCli } from "../helpers/cli.ts";
import { badKeys } from "../helpers/json-keys.ts";
import { Progress } from "../../src/demo/progress.ts";
import { summaryTable } from "../../src/demo/summary-table.ts";
import { databaseUrl } from "../../src/embedded/server.ts";
import { serverUrl } from "../helpers/db.ts";
import { alive } from "../helpers/embedded-dir.ts";

const DEMO_TIMEOUT_MS = 240_000;
const FIGURES = 35;

interface Figure {
  scenario: string;
  name: string;
  expected: unknown;
  observed: unknown;
  ok: boolean;
}

/** The parts of `idemq demo --json` asserted here. */
interface DemoJson {
  ok: boolean;
  seconds: number;
  database: { name: string; kept: boolean; embedded: boolean };
  guard: {
    guarded: Record<string, number>;
    unguarded: Record<string, number>;
  };
  email: {
    crashedJob: { state: string; attempts: number; errors: { attempt: number; class: string }[] };
    provider: { requests: number; replays: number; delivered: number };
    inbox: { customer: string; emails: number }[];
    killedWorker: { signal: string };
  };
  retries: {
    acme: { state: string; attempts: number; errors: string[]; timeline: { attempt: number; waitedMs?: number }[] };
    globex: { state: string; attempts: number; errors: string[] };
  };
  policies: {
    deduplicated: { firstJobId: string; secondJobId: string; deduplicated: boolean };
    rejectedAfterSuccess: { code: string; existingJobId: string; existingState: string; policy: string } | null;
    newJobAfterFailure: { failedJobId: string; newJobId: string; state: string };
    keyReuse: { code: string; existingJobId: string } | null;
  };
  figures: Figure[];
}

const tempDirs: string[] = [];
async function tempDataDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "idemq-demo-test-"));
  tempDirs.push(dir);
  return join(dir, "pg");
}

/** The server a killed process left running in `dataDir`, if any. */
function postmasterPid(dataDir: string): number | undefined {
  try {
    const pid = Number.parseInt(readFileSync(join(dataDir, "postmaster.pid"), "utf8").split("\n")[0]!, 10);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

async function waitUntil(check: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

afterAll(async () => {
  for (const dir of tempDirs) {
    // A failed test may leave a server running in its data directory: stop exactly that one.
    const pid = postmasterPid(join(dir, "pg"));
    if (pid !== undefined && alive(pid)) process.kill(pid, "SIGINT");
    await waitUntil(() => pid === undefined || !alive(pid), `server ${pid} stopped`).catch(() => {});
    await rm(dir, { recursive: true, force: true });
  }
});

function parseDemoJson(stdout: string): DemoJson {
  const lines = stdout.trim().split("\n");
  expect(lines, "stdout is one JSON line").toHaveLength(1);
  const parsed: unknown = JSON.parse(lines[0]!);
  expect(badKeys(parsed), "camelCase keys, as every command's --json").toEqual([]);
  return parsed as DemoJson;
}

/** Asserts every figure the demo promises, from the numbers themselves. */
function expectDemoFigures(demo: DemoJson): void {
  expect(demo.guard.guarded).toMatchObject({
    jobs: 300,
    succeeded: 300,
    failed: 0,
    ledgerRows: 100,
    ordersCredited: 100,
    ordersCreditedMoreThanOnce: 0,
    duplicatesInStats: 200,
    duplicateEvents: 200,
  });
  expect(demo.guard.unguarded).toMatchObject({
    jobs: 300,
    succeeded: 300,
    ledgerRows: 300,
    ordersCredited: 100,
    ordersCreditedMoreThanOnce: 100,
    duplicatesInStats: 0,
    duplicateEvents: 0,
  });

  expect(demo.email.killedWorker.signal).toBe("SIGKILL");
  expect(demo.email.crashedJob).toMatchObject({ state: "succeeded", attempts: 2 });
  expect(demo.email.crashedJob.errors).toEqual([expect.objectContaining({ attempt: 1, class: "LeaseExpired" })]);
  expect(demo.email.provider).toEqual({ requests: 4, replays: 1, delivered: 3 });
  expect(demo.email.inbox.map((i) => i.emails)).toEqual([1, 1, 1]);

  expect(demo.retries.acme).toMatchObject({
    state: "succeeded",
    attempts: 3,
    errors: ["SupplierTimeoutError", "SupplierTimeoutError"],
  });
  const waited = demo.retries.acme.timeline.map((a) => a.waitedMs);
  expect(waited[0]).toBeUndefined();
  // The fixed backoff, 200ms then 500ms (retry and event times are whole milliseconds).
  expect(waited[1]).toBeGreaterThanOrEqual(198);
  expect(waited[2]).toBeGreaterThanOrEqual(498);
  expect(demo.retries.globex).toEqual({
    jobId: expect.any(String),
    state: "failed",
    attempts: 1,
    errors: ["PermanentError"],
    timeline: expect.any(Array),
  });

  const { deduplicated, rejectedAfterSuccess, newJobAfterFailure, keyReuse } = demo.policies;
  expect(deduplicated.deduplicated).toBe(true);
  expect(deduplicated.secondJobId).toBe(deduplicated.firstJobId);
  expect(rejectedAfterSuccess).toMatchObject({ code: "IQ409", existingState: "succeeded", policy: "reject_if_succeeded" });
  expect(rejectedAfterSuccess!.existingJobId).toMatch(/^\d+$/);
  expect(newJobAfterFailure.state).toBe("succeeded");
  expect(newJobAfterFailure.newJobId).not.toBe(newJobAfterFailure.failedJobId);
  expect(keyReuse).toEqual({ code: "IQ422", key: "report:2026-11", existingJobId: deduplicated.firstJobId });

  expect(demo.figures).toHaveLength(FIGURES);
  expect(demo.figures.filter((f) => !f.ok)).toEqual([]);
  expect(demo.ok).toBe(true);
}

describe("idemq demo", () => {
  it(
    "--json against the test server (--database-url): one JSON object whose figures are all as promised; exit 0; its own database dropped",
    async () => {
      const server = serverUrl();
      const { code, stdout, stderr } = await runCli(["demo", "--json", "--database-url", server], { timeoutMs: DEMO_TIMEOUT_MS });
      expect(code, stderr).toBe(0);
      const demo = parseDemoJson(stdout);
      expectDemoFigures(demo);
      expect(demo.database).toMatchObject({ kept: false, embedded: false });
      expect(demo.database.name).toMatch(/^idemq_demo_[0-9a-z]+_\d+$/);
      // Progress went to stderr, not into the JSON.
      expect(stderr).toMatch(/600 credit jobs done/);

      const admin = new pg.Client({ connectionString: server });
      await admin.connect();
      try {
        const { rowCount } = await admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [demo.database.name]);
        expect(rowCount).toBe(0);
      } finally {
        await admin.end();
      }
    },
    DEMO_TIMEOUT_MS,
  );

  it(
    "exits 1 and names the figures that are off when a guarantee does not hold (a guard row planted before the credits run)",
    async () => {
      const server = serverUrl();
      const child = spawn(process.execPath, [CLI, "demo", "--json", "--database-url", server], {
        env: { ...process.env, NO_COLOR: "1" },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
      child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
      const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));

      // The demo migrates its database, then spends a second or more starting
      // its workers before it enqueues the credits: plant the guard row of
      // order 1 as soon as the database shows in the demo's progress.
      await waitUntil(() => /created database (idemq_demo_\S+)/.test(stderr), `the demo creates its database (${stderr})`, 60_000);
      const name = /created database (idemq_demo_\S+)/.exec(stderr)![1]!;
      const sabotage = new pg.Client({ connectionString: databaseUrl(server, name) });
      await sabotage.connect();
      try {
        await sabotage.query("SELECT idemq.guard('credit:order-1', 'credit')");
      } finally {
        await sabotage.end();
      }
      expect(/running 600 credit jobs/.test(stderr), "the guard row was planted before the credits were enqueued").toBe(false);

      expect(await exited, stderr).toBe(1);
      const demo = parseDemoJson(stdout);
      expect(demo.ok).toBe(false);
      // Order 1's three deliveries are all duplicates now: 99 rows, 201 duplicates.
      expect(demo.figures.filter((f) => !f.ok).map((f) => [f.name, f.expected, f.observed])).toEqual([
        ["guarded: ledger rows", 100, 99],
        ["guarded: duplicates in stats() (guard_duplicate)", 200, 201],
        ["guarded: job:duplicate worker events", 200, 201],
      ]);
    },
    DEMO_TIMEOUT_MS,
  );

  it("a role without CREATEDB: one line saying the demo needs its own database and how to get one, exit 1, nothing created", async () => {
    const server = serverUrl();
    const role = `idemq_demo_nocreatedb_${process.pid}`;
    const admin = new pg.Client({ connectionString: server });
    await admin.connect();
    try {
      await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD 'x' NOCREATEDB`);
      const url = new URL(server);
      url.username = role;
      url.password = "x";
      const { code, stdout, stderr } = await runCli(["demo", "--database-url", url.toString()]);
      expect(code).toBe(1);
      expect(stdout).toBe("");
      expect(stderr.trim().split("\n").filter((line) => line.startsWith("idemq: "))).toEqual([
        expect.stringMatching(/^idemq: the demo runs in a database of its own and cannot create one here .*grant the role CREATEDB, or leave --database-url and DATABASE_URL unset/),
      ]);
      expect(stderr).not.toMatch(/\n\s+at /); // no stack trace
      const owned = await admin.query(
        "SELECT d.datname FROM pg_database d JOIN pg_roles r ON r.oid = d.datdba WHERE r.rolname = $1",
        [role],
      );
      expect(owned.rows).toEqual([]);
    } finally {
      await admin.query(`DROP ROLE IF EXISTS ${role}`);
      await admin.end();
    }
  });

  it(
    "on the embedded server from a clean state (no data directory): initdb, every figure as promised, then the server stopped and the lock released",
    async () => {
      const dataDir = await tempDataDir();
      expect(existsSync(dataDir)).toBe(false);
      const { code, stdout, stderr } = await runCli(["demo", "--json"], {
        env: { IDEMQ_DATA_DIR: dataDir },
        timeoutMs: DEMO_TIMEOUT_MS,
      });
      expect(code, stderr).toBe(0);
      expect(stderr).toMatch(/starting embedded PostgreSQL 18 in .* \(first run: initdb\)/);
      const demo = parseDemoJson(stdout);
      expectDemoFigures(demo);
      expect(demo.database.embedded).toBe(true);

      expect(existsSync(join(dataDir, "PG_VERSION"))).toBe(true);
      expect(existsSync(join(dataDir, "postmaster.pid")), "server stopped").toBe(false);
      expect(existsSync(`${dataDir}.lock`), "lock released").toBe(false);
    },
    DEMO_TIMEOUT_MS,
  );

  it(
    "SIGKILLed mid-run on the embedded server: its workers exit, its server is left running; the next demo stops that server, drops the leftover database and passes",
    async () => {
      const dataDir = await tempDataDir();
      const env: NodeJS.ProcessEnv = { ...process.env, IDEMQ_DATA_DIR: dataDir, NO_COLOR: "1" };
      delete env.DATABASE_URL;
      const child = spawn(process.execPath, [CLI, "demo"], { env, stdio: ["ignore", "ignore", "pipe"] });
      let stderr = "";
      child.stderr.setEncoding("utf8");
      child.stderr.on("data", (chunk: string) => (stderr += chunk));
      const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on("exit", (_code, signal) => resolve(signal)));

      // Killed while its workers run the credit jobs.
      await waitUntil(() => /running 600 credit jobs/.test(stderr), `the demo runs its credit jobs (stderr: ${stderr})`, 120_000);
      child.kill("SIGKILL");
      expect(await exited).toBe("SIGKILL");

      const workerPids = [...stderr.matchAll(/(?:worker|mailer)-\d+ pid (\d+)/g)].map((m) => Number(m[1]));
      expect(workerPids).toHaveLength(4);
      await waitUntil(() => workerPids.every((pid) => !alive(pid)), "the killed demo's workers exit");
      const orphan = postmasterPid(dataDir);
      expect(orphan, "a server left running").toBeDefined();
      expect(alive(orphan!)).toBe(true);
      const leftover = /created database (idemq_demo_\S+)/.exec(stderr)?.[1];
      expect(leftover).toBeDefined();

      const next = await runCli(["demo"], { env: { IDEMQ_DATA_DIR: dataDir }, timeoutMs: DEMO_TIMEOUT_MS });
      expect(next.code, next.stderr).toBe(0);
      expect(next.stdout).toMatch(new RegExp(`All ${FIGURES} figures as expected`));
      expect(next.stdout).not.toMatch(/MISMATCH/);
      expect(next.stderr).toContain(`dropped ${leftover}`);
      expect(alive(orphan!), "the leftover server was stopped").toBe(false);
      expect(existsSync(join(dataDir, "postmaster.pid"))).toBe(false);
      expect(existsSync(`${dataDir}.lock`)).toBe(false);
    },
    DEMO_TIMEOUT_MS,
  );
});

describe("demo output helpers", () => {
  const stream = (isTTY: boolean) => {
    const chunks: string[] = [];
    return { isTTY, chunks, write: (chunk: string) => chunks.push(chunk) > 0 } as unknown as NodeJS.WritableStream & {
      isTTY: boolean;
      chunks: string[];
    };
  };

  it("on a terminal the progress bar redraws one line in place and ends with a plain step line", () => {
    const out = stream(true);
    const bar = new Progress(out).bar("running 4 jobs", 4);
    bar.update(4);
    bar.finish("4 jobs done");
    const text = out.chunks.join("");
    expect(text).toMatch(/\r\x1b\[2K.*running 4 jobs \[-{24}\] 0\/4/);
    expect(text).toMatch(/\r\x1b\[2K.*running 4 jobs \[#{24}\] 4\/4/);
    expect(text.endsWith(" 4 jobs done\n")).toBe(true);
    expect(text.split("\n")).toHaveLength(2); // one finished line; the bar never added lines
  });

  it("elsewhere (a pipe) the bar prints a line when it starts and one when it ends, nothing in between", () => {
    const out = stream(false);
    const bar = new Progress(out).bar("running 4 jobs", 4);
    for (let n = 1; n <= 4; n++) bar.update(n);
    bar.finish("4 jobs done");
    const lines = out.chunks.join("").trimEnd().split("\n");
    expect(lines.map((l) => l.replace(/^\[\s*[\d.]+s\] /, ""))).toEqual(["running 4 jobs (4)...", "4 jobs done"]);
    expect(out.chunks.join("")).not.toMatch(/\r|\x1b/);
  });

  it("the summary table marks each figure and names a mismatch", () => {
    const lines = summaryTable(
      [
        { scenario: "guard", name: "ledger rows", expected: 100, observed: 100, ok: true },
        { scenario: "guard", name: "duplicates", expected: 200, observed: 201, ok: false },
      ],
      false,
    );
    expect(lines[0]).toMatch(/^part\s+figure\s+expected\s+observed$/);
    expect(lines[2]).toMatch(/^guard\s+ledger rows\s+100\s+100\s+✓$/);
    expect(lines[3]).toMatch(/^guard\s+duplicates\s+200\s+201\s+✗ MISMATCH$/);
  });
});
