// `idemq schedules list|add|remove|next`, run as real subprocesses: --json is
// exactly what the Client returns, human output is one line per thing with
// anyone's text escaped, a value SQL refuses (a bad cron) is one line with
// the hint and exit 2 with nothing saved, and a name with no schedule is exit 5.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { Client } from "../../src/index.ts";
import { type CliResult, runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { scheduleRow } from "../helpers/schedules.ts";

const db = useTestDatabase();
let client: Client;
beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterAll(async () => {
  await client.close();
});

function schedules(args: string[], input?: string): Promise<CliResult> {
  return runCli(["schedules", ...args, "--database-url", db.url], input === undefined ? {} : { input });
}

/** What a command's stderr holds on failure: lines starting "idemq: ", no stack trace. */
function errorLine(result: CliResult): string {
  expect(result.stdout).toBe("");
  expect(result.stderr).not.toMatch(/^\s+at /m);
  const lines = result.stderr.trimEnd().split("\n");
  expect(lines).toHaveLength(1);
  expect(lines[0]).toMatch(/^idemq: /);
  return lines[0]!;
}

/** The Client's rows as JSON would carry them (dates as ISO strings). */
async function asJson(name: string): Promise<unknown> {
  return JSON.parse(JSON.stringify((await client.schedules()).find((s) => s.name === name)));
}

describe("idemq schedules add", () => {
  it("--json adds a schedule with every option, then replaces it; the row is what the Client reads", async () => {
    const name = unique("nightly");
    const added = await schedules([
      "add",
      name,
      "--cron",
      "0 3 * * *",
      "--task",
      "report",
      "--payload",
      '{"kind": "daily"}',
      "--queue",
      "reports",
      "--timezone",
      "Europe/Berlin",
      "--overlap",
      "queue_one",
      "--misfire",
      "all",
      "--misfire-grace",
      "2m",
      "--priority",
      "5",
      "--max-attempts",
      "3",
      "--json",
    ]);
    expect(added, added.stderr).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(added.stdout)).toEqual({ outcome: "added", schedule: await asJson(name) });
    expect(await scheduleRow(db.pool, name)).toMatchObject({
      cron: "0 3 * * *",
      task: "report",
      payload: { kind: "daily" },
      queue: "reports",
      timezone: "Europe/Berlin",
      overlap: "queue_one",
      misfire: "all",
      misfire_grace: "00:02:00",
      priority: 5,
      max_attempts: 3,
    });

    const replaced = await schedules(["add", name, "--cron", "@hourly", "--task", "report", "--json"]);
    expect(replaced).toMatchObject({ code: EXIT.OK, stderr: "" });
    const { schedule } = JSON.parse(replaced.stdout) as { schedule: Record<string, unknown> };
    expect(JSON.parse(replaced.stdout)).toEqual({ outcome: "replaced", schedule: await asJson(name) });
    // Options left out took the SQL defaults: add replaces the whole definition.
    expect(schedule).toMatchObject({ cron: "@hourly", timezone: "UTC", overlap: "skip", misfire: "once", queue: "default" });

    const again = await schedules(["add", name, "--cron", "@hourly", "--task", "report"]);
    expect(again).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(again.stdout).toMatch(new RegExp(`^unchanged schedule ${name} \\(task report, queue default\\): cron "@hourly"`));
    expect(await asJson(name)).toEqual(schedule);
  });

  it("says what it added in one line, the payload read from stdin", async () => {
    const name = unique("heartbeat");
    const result = await schedules(["add", name, "--cron", "@every 30s", "--task", "ping", "--payload", "-"], '{"n": 1}');
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(result.stdout).toMatch(
      new RegExp(`^added schedule ${name} \\(task ping, queue default\\): cron "@every 30s" in UTC, overlap skip, misfire once, next \\S+Z \\(in \\d+s\\)\\n$`),
    );
    expect((await scheduleRow(db.pool, name))?.payload).toEqual({ n: 1 });
  });

  it("a bad cron is one line naming the field with the hint, exit 2, nothing saved", async () => {
    const name = unique("bad");
    const result = await schedules(["add", name, "--cron", "0 25 * * *", "--task", "report"]);
    expect(result.code).toBe(EXIT.USAGE);
    expect(errorLine(result)).toMatch(/^idemq: cron field 2 \(hour\) "25" is out of range 0-23 \(SQLSTATE 22023\); field 2 \(hour\) takes 0-23/);
    expect(await scheduleRow(db.pool, name)).toBeUndefined();
  });

  it("refuses bad input before any database call: an unknown policy, bad JSON, a missing --cron", async () => {
    const name = unique("bad");
    const policy = await schedules(["add", name, "--cron", "@daily", "--task", "t", "--overlap", "sometimes"]);
    expect(policy.code).toBe(EXIT.USAGE);
    expect(errorLine(policy)).toMatch(/--overlap.*sometimes.*skip, allow, queue_one/);
    const json = await schedules(["add", name, "--cron", "@daily", "--task", "t", "--payload", "{nope"]);
    expect(json.code).toBe(EXIT.USAGE);
    expect(errorLine(json)).toMatch(/the payload is not valid JSON/);
    const noCron = await schedules(["add", name, "--task", "t"]);
    expect(noCron.code).toBe(EXIT.USAGE);
    expect(errorLine(noCron)).toMatch(/--cron/);
    expect(await scheduleRow(db.pool, name)).toBeUndefined();
  });

  it("--help shows an example", async () => {
    const help = await runCli(["schedules", "add", "--help"]);
    expect(help.code).toBe(EXIT.OK);
    expect(help.stdout).toContain(`idemq schedules add nightly-report --cron "0 3 * * *"`);
    const group = await runCli(["schedules", "--help"]);
    expect(group.code).toBe(EXIT.OK);
    expect(group.stdout).toMatch(/^Commands:\n {2}list /m);
    expect(group.stdout).toMatch(/\nExamples:\n {2}idemq schedules /);
  });
});

describe("idemq schedules list", () => {
  it("--json is every schedule as the Client returns it; the table escapes anyone's text", async () => {
    const name = unique("list");
    const task = "x\u001b[2J\u202eevil";
    await client.schedule({ name, cron: "*/5 * * * *", task });
    const json = await schedules(["list", "--json"]);
    expect(json).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(json.stdout)).toEqual(JSON.parse(JSON.stringify(await client.schedules())));

    const human = await schedules([]);
    expect(human).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = human.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^NAME +CRON +TIMEZONE +TASK +QUEUE +NEXT +LAST JOB +SKIPPED$/);
    const line = lines.find((l) => l.startsWith(name))!;
    expect(line).toContain("x\\x1b[2J\\u202eevil");
    expect(line).toMatch(/\*\/5 \* \* \* \* +UTC/);
    expect(human.stdout).not.toMatch(/[\u001b\u202e]/);
  });
});

describe("idemq schedules list: a schedule tick() could not enqueue", () => {
  it("--json carries lastError and lastErrorAt (null once a tick enqueued it); the table is followed by a line saying why", async () => {
    const name = unique("refused");
    await client.schedule({ name, cron: "* * * * *", task: "report", payload: { blob: "x".repeat(200) } });
    const beforeTick = (await client.schedules()).find((s) => s.name === name)!;
    expect(beforeTick).toMatchObject({ lastError: null, lastErrorAt: null });
    // Its slot due now (on time, within misfire_grace).
    await db.pool.query("UPDATE idemq.schedules SET next_at = date_trunc('minute', now()) WHERE name = $1", [name]);
    await db.pool.query("UPDATE idemq.settings SET value = 100 WHERE name = 'payload_bytes'");
    try {
      await db.pool.query("SELECT idemq.tick()");
    } finally {
      await db.pool.query("UPDATE idemq.settings SET value = 1048576 WHERE name = 'payload_bytes'");
    }
    const row = (await client.schedules()).find((s) => s.name === name)!;
    expect(row.lastError).toMatch(/^payload is \d+ bytes of JSON text, over the limit of 100 bytes \(payload_bytes\).* \(SQLSTATE 22023\)$/);
    expect(row.lastErrorAt).toBeInstanceOf(Date);

    const json = await schedules(["list", "--json"]);
    expect(JSON.parse(json.stdout).find((s: { name: string }) => s.name === name)).toEqual(await asJson(name));
    const human = await schedules([]);
    expect(human).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(human.stdout).toMatch(new RegExp(`^! ${name}: tick\\(\\) could not enqueue its job at \\S+Z \\(.+\\): payload is \\d+ bytes`, "m"));

    await db.pool.query("SELECT idemq.tick()");
    expect((await client.schedules()).find((s) => s.name === name)).toMatchObject({ lastError: null, lastErrorAt: null });
    expect((await schedules([])).stdout).not.toContain(`! ${name}:`);
  });
});

describe("idemq schedules remove", () => {
  it("removes a schedule (--json), and a name with no schedule is exit 5", async () => {
    const name = unique("gone");
    await client.schedule({ name, cron: "@daily", task: "report" });
    const removed = await schedules(["remove", name, "--json"]);
    expect(removed).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(removed.stdout)).toEqual({ name, removed: true });
    expect(await scheduleRow(db.pool, name)).toBeUndefined();

    const again = await schedules(["remove", name, "--json"]);
    expect(again.code).toBe(EXIT.NOT_FOUND);
    expect(JSON.parse(again.stdout)).toEqual({
      error: { code: "not_found", message: `no schedule named "${name}"; nothing removed (\`idemq schedules list\` shows them)`, hint: null },
    });
    expect(again.stderr).toBe(`idemq: no schedule named "${name}"; nothing removed (\`idemq schedules list\` shows them)\n`);

    const human = await schedules(["remove", unique("never")]);
    expect(human.code).toBe(EXIT.NOT_FOUND);
    expect(errorLine(human)).toMatch(/^idemq: no schedule named/);
  });
});

describe("idemq schedules next", () => {
  it("NAME --count 3 --json: the schedule's next slots, first its nextAt", async () => {
    const name = unique("every");
    await client.schedule({ name, cron: "@every 10s", task: "report" });
    const result = await schedules(["next", name, "--count", "3", "--json"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const { nextAt } = (await client.schedules()).find((s) => s.name === name)!;
    expect(JSON.parse(result.stdout)).toEqual({
      name,
      cron: "@every 10s",
      timezone: "UTC",
      slots: [0, 10_000, 20_000].map((ms) => new Date(nextAt.getTime() + ms).toISOString()),
    });
  });

  it("--cron checks an expression without saving it, with local times in its time zone", async () => {
    const args = ["next", "--cron", "30 2 * * *", "--timezone", "Europe/Berlin", "--after", "2026-03-28T12:00:00Z", "--count", "2"];
    const json = await schedules([...args, "--json"]);
    expect(json).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(json.stdout)).toEqual({
      cron: "30 2 * * *",
      timezone: "Europe/Berlin",
      slots: ["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"],
    });
    const human = await schedules(args);
    expect(human).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(human.stdout.trimEnd().split("\n")).toEqual([
      expect.stringMatching(/^2026-03-29T01:00:00Z {2}2026-03-29 03:00:00 Europe\/Berlin {2}\d+d( \d+h)? ago$/),
      expect.stringMatching(/^2026-03-30T00:30:00Z {2}2026-03-30 02:30:00 Europe\/Berlin {2}\d+d( \d+h)? ago$/),
    ]);
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.schedules WHERE cron = '30 2 * * *'");
    expect(rows[0].n).toBe(0);
  });

  it("a bad expression is exit 2 with the field; a missing name exit 5; a name and --cron together exit 2", async () => {
    const bad = await schedules(["next", "--cron", "* * * * * * *"]);
    expect(bad.code).toBe(EXIT.USAGE);
    expect(errorLine(bad)).toMatch(/^idemq: .*7 fields.*\(SQLSTATE 22023\)/);
    const missing = await schedules(["next", unique("none")]);
    expect(missing.code).toBe(EXIT.NOT_FOUND);
    expect(errorLine(missing)).toMatch(/^idemq: no schedule named/);
    const both = await schedules(["next", "x", "--cron", "@daily"]);
    expect(both.code).toBe(EXIT.USAGE);
    expect(errorLine(both)).toMatch(/give a schedule's name or --cron EXPR/);
    const count = await schedules(["next", "--cron", "@daily", "--count", "0"]);
    expect(count.code).toBe(EXIT.USAGE);
    expect(errorLine(count)).toMatch(/--count must be an integer from 1 to 1000/);
  });
});
