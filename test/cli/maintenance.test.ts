// `idemq rescue`, `idemq purge` and `idemq prune-keys`, run as real
// subprocesses: each prints what it did (and --json the counts), and bad
// input is one line, exit 2, with nothing changed. The file owns its
// database: purge and prune-keys act on every job in it.
import { describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { type CliResult, runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { count, keyRow, stateOf, unique } from "../helpers/jobs.ts";
import { jobIn } from "../helpers/work.ts";

const db = useTestDatabase();

function cli(args: string[]): Promise<CliResult> {
  return runCli([...args, "--database-url", db.url]);
}

function oneErrorLine(result: CliResult): string {
  const lines = result.stderr.trimEnd().split("\n");
  expect(lines, result.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^idemq: /);
  return lines[0]!;
}

/** Sets finished_at of a finished job (and of its key) to `days` days ago. */
async function finishedDaysAgo(id: string, days: number): Promise<void> {
  await db.pool.query("UPDATE idemq.jobs SET finished_at = now() - make_interval(days => $2) WHERE id = $1", [id, days]);
  await db.pool.query("UPDATE idemq.keys SET finished_at = now() - make_interval(days => $2) WHERE job_id = $1", [id, days]);
}

describe("idemq rescue", () => {
  it("--json: jobs whose lease expired go back to enqueued; a second run rescues nothing", async () => {
    const lost = await jobIn(db.pool, "processing");
    const held = await jobIn(db.pool, "processing");
    await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [lost]);

    const first = await cli(["rescue", "--json"]);
    expect(first).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(first.stdout)).toEqual({ rescued: 1 });
    expect(await stateOf(db.pool, lost)).toBe("enqueued");
    expect(await stateOf(db.pool, held)).toBe("processing");

    const second = await cli(["rescue"]);
    expect(second).toMatchObject({
      code: EXIT.OK,
      stdout: "Nothing to rescue: no expired lease, no job past its deadline.\n",
      stderr: "",
    });
  });

  it("says how many jobs it rescued", async () => {
    const late = await jobIn(db.pool, "enqueued");
    await db.pool.query("UPDATE idemq.jobs SET expires_at = now() - interval '1 second' WHERE id = $1", [late]);
    const result = await cli(["rescue"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(result.stdout).toMatch(/^Rescued 1 job\(s\): /);
    expect(await stateOf(db.pool, late)).toBe("expired");
  });
});

describe("idemq purge", () => {
  it("--json deletes finished jobs older than --older-than (8 days: gone, 6 days: kept) and keeps their keys", async () => {
    const key = unique("key");
    const old = await jobIn(db.pool, "succeeded", { idempotency_key: key });
    const recent = await jobIn(db.pool, "failed");
    const active = await jobIn(db.pool, "enqueued");
    await finishedDaysAgo(old, 8);
    await finishedDaysAgo(recent, 6);

    const result = await cli(["purge", "--older-than", "7d", "--json"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(result.stdout)).toEqual({
      purged: 1,
      olderThan: "7 days",
      states: ["succeeded", "failed", "expired", "cancelled"],
      batches: 1,
      interrupted: false,
    });
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE id = ANY ($1::bigint[])", [[old]])).toBe(0);
    expect(await stateOf(db.pool, recent)).toBe("failed");
    expect(await stateOf(db.pool, active)).toBe("enqueued");
    expect(await keyRow(db.pool, key)).toMatchObject({ job_id: old, finished_state: "succeeded" });
  });

  it("--state limits it to those finished states and the answer says so", async () => {
    const failed = await jobIn(db.pool, "failed");
    const cancelled = await jobIn(db.pool, "cancelled");
    await finishedDaysAgo(failed, 30);
    await finishedDaysAgo(cancelled, 30);
    const result = await cli(["purge", "--older-than", "1 week", "--state", "failed"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(result.stdout).toBe(
      "Purged 1 job(s) (failed) finished more than 1 week ago; their keys stay until `idemq prune-keys`.\n",
    );
    expect(await stateOf(db.pool, cancelled)).toBe("cancelled");
  });

  it("bad input: an active state, no --older-than, a bad duration; exit 2, nothing deleted", async () => {
    const old = await jobIn(db.pool, "succeeded");
    await finishedDaysAgo(old, 30);
    const cases: [string[], string][] = [
      [["purge", "--older-than", "7d", "--state", "succeeded,processing"], "purge deletes finished jobs only, not processing"],
      [["purge"], "required option '--older-than <duration>' not specified"],
      [["purge", "--older-than", "a fortnight"], 'cannot read "a fortnight"'],
      [["purge", "--older-than", "7"], "7 has no unit: write 7s, 7m, 7h or 7d"],
    ];
    for (const [args, says] of cases) {
      const result = await cli(args);
      expect(result.code, args.join(" ")).toBe(EXIT.USAGE);
      expect(result.stdout).toBe("");
      expect(oneErrorLine(result)).toContain(says);
    }
    expect(await stateOf(db.pool, old)).toBe("succeeded");
  });
});

describe("idemq prune-keys", () => {
  it("without --older-than, prune_keys' default (14 days, read from SQL) applies: 15 days released, 13 kept", async () => {
    const oldKey = unique("key");
    const newKey = unique("key");
    const activeKey = unique("key");
    await finishedDaysAgo(await jobIn(db.pool, "succeeded", { idempotency_key: oldKey }), 15);
    await finishedDaysAgo(await jobIn(db.pool, "succeeded", { idempotency_key: newKey }), 13);
    await jobIn(db.pool, "enqueued", { idempotency_key: activeKey });

    const result = await cli(["prune-keys"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(result.stdout).toBe(
      "Released 1 idempotency key(s) whose job finished more than 14 days ago and past the key's own retention (and guard and effect records older than that).\n",
    );
    expect(await keyRow(db.pool, oldKey)).toBeUndefined();
    expect(await keyRow(db.pool, newKey)).toBeDefined();
    expect(await keyRow(db.pool, activeKey)).toBeDefined();
  });

  // ⚑ --older-than is a floor over each key's own retention: these keys keep theirs 1 day.
  it("--older-than --json: releases keys finished longer ago than that and than their own retention", async () => {
    const key = unique("key");
    const recentKey = unique("key");
    const ownRetention = unique("key");
    await finishedDaysAgo(await jobIn(db.pool, "failed", { idempotency_key: key, key_retention: "1 day" }), 3);
    await finishedDaysAgo(await jobIn(db.pool, "failed", { idempotency_key: recentKey, key_retention: "1 day" }), 1);
    await finishedDaysAgo(await jobIn(db.pool, "failed", { idempotency_key: ownRetention }), 3);
    // Earlier tests of this file left keys too: every key finished over 2 days and its retention ago goes.
    const dueKeys = "SELECT 1 FROM idemq.keys WHERE finished_at < now() - interval '2 days' AND finished_at < now() - retention";
    const due = await count(db.pool, dueKeys);
    expect(due).toBeGreaterThanOrEqual(1);
    const result = await cli(["prune-keys", "--older-than", "2d", "--json"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(result.stdout)).toEqual({ prunedKeys: due, olderThan: "2 days" });
    expect(await keyRow(db.pool, key)).toBeUndefined();
    expect(await keyRow(db.pool, recentKey)).toBeDefined();
    expect(await keyRow(db.pool, ownRetention)).toBeDefined();
    expect(await count(db.pool, dueKeys)).toBe(0);
  });

  it("a bad duration: one line, exit 2, no key released", async () => {
    const key = unique("key");
    await finishedDaysAgo(await jobIn(db.pool, "failed", { idempotency_key: key }), 400);
    const result = await cli(["prune-keys", "--older-than", "5 parsecs"]);
    expect(result).toMatchObject({ code: EXIT.USAGE, stdout: "" });
    expect(oneErrorLine(result)).toContain('unknown unit "parsecs"');
    expect(await keyRow(db.pool, key)).toBeDefined();
  });
});
