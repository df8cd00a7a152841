// `idemq purge` in batches, as a real subprocess: each batch is its own
// transaction, progress shows on a terminal's stderr (never with --json), and
// SIGINT stops it at the end of the batch in flight: what it deleted stays
// deleted, the rest stay in place, it reports the count and exits 130.
// The interruption is made deterministic with a lock: the test holds a SHARE
// lock on idemq.job_dependencies, which the next batch's DELETE needs, so
// the CLI is provably mid-batch (pg_blocking_pids) when the signal comes.
// purge takes every old enough job in the database, so each test has a
// database of its own: what one that failed left cannot change another's counts.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { EXIT, SIGNAL_EXIT } from "../../src/cli/exit-codes.ts";
import { CLI, runCli } from "../helpers/cli.ts";
import { killAll, startNode, type CliProcess } from "../helpers/cli-spawn.ts";
import { backendPid, useTestDatabases, waitUntilBlocked, type TestDatabase } from "../helpers/db.ts";
import { count } from "../helpers/jobs.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const TTY = resolve(import.meta.dirname, "..", "fixtures", "cli", "stderr-tty.mjs");
const BATCH = 100;

const ownDatabase = useTestDatabases();
afterAll(async () => {
  killAll();
});

/** A database of the test's own holding n cancelled jobs in `queue`, finished 31 days ago. */
async function seeded(queue: string, n: number): Promise<TestDatabase> {
  const db = await ownDatabase({ poolSize: 4 });
  await db.pool.query(
    `INSERT INTO idemq.jobs (task, queue, payload, state, priority, run_at, max_attempts, finished_at)
     SELECT 'seeded', $1, '{}', 'cancelled', 0, now(), 1, now() - interval '31 days' FROM generate_series(1, $2)`,
    [queue, n],
  );
  return db;
}

async function left(db: TestDatabase, queue: string): Promise<number> {
  return count(db.pool, "SELECT 1 FROM idemq.jobs WHERE queue = $1", [queue]);
}

/** True once no SIGINT is pending for `pid`: the kernel has delivered it to the process's handler. */
function signalDelivered(pid: number): boolean {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const pending = [/^SigPnd:\s*([0-9a-f]+)/m, /^ShdPnd:\s*([0-9a-f]+)/m].map((re) => BigInt(`0x${status.match(re)![1]}`));
  return pending.every((mask) => (mask & (1n << 1n)) === 0n); // SIGINT is signal 2: bit 1
}

/**
 * Starts `idemq purge` on a terminal-like stderr, waits for its first batch
 * to commit, blocks its next batch with a lock, sends SIGINT, waits for `ready`
 * (the signal handled), then lets the blocked batch finish.
 */
async function interrupt(
  db: TestDatabase,
  queue: string,
  total: number,
  args: string[],
  ready: (cli: CliProcess) => boolean,
): Promise<Awaited<CliProcess["exited"]>> {
  const cli = startNode(["--import", TTY, CLI, "purge", ...args, "--database-url", db.url]);
  await waitFor(async () => (await left(db, queue)) < total, { what: "a first batch", timeoutMs: 20_000, intervalMs: 5 });
  const holder = await db.pool.connect();
  try {
    await holder.query("BEGIN");
    await holder.query("LOCK TABLE idemq.job_dependencies IN SHARE MODE");
    const { rows } = await holder.query<{ pid: number }>(
      "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%idemq.purge%' AND pid <> pg_backend_pid()",
    );
    expect(rows, "the CLI's session").toHaveLength(1);
    expect(await waitUntilBlocked(db.pool, rows[0]!.pid)).toContain(await backendPid(holder));
    cli.child.kill("SIGINT");
    await waitFor(() => ready(cli), { what: "the CLI to take the signal", timeoutMs: 20_000, intervalMs: 5 });
  } finally {
    await holder.query("ROLLBACK");
    holder.release();
  }
  return cli.exited;
}

describe("idemq purge in batches", () => {
  it("SIGINT mid-way: the batch in flight finishes, no other starts, the rest stay, it says how many went and exits 130", async () => {
    const queue = "purge-interrupted";
    const total = 30_000;
    const db = await seeded(queue, total);
    const result = await interrupt(db, queue, total, ["--older-than", "7d", "--batch-size", String(BATCH)], (cli) =>
      cli.stderr().includes("(stopping after this batch)"),
    );
    expect(result.code, result.stderr).toBe(SIGNAL_EXIT.SIGINT);
    const said = result.stdout.match(
      /^Interrupted \(SIGINT\): purged (\d+) job\(s\) \(succeeded, failed, expired, cancelled\) finished more than 7 days ago in (\d+) batch\(es\); the rest stay, run the command again to go on\. Their keys stay until `idemq prune-keys`\.\n$/,
    );
    expect(said, result.stdout).not.toBeNull();
    const [purged, batches] = [Number(said![1]), Number(said![2])];
    // Full batches only: the blocked one finished, and none started after the signal.
    expect(purged).toBe(batches * BATCH);
    expect(batches).toBeGreaterThanOrEqual(2);
    expect(await left(db, queue)).toBe(total - purged);
    expect(total - purged).toBeGreaterThan(0);
    // The progress line showed the count as it went, and ended with the time taken.
    expect(result.stderr).toMatch(new RegExp(`${purged} job\\(s\\) removed in ${batches} batch\\(es\\) \\(stopping after this batch\\) in \\d+\\.\\d s\\n$`));

    // Run again: it goes on and removes the rest.
    const again = await runCli(["purge", "--older-than", "7d", "--json", "--database-url", db.url]);
    expect(again.code, again.stderr).toBe(EXIT.OK);
    expect(JSON.parse(again.stdout)).toEqual({
      purged: total - purged,
      olderThan: "7 days",
      states: ["succeeded", "failed", "expired", "cancelled"],
      batches: Math.ceil((total - purged + 1) / 1000),
      interrupted: false,
    });
    expect(await left(db, queue)).toBe(0);
  });

  it("--json, interrupted: one exact JSON line with interrupted true, nothing on stderr, exit 130", async () => {
    const queue = "purge-interrupted-json";
    const total = 30_000;
    const db = await seeded(queue, total);
    const result = await interrupt(db, queue, total, ["--older-than", "7d", "--batch-size", String(BATCH), "--json"], (cli) =>
      signalDelivered(cli.pid),
    );
    expect(result.code, result.stderr).toBe(SIGNAL_EXIT.SIGINT);
    expect(result.stderr).toBe("");
    const lines = result.stdout.split("\n");
    expect(lines).toHaveLength(2);
    const answer = JSON.parse(lines[0]!);
    expect(Object.keys(answer)).toEqual(["purged", "olderThan", "states", "batches", "interrupted"]);
    expect(answer).toMatchObject({ olderThan: "7 days", interrupted: true });
    expect(answer.purged).toBe(answer.batches * BATCH);
    expect(await left(db, queue)).toBe(total - answer.purged);
    expect(total - answer.purged).toBeGreaterThan(0);
  });

  it("without a terminal it draws no progress; a short last batch ends it (exit 0)", async () => {
    const queue = "purge-quiet";
    const db = await seeded(queue, 250);
    const result = await runCli(["purge", "--older-than", "7d", "--batch-size", "100", "--database-url", db.url]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(result.stdout).toBe(
      "Purged 250 job(s) (succeeded, failed, expired, cancelled) finished more than 7 days ago; their keys stay until `idemq prune-keys`.\n",
    );
    expect(await left(db, queue)).toBe(0);
  });

  it("--batch-size outside 1..10000: exit 2, one line, nothing deleted", async () => {
    const queue = "purge-bad-batch";
    const db = await seeded(queue, 3);
    for (const size of ["0", "10001", "ten"]) {
      const result = await runCli(["purge", "--older-than", "7d", "--batch-size", size, "--database-url", db.url]);
      expect(result.code, size).toBe(EXIT.USAGE);
      expect(result.stdout).toBe("");
      expect(result.stderr).toMatch(/^idemq: .*--batch-size/);
    }
    expect(await left(db, queue)).toBe(3);
  });
});
